"""tidal's actors and what runs them. At the top level, the six actors (`env`, `rollout`, `reward`, `replay`,
`learner`, `league`) with their own parts (`training` for the learner, `spill` for replay, `evaluation`
for env) and `host`, which runs actors on trio loops; `engines/` holds the generation engines and models;
`runs/` the run's driver, scaling, recovery, control and evaluations; `leagues/` the league's domain
(matchmaking, the table). `launcher.py` is the only module that knows Ray, and `cli.py` is the `tidal`
command."""
