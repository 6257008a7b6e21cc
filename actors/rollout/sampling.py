"""Batched sampling from a Hugging Face causal LM, recording the log-prob and policy version of every token: plain
torch, no event loop, so a GPU machine with torch alone can run it (``benchmarks/gpu_check.py``).

`sample`: prompts of different lengths are left-padded; positions count from each prompt's first real token, so a
sequence gets the same positions here as in the learner's right-padded forward pass. Each row stops at EOS, at a
stop string (``stop``: `StopStrings`), or after ``max_new_tokens``; the batch ends when every row has.

Stop strings are kept in the completion: a row ends with the token whose text completes the first occurrence of
a stop string in the row's generated text (never the prompt's), and nothing after it is sampled. After each step
only the rows still running are checked, each by decoding only the tail of its tokens that can hold a stop string
completed by the new token (`StopStrings.completes`), so the check costs a few small decodes a step, however long
the completion. The ``vllm`` engine stops at the same token (`actors/rollout/vllm_engine.py`).

Generation is interruptible: between two decoding steps ``swap_weights()`` may load newer weights into
the model and return their version. The KV cache, computed with the old weights, is then dropped and the
prefix (prompt and tokens so far) is encoded again with the new ones (AReaL's interruptible rollout), so
every later token, and its log-prob, comes from the new policy; the per-token versions show the switch.

Every tensor is made on the model's device; what comes back is plain Python lists. Sampling probabilities and
log-probs are computed in float32 whatever the model's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from algos.losses import token_logprobs


@dataclass
class Sample:
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]  # the policy version that sampled each token
    finished: bool  # ended with EOS or a stop string (False: cut at max_new_tokens)


MAX_STOP_STRINGS = 16  # sampling.stop: at most this many strings ...
MAX_STOP_BYTES = 128  # ... of at most this many UTF-8 bytes each


def stop_problems(strings) -> list[str]:
    """What is wrong with ``strings`` as ``sampling.stop``: not a list of at most `MAX_STOP_STRINGS` non-empty
    strings of at most `MAX_STOP_BYTES` UTF-8 bytes."""
    if isinstance(strings, str) or not isinstance(strings, Sequence):
        return [f"sampling.stop must be a list of strings, not {strings!r}"]
    problems = []
    if len(strings) > MAX_STOP_STRINGS:
        problems.append(f"sampling.stop holds {len(strings)} strings: at most {MAX_STOP_STRINGS}")
    for s in strings:
        if not isinstance(s, str) or not s:
            problems.append(f"sampling.stop: {s!r} is not a non-empty string")
        elif len(s.encode()) > MAX_STOP_BYTES:
            problems.append(f"sampling.stop: {s[:20]!r}... is {len(s.encode())} UTF-8 bytes long: at most "
                            f"{MAX_STOP_BYTES}")
        elif "\ufffd" in s:
            problems.append(f"sampling.stop: {s!r} holds U+FFFD, which decoding puts for bytes that are no text")
    return problems


class StopStrings:
    """Strings that end a completion, found in the text of its generated tokens as they come.

    ``decode``: token ids to text, special tokens left out (as the env reads a completion and vLLM checks stop
    strings); ``skipped``: the ids it leaves out (they decode to nothing). A stop string of b UTF-8 bytes spans
    at most b tokens that decode to text (every such token of a byte-level BPE, or of a SentencePiece model with
    byte fallback, is at least one byte), so the occurrence a new token completes lies within the last b of
    them. `completes` decodes one more than that (`reach`), which keeps the occurrence clear of what decoding
    does at the start of a text (a SentencePiece decoder drops a leading space); a tail that starts within a
    character's bytes starts earlier, at the character's first byte (a byte-level decoder puts U+FFFD for the
    bytes before the next character, a byte-fallback decoder for the whole run of byte tokens). What it finds is
    what decoding the whole completion finds (``tests/rollout/test_stop_strings.py`` checks both kinds of
    decoder), but for text that is no UTF-8 under a byte-fallback decoder: that turns a whole run of byte tokens
    with an invalid byte in it to U+FFFD, and the tail may hold a stop string of the run's valid end."""

    def __init__(self, decode: Callable[[list[int]], str], strings: Sequence[str], skipped: Collection[int] = ()):
        if problems := stop_problems(strings):
            raise ValueError("; ".join(problems))
        self.decode, self.strings, self.skipped = decode, tuple(strings), frozenset(skipped)
        self.reach = max((len(s.encode()) for s in self.strings), default=0) + 1  # tokens of text a check decodes

    @classmethod
    def of(cls, tokenizer, strings: Sequence[str]) -> StopStrings | None:
        """``strings`` decoded with a transformers tokenizer, through its fast core where it has one (as the env
        actor decodes); None when there are none."""
        if not strings:
            return None
        core = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        if core is not None:
            decode = lambda ids: core.decode(ids, skip_special_tokens=True)  # noqa: E731
        else:
            decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        return cls(decode, strings, tokenizer.all_special_ids)

    def _tail_start(self, tokens: Sequence[int], end: int) -> int:
        """Where the last `reach` tokens of ``tokens[:end]`` that decode to text start (the skipped ones among
        them included)."""
        start, count = end, 0
        while start > 0 and count < self.reach:
            start -= 1
            count += tokens[start] not in self.skipped
        return start

    def completes(self, tokens: Sequence[int], end: int | None = None) -> bool:
        """Whether the last of ``tokens[:end]`` (generated tokens only) completes a stop string, given that none
        of the tokens before it did (`sample` checks after every token)."""
        end = len(tokens) if end is None else end
        if not end or tokens[end - 1] in self.skipped:
            return False
        start = self._tail_start(tokens, end)
        text = self.decode(list(tokens[start:end]))
        for _ in range(3):  # a character's first byte is at most 3 tokens before its last
            if not (start and text.startswith("\ufffd")):
                break
            start -= 1  # the tail starts within a character's bytes
            text = self.decode(list(tokens[start:end]))
        return any(s in text for s in self.strings)

    def first_end(self, tokens: Sequence[int], start: int = 0) -> int | None:
        """The length of the shortest prefix of ``tokens`` longer than ``start`` whose last token completes a stop
        string, given that none completed one within the first ``start``; None if none does."""
        return next((n for n in range(start + 1, len(tokens) + 1) if self.completes(tokens, n)), None)

    def first_across(self, tokens: Sequence[int], joined: int) -> int | None:
        """`first_end` after ``joined`` tokens, for a stop string across them and the tokens after them: only the
        prefixes whose tail (the text a check decodes) reaches back before ``joined`` are checked (whoever sampled
        the tokens after ``joined`` checked the rest)."""
        n = joined + 1
        while n <= len(tokens) and self._tail_start(tokens, n) < joined:
            if self.completes(tokens, n):
                return n
            n += 1
        return None


def _encode(model, input_ids: torch.Tensor, attention: torch.Tensor):
    """Full forward pass over a left-padded prefix; returns (last logits, cache, positions of the last column)."""
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    return out.logits[:, -1], out.past_key_values, positions[:, -1:]


@torch.no_grad()
def sample(model, prompts: list[list[int]], *, eos_id: int, pad_id: int, temperature: float = 1.0,
           max_new_tokens: int = 16, generator: torch.Generator | None = None, version: int = 0,
           swap_weights: Callable[[], int | None] | None = None, stop: StopStrings | None = None) -> list[Sample]:
    """Sample a continuation of every prompt; ``version`` is the version of the weights in ``model`` now.

    ``generator`` should be on the model's device (`device_generator`); one on another kind of device seeds one
    on the model's device for this call (reproducible, without moving the probabilities off the device).
    ``stop``: strings that end a row, kept in it (module docstring)."""
    if not prompts:
        return []
    if any(not p for p in prompts):
        raise ValueError("empty prompt: every prompt needs at least one token")
    device = next(model.parameters()).device
    generator = generator_for(device, generator)
    width = max(map(len, prompts))
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    starts = torch.tensor([width - len(p) for p in prompts], device=device)
    attention = (torch.arange(width, device=device) >= starts[:, None]).long()
    logits, cache, positions = _encode(model, input_ids, attention)
    n = len(prompts)
    tokens, logps, versions = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
    running = list(range(n))  # rows that have not ended
    ended = [False] * n  # at EOS or a stop string
    for step in range(max_new_tokens):
        if step and swap_weights is not None and (new_version := swap_weights()) is not None:
            version = new_version
            logits, cache, positions = _encode(model, input_ids, attention)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        next_ids = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        next_logps = token_logprobs(logits, next_ids, temperature)  # float32
        ids_now, logps_now = next_ids.tolist(), next_logps.tolist()  # one copy to the host per step
        for i in running:
            tokens[i].append(ids_now[i])
            logps[i].append(logps_now[i])
            versions[i].append(version)
            ended[i] = ids_now[i] == eos_id or (stop is not None and stop.completes(tokens[i]))
        running = [i for i in running if not ended[i]]
        if not running or step == max_new_tokens - 1:
            break
        done = torch.tensor(ended, device=device)
        next_ids = torch.where(done, torch.full_like(next_ids, pad_id), next_ids)
        attention = torch.cat([attention, (~done).long()[:, None]], dim=1)
        input_ids = torch.cat([input_ids, next_ids[:, None]], dim=1)
        positions = positions + 1
        out = model(input_ids=next_ids[:, None], attention_mask=attention, position_ids=positions,
                    past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1]
    return [Sample(t, lp, v, e) for t, lp, v, e in zip(tokens, logps, versions, ended)]


def device_generator(device: torch.device | str, seed: int) -> torch.Generator:
    """A random generator on ``device`` (a torch.Generator draws on its own device only), seeded."""
    return torch.Generator(device=device).manual_seed(seed)


def generator_for(device: torch.device, generator: torch.Generator | None) -> torch.Generator | None:
    """``generator`` if it draws on ``device``'s kind of device, else a generator on ``device`` seeded from it.

    The kinds are compared, not the devices: torch checks only a generator's device type, and a generator made for
    ``cuda`` reports no index while the model's parameters are on ``cuda:0`` (comparing the devices sent every GPU
    rollout down the reseeding path). The seed is drawn on the generator's own device, the only one it draws on."""
    if generator is None or generator.device.type == device.type:
        return generator
    seed = int(torch.randint(2**62, (), generator=generator, device=generator.device))
    return device_generator(device, seed)
