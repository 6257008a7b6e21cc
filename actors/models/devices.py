"""Where a model lives and in what precision: ``device`` and ``dtype`` settings, resolved once.

``auto`` device: CUDA when a GPU is visible, else the CPU. ``auto`` dtype: bfloat16 on a GPU, float32 on the CPU
(the CPU's bf16 matmuls are slow and its log-probs drift from fp32 engines'). Log-probs that enter a ratio are
computed in fp32 whatever the model's dtype (``algos.losses.token_logprobs`` upcasts the logits).
"""

from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"auto": None, "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def check_device(name: str) -> str:
    """``name`` if it is a device setting tidal knows (``auto``, ``cpu``, ``cuda``, ``cuda:<i>``), else an error."""
    base, _, index = name.partition(":")
    if base not in DEVICES or (index and (base != "cuda" or not index.isdigit())):
        raise ValueError(f"unknown device {name!r}; choose auto, cpu, cuda or cuda:<index>")
    return name


def check_dtype(name: str) -> str:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return name


def resolve_device(name: str = "auto", local_rank: int | None = None) -> torch.device:
    """The torch device of a ``device`` setting; ``local_rank`` picks a GPU in a group of ranks on one node."""
    check_device(name)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"device={name} but no CUDA GPU is visible to this process "
                               "(set device=auto or cpu, or give the actor a GPU: ray.resources)")
        if name == "cuda" and local_rank is not None:
            name = f"cuda:{local_rank % torch.cuda.device_count()}"
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The torch dtype of a ``dtype`` setting on ``device`` (``auto``: bf16 on a GPU, fp32 on the CPU)."""
    dtype = DTYPES[check_dtype(name)]
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return dtype
