"""Generation engines and models: Hugging Face and vLLM samplers, the tiny base model, snapshots, a scripted rollout."""
