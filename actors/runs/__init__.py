"""A run from start to summary: its drivers (training, league), autoscaling, recovery, control, metrics, evaluations."""
