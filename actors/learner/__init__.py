"""The learner actor: trains on replay's batches off-policy under a staleness bound, publishes weights, checkpoints."""
