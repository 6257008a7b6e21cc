"""What a policy is on disk and on a device: base and random models, tokenizer, transcripts, devices, weight snapshots, the checkpoint directory's contract and the length cut."""
