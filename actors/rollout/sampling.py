"""Batched sampling from a Hugging Face causal LM, recording the log-prob and policy version of every token: plain
torch, no event loop, so a GPU machine with torch alone can run it (``benchmarks/gpu_check.py``).

`sample`: prompts of different lengths are left-padded; positions count from each prompt's first real token, so a
sequence gets the same positions here as in the learner's right-padded forward pass. Each row stops at
EOS or after ``max_new_tokens``.

Generation is interruptible: between two decoding steps ``swap_weights()`` may load newer weights into
the model and return their version. The KV cache, computed with the old weights, is then dropped and the
prefix (prompt and tokens so far) is encoded again with the new ones (AReaL's interruptible rollout), so
every later token, and its log-prob, comes from the new policy; the per-token versions show the switch.

Every tensor is made on the model's device; what comes back is plain Python lists. Sampling probabilities and
log-probs are computed in float32 whatever the model's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from algos.losses import token_logprobs


@dataclass
class Sample:
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]  # the policy version that sampled each token
    finished: bool  # ended with EOS (False: cut at max_new_tokens)


def _encode(model, input_ids: torch.Tensor, attention: torch.Tensor):
    """Full forward pass over a left-padded prefix; returns (last logits, cache, positions of the last column)."""
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    return out.logits[:, -1], out.past_key_values, positions[:, -1:]


@torch.no_grad()
def sample(model, prompts: list[list[int]], *, eos_id: int, pad_id: int, temperature: float = 1.0,
           max_new_tokens: int = 16, generator: torch.Generator | None = None, version: int = 0,
           swap_weights: Callable[[], int | None] | None = None) -> list[Sample]:
    """Sample a continuation of every prompt; ``version`` is the version of the weights in ``model`` now.

    ``generator`` should be on the model's device (`device_generator`); one on another device seeds a generator
    on the model's device for this call (reproducible, without moving the probabilities off the device)."""
    if not prompts:
        return []
    if any(not p for p in prompts):
        raise ValueError("empty prompt: every prompt needs at least one token")
    device = next(model.parameters()).device
    if generator is not None and generator.device != device:
        generator = device_generator(device, int(torch.randint(2**62, (), generator=generator)))
    width = max(map(len, prompts))
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    starts = torch.tensor([width - len(p) for p in prompts], device=device)
    attention = (torch.arange(width, device=device) >= starts[:, None]).long()
    logits, cache, positions = _encode(model, input_ids, attention)
    n = len(prompts)
    tokens, logps, versions = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
    done = torch.zeros(n, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        if step and swap_weights is not None and (new_version := swap_weights()) is not None:
            version = new_version
            logits, cache, positions = _encode(model, input_ids, attention)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        next_ids = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        next_logps = token_logprobs(logits, next_ids, temperature)  # float32
        ids_now, logps_now = next_ids.tolist(), next_logps.tolist()  # one copy to the host per step
        for i in torch.nonzero(~done).squeeze(-1).tolist():
            tokens[i].append(ids_now[i])
            logps[i].append(logps_now[i])
            versions[i].append(version)
        done |= next_ids == eos_id
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        next_ids = torch.where(done, torch.full_like(next_ids, pad_id), next_ids)
        attention = torch.cat([attention, (~done).long()[:, None]], dim=1)
        input_ids = torch.cat([input_ids, next_ids[:, None]], dim=1)
        positions = positions + 1
        out = model(input_ids=next_ids[:, None], attention_mask=attention, position_ids=positions,
                    past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1]
    return [Sample(t, lp, v, bool(t and t[-1] == eos_id)) for t, lp, v in zip(tokens, logps, versions)]


def device_generator(device: torch.device | str, seed: int) -> torch.Generator:
    """A random generator on ``device`` (a torch.Generator draws on its own device only), seeded."""
    return torch.Generator(device=device).manual_seed(seed)
