"""Checks that tests run small and benchmarks run large: the fuzzer's bad frames at live actors (`stream_fuzz`),
well-typed poison through a live pipeline (`poison`), and the batch of trajectories they build on
(`trajectories`). Imported by tests and by the scripts in `benchmarks/`; it imports no test module and no script.
(The builders that tests alone share are in `tests/factories.py`.)"""
