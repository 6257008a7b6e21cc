"""The replay actor: holds scored episodes oldest first, durably (the spill), and cuts them into the learner's batches."""
