"""tidal's actors and what runs them, a package per actor: `env`, `rollout`, `reward`, `replay`, `learner` and
`league`, each with `actor.py` (the class and its config) and its parts beside it under names that say what they
are. `models/` is what a policy is on disk and on a device (base and random models, tokenizer, snapshots, the
checkpoint directory's contract, the length cut), shared by every actor. `runs/` configures, wires, hosts and
drives a run (config, topology, the Ray cluster, the driver, scaling, recovery); `observe/` watches it (metrics,
TensorBoard, W&B, export). `runs/ray_cluster.py` is the only module that knows Ray, and `cli.py` is the `tidal`
command. An actor package imports only `streams`, `envs`, `algos`, `actors.models` and itself
(tests/test_structure.py holds the rules and their declared exceptions)."""
