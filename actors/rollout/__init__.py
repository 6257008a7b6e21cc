"""The rollout actor: serves generation requests from the env actors with the newest weights it holds (Hugging Face or vLLM engine)."""
