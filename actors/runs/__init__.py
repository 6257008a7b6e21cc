"""A run from start to summary: its one driver (a single policy or a league), scaling, recovery, control,
metrics, evaluations and the league's steward."""
