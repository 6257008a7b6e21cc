"""Model parameters as bytes and back: safetensors, never pickle."""

from __future__ import annotations

from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors


def weights_to_bytes(model) -> bytes:
    """Every parameter once (tied embeddings are one parameter), detached, on the CPU."""
    return save_tensors({name: p.detach().cpu().contiguous() for name, p in model.named_parameters()})


def load_weights(model, data: bytes) -> None:
    """Copy published parameters into ``model`` in place; every parameter must be present."""
    tensors = load_tensors(bytes(data))
    expected = {name for name, _ in model.named_parameters()}
    if set(tensors) != expected:
        missing, unknown = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unknown {unknown[:5]}")
    model.load_state_dict(tensors, strict=False)
