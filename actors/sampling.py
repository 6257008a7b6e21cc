"""Batched sampling from a Hugging Face causal LM, recording the log-prob of every sampled token.

Prompts of different lengths are left-padded; positions count from each prompt's first real token, so a
sequence gets the same positions here as in the learner's right-padded forward pass. Each row stops at
EOS or after ``max_new_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algos.losses import token_logprobs


@dataclass
class Sample:
    tokens: list[int]
    logprobs: list[float]
    finished: bool  # ended with EOS (False: cut at max_new_tokens)


@torch.no_grad()
def sample(model, prompts: list[list[int]], *, eos_id: int, pad_id: int, temperature: float = 1.0,
           max_new_tokens: int = 16, generator: torch.Generator | None = None) -> list[Sample]:
    if not prompts:
        return []
    if any(not p for p in prompts):
        raise ValueError("empty prompt: every prompt needs at least one token")
    width = max(map(len, prompts))
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts])
    attention = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    cache = out.past_key_values
    logits = out.logits[:, -1]
    n = len(prompts)
    tokens, logps = [[] for _ in range(n)], [[] for _ in range(n)]
    done = torch.zeros(n, dtype=torch.bool)
    for _ in range(max_new_tokens):
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        next_ids = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        next_logps = token_logprobs(logits, next_ids, temperature)
        for i in torch.nonzero(~done).squeeze(-1).tolist():
            tokens[i].append(int(next_ids[i]))
            logps[i].append(float(next_logps[i]))
        done |= next_ids == eos_id
        if bool(done.all()):
            break
        next_ids = torch.where(done, torch.full_like(next_ids, pad_id), next_ids)
        attention = torch.cat([attention, (~done).long()[:, None]], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=next_ids[:, None], attention_mask=attention, position_ids=positions,
                    past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1]
    return [Sample(t, l, bool(t and t[-1] == eos_id)) for t, l in zip(tokens, logps)]
