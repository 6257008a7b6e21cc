"""Watching a run: the metrics log, TensorBoard and W&B figures, and export of a run's data."""
