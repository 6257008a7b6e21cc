"""Stop strings (``sampling.stop``): a completion ends with the token that completes the first stop string in its
generated text, keeps it, and nothing after it is sampled; ``finished`` is true at EOS or a stop string, false when
``max_new_tokens`` cut it. In the hf sampler (a scripted model that writes given tokens, and the tiny model), with
weights swapped mid-batch, for a league's snapshots, and in the vllm sampler's resume path (a stand-in engine:
``tests/system/test_vllm_rollout.py`` runs the real one). The stop check decodes only a completion's tail: it finds
what decoding the whole completion finds, on a byte-level BPE and on a SentencePiece-style tokenizer."""

import random
from types import SimpleNamespace

import pytest
import torch
import trio
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from actors.models.base_model import load_policy
from actors.models.snapshots import write_snapshot
from actors.rollout.actor import RolloutConfig, start_engine
from actors.rollout.sampling import MAX_STOP_BYTES, MAX_STOP_STRINGS, StopStrings, sample
from actors.rollout.vllm_engine import VllmSampler
from actors.rollout.weights import HeldWeights
from streams.messages import GenerationRequest
from streams.weights import load_weights, weights_to_bytes

BOARD = "TicTacToe. You are {mark}.\n1|2|3\n4|5|6\n7|8|9\nMove:"


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def ids(tok, text: str) -> list[int]:
    """``text`` as the tokenizer encodes it."""
    return tok(text, add_special_tokens=False)["input_ids"]


def byte_ids(tok, text: str) -> list[int]:
    """``text`` one byte a token (the byte-level BPE's alphabet): a multi-byte character split over tokens, as a
    model may write it."""
    symbols = bytes_to_unicode()
    return [tok.convert_tokens_to_ids(symbols[b]) for b in text.encode()]


class ScriptedLM(torch.nn.Module):
    """A causal LM's stand-in that writes a script: after the prompt ``[k]`` it samples ``scripts[k]`` token by
    token, then EOS (every other token's logit 40 below). Its cache is the ids it has read."""

    def __init__(self, scripts: dict[int, list[int]], eos_id: int, vocab: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))  # where `sample` finds the device
        self.scripts, self.eos_id, self.vocab = scripts, eos_id, vocab

    def forward(self, input_ids, attention_mask, position_ids, past_key_values=None, use_cache=True):
        seen = input_ids if past_key_values is None else torch.cat([past_key_values, input_ids], dim=1)
        logits = torch.full((len(seen), 1, self.vocab), -40.0)
        for row, (line, mask) in enumerate(zip(seen.tolist(), attention_mask.tolist())):
            real = [t for t, m in zip(line, mask) if m]
            script = self.scripts[real[0]]
            written = len(real) - 1
            logits[row, 0, script[written] if written < len(script) else self.eos_id] = 0.0
        return SimpleNamespace(logits=logits, past_key_values=seen)


def assert_ends_at_first_stop(tok, stop: StopStrings, tokens: list[int]) -> None:
    """The text of ``tokens`` holds a stop string, completed by the last token: the text without it holds none."""
    assert any(s in tok.decode(tokens, skip_special_tokens=True) for s in stop.strings)
    assert not any(s in tok.decode(tokens[:-1], skip_special_tokens=True) for s in stop.strings)


def test_stop_strings_are_checked_naming_the_key():
    assert RolloutConfig(model_path="m").stop == [] and RolloutConfig(model_path="m", stop=("]",)).stop == ["]"]
    for stop, message in ((["]", ""], r"sampling\.stop: '' is not a non-empty string"),
                          (["]"] * (MAX_STOP_STRINGS + 1), rf"sampling\.stop holds {MAX_STOP_STRINGS + 1} strings"),
                          (["é" * MAX_STOP_BYTES], rf"sampling\.stop: .* is {2 * MAX_STOP_BYTES} UTF-8 bytes long"),
                          ("]", r"sampling\.stop must be a list of strings"),
                          ([3], r"sampling\.stop: 3 is not a non-empty string"),
                          (["a\ufffd"], r"sampling\.stop: .* holds U\+FFFD")):
        with pytest.raises(ValueError, match=message):
            RolloutConfig(model_path="m", stop=stop)
    with pytest.raises(ValueError, match=r"sampling\.stop"):
        StopStrings(lambda ids: "", [""])


def test_a_row_ends_with_the_token_that_completes_its_first_stop_string(tok):
    """Scripted rows: a stop string of three-byte characters written a byte a token, a second ``]`` never reached,
    a row cut at the budget (finished=False), one at EOS, a stop string in the prompt that does not count, and one
    completed by the budget's last token. Each row holds the tokens of its script up to its end and nothing else."""
    stop = StopStrings.of(tok, ["日本", "]", "é"])
    eos = tok.eos_token_id
    prompt = {name: ids(tok, text)[0] for name, text in
              (("bytes", "1"), ("bracket", "2"), ("cut", "3"), ("eos", "4"), ("prompt", "]"), ("last", "5"))}
    scripts = {
        prompt["bytes"]: byte_ids(tok, "x") + byte_ids(tok, "日本") + byte_ids(tok, "]y"),
        prompt["bracket"]: byte_ids(tok, "ab]]c"),
        prompt["cut"]: byte_ids(tok, "abcdabcdabcd"),
        prompt["eos"]: byte_ids(tok, "ab"),
        prompt["prompt"]: byte_ids(tok, "q") + byte_ids(tok, "é") + byte_ids(tok, "]"),
        prompt["last"]: byte_ids(tok, "abcdabc]"),
    }
    assert len(scripts[prompt["last"]]) == 8 and len(byte_ids(tok, "日本")) == 6
    model = ScriptedLM(scripts, eos, len(tok))
    names = list(prompt)
    samples = dict(zip(names, sample(model, [[prompt[n]] for n in names], eos_id=eos, pad_id=tok.pad_token_id,
                                     max_new_tokens=8, generator=torch.Generator().manual_seed(0), stop=stop)))
    expected = {"bytes": scripts[prompt["bytes"]][:7], "bracket": byte_ids(tok, "ab]"),
                "cut": scripts[prompt["cut"]][:8], "eos": byte_ids(tok, "ab") + [eos],
                "prompt": scripts[prompt["prompt"]][:3], "last": scripts[prompt["last"]]}
    assert {n: s.tokens for n, s in samples.items()} == expected
    assert {n: s.finished for n, s in samples.items()} == {n: n != "cut" for n in names}
    assert tok.decode(samples["bytes"].tokens) == "x日本" and tok.decode(samples["prompt"].tokens) == "qé"
    for name in ("bytes", "bracket", "prompt", "last"):
        assert_ends_at_first_stop(tok, stop, samples[name].tokens)
    for s in samples.values():
        assert len(s.tokens) == len(s.logprobs) == len(s.versions) and s.versions == [0] * len(s.tokens)
        assert all(lp > -1e-6 for lp in s.logprobs)  # each token the script's, sampled with probability ~1


def test_weights_swapped_mid_batch_keep_the_stops_and_tag_the_tokens(tok):
    """Interruptible generation with stops: the prefix is encoded again after the swap (rows that ended stay
    ended), tokens are those of a run without a swap, and the versions switch at the swap."""
    stop = StopStrings.of(tok, ["]"])
    eos = tok.eos_token_id
    scripts = {ids(tok, str(k))[0]: byte_ids(tok, text) for k, text in enumerate(("a]", "abcd]", "abcdabcdabcd"), 1)}
    prompts = [[k] for k in scripts]
    model = ScriptedLM(scripts, eos, len(tok))
    plain = sample(model, prompts, eos_id=eos, pad_id=tok.pad_token_id, max_new_tokens=8, stop=stop)
    swaps = []

    def swap():  # new weights arrive before the fourth token
        swaps.append(1)
        return 9 if len(swaps) == 3 else None

    swapped = sample(model, prompts, eos_id=eos, pad_id=tok.pad_token_id, max_new_tokens=8, version=8,
                     swap_weights=swap, stop=stop)
    assert [s.tokens for s in swapped] == [s.tokens for s in plain] == [byte_ids(tok, "a]"), byte_ids(tok, "abcd]"),
                                                                         byte_ids(tok, "abcdabcd")]
    assert [s.finished for s in swapped] == [True, True, False]
    assert [s.versions for s in swapped] == [[8, 8], [8, 8, 8, 9, 9], [8, 8, 8] + [9] * 5]
    assert len(swaps) == 7  # one a step after the first, until the last row's budget ran out


def test_the_tiny_model_stops_at_the_closing_bracket(tok, tiny_model_dir):
    """A real model with stop ``]``: a completion that finishes ends at EOS or at the token that completes the
    first ``]``; one that does not is cut at the budget and holds no ``]``. With new weights from the fourth
    token the same holds, each token tagged with its version."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    stop, eos = StopStrings.of(tok, ["]"]), tok.eos_token_id
    prompts = [ids(tok, BOARD.format(mark="XO"[i % 2])) for i in range(48)]
    swaps = []

    def swap():
        swaps.append(1)
        if len(swaps) == 3:
            load_weights(model, weights_to_bytes(new))
            return 1
        return None

    ends = {"stop": 0, "eos": 0, "cut": 0}
    for budget, swap_weights in ((3, None), (6, None), (6, swap)):
        for s in sample(model, prompts, eos_id=eos, pad_id=tok.pad_token_id, temperature=1.5, max_new_tokens=budget,
                        generator=torch.Generator().manual_seed(budget), swap_weights=swap_weights, stop=stop):
            assert 1 <= len(s.tokens) == len(s.logprobs) == len(s.versions) <= budget
            assert eos not in s.tokens[:-1] and "]" not in tok.decode(s.tokens[:-1], skip_special_tokens=True)
            if not s.finished:
                ends["cut"] += 1
                assert len(s.tokens) == budget and "]" not in tok.decode(s.tokens, skip_special_tokens=True)
            elif s.tokens[-1] == eos:
                ends["eos"] += 1
            else:
                ends["stop"] += 1
                assert_ends_at_first_stop(tok, stop, s.tokens)
            if swap_weights is not None:
                assert s.versions == [0, 0, 0, 1, 1, 1][:len(s.tokens)]
    assert swaps and all(ends.values()), ends  # every way to end was seen


def llama_style_tokenizer():
    """A SentencePiece-style BPE (Llama 2's decoder: ``▁`` for a space, byte fallback, the first space dropped),
    made in place: (its core, the ids of its byte tokens, its special ids)."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ("▁", "a", "b", "]", "[", "5", "▁a", "▁[", "]▁", "ab", "▁ab", "é", "日"):
        vocab.setdefault(piece, len(vocab))
    merges = [("▁", "a"), ("▁", "["), ("]", "▁"), ("a", "b"), ("▁a", "b")]
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    core.add_special_tokens(["<unk>", "<s>", "</s>"])
    core.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    core.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                      decoders.Strip(" ", 1, 0)])
    return core, {b: 3 + b for b in range(256)}, [0, 1, 2]


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_the_tail_a_stop_check_decodes_finds_what_decoding_the_whole_completion_finds(tok, kind):
    """Random completions (canonical pieces, multi-byte characters split a byte a token, stray bytes, special tokens
    in between): the first prefix whose last token completes a stop string is the one whose whole text first holds
    one, and no check decodes more than `reach` tokens of text (and the special ones among them)."""
    if kind == "byte_level":
        core, specials = tok.backend_tokenizer, tok.all_special_ids
        byte_token = {b: tok.convert_tokens_to_ids(s) for b, s in bytes_to_unicode().items()}
    else:
        core, byte_token, specials = llama_style_tokenizer()
    decoded = []

    def decode(tokens):
        decoded.append(tokens)
        return core.decode(tokens, skip_special_tokens=True)

    rng = random.Random(0)
    snippets = ["a", "b", "ab", "]", "[5]", " [", "] ", "é", "日", "本", "ü", " ab", "5"]
    stop_sets = [["]"], ["日本"], [" ["], ["é]", "b日"], ["5] a"], ["本本", "ü"], ["ab]"]]
    found = 0
    for trial in range(400):
        tokens = []
        for _ in range(rng.randrange(1, 14)):
            snippet, way = rng.choice(snippets), rng.random()
            if way < 0.5:
                tokens += core.encode(snippet, add_special_tokens=False).ids
            elif way < 0.8:
                tokens += [byte_token[b] for b in snippet.encode()]
            elif way < 0.9 and kind == "byte_level":  # a stray byte: text that is no UTF-8 (see the docstring)
                tokens.append(byte_token[rng.randrange(256)])
            else:
                tokens.append(rng.choice(specials))
        strings = rng.choice(stop_sets)
        stop = StopStrings(decode, strings, specials)
        whole = next((n for n in range(1, len(tokens) + 1)
                      if any(s in core.decode(tokens[:n], skip_special_tokens=True) for s in strings)), None)
        decoded.clear()
        assert stop.first_end(tokens) == whole, (tokens, strings)
        found += whole is not None
        text_tokens = [sum(t not in specials for t in d) for d in decoded]
        assert max(text_tokens, default=0) <= stop.reach + 3 and stop.reach == max(len(s.encode()) for s in strings) + 1
    assert found >= 50  # a stop string was found in many (83 and 90 of the 400 when written)


def test_the_hf_engine_and_a_leagues_snapshots_sample_with_the_runs_stops(tiny_model_dir, tmp_path, monkeypatch):
    """``rollout.args``' stop (``sampling.stop``) reaches the hf engine's sampler, which samples the snapshots too,
    and the vllm sampler; a snapshot's completions end at ``]``."""
    from actors.rollout import actor

    engine = start_engine(RolloutConfig(model_path=str(tiny_model_dir), stop=["]"], snapshot_dir=str(tmp_path),
                                        device="cpu"), HeldWeights("main", "rollout-0"), "rollout-0")
    assert engine.sampler.stop.strings == ("]",) and engine.snapshots.sampler is engine.sampler
    model, tokenizer = load_policy(tiny_model_dir)
    write_snapshot(model, tokenizer, f"{tmp_path}/main-v3")
    prompt = ids(tokenizer, BOARD.format(mark="X"))
    requests = [GenerationRequest(i, "inproc://env", "main-v3", prompt, 1.5, 6, 0) for i in range(24)]

    async def snapshots():
        send, receive = trio.open_memory_channel(len(requests))
        await engine.snapshots.sample(requests, send)
        return [receive.receive_nowait()[0] for _ in requests]

    completions = trio.run(snapshots)
    stopped = [c for c in completions if c.finished and c.token_ids[-1] != tokenizer.eos_token_id]
    assert stopped and all(set(c.versions) == {3} for c in completions)
    for c in completions:
        assert "]" not in tokenizer.decode(c.token_ids[:-1])
    for c in stopped:
        assert tokenizer.decode(c.token_ids).endswith("]")

    made = {}

    class Recording:
        def __init__(self, model_path, eos_id, **kwargs):
            made.update(kwargs)

    monkeypatch.setattr(actor, "VllmSampler", Recording)
    engine = start_engine(RolloutConfig(model_path=str(tiny_model_dir), backend="vllm", stop=["]", "\n"]),
                          HeldWeights("main", "rollout-1"), "rollout-1")
    assert made["stop"].strings == ("]", "\n") and engine.snapshots.sampler.stop is made["stop"]


class ResumedVllm(VllmSampler):
    """`VllmSampler.sample` over a stand-in engine: each submission answers the next ``(tokens, finish_reason)``
    of ``parts``, one version later than the one before (as if weights landed in between)."""

    def __init__(self, parts, stop: StopStrings, eos_id: int):
        self.parts, self.asked, self.stop, self.eos_id, self.version = list(parts), [], stop, eos_id, 0
        self.stats = {"submissions": 0, "resumed": 0, "stopped_across_resume": 0}
        self._thread = SimpleNamespace(run=lambda coroutine: coroutine)  # awaited in place

    async def _submit(self, prompt, temperature, max_tokens):
        self.asked.append((list(prompt), max_tokens))
        self.version += 1
        return self.version, self.parts.pop(0)

    async def _collect(self, part):
        tokens, reason = part
        return list(tokens), [-0.5] * len(tokens), reason


def test_a_stop_string_across_a_resumed_vllm_request_ends_the_completion_there(tok):
    """vLLM checks the text of each submission only: one that spans the tokens of an aborted submission and of
    its resumption is found by the sampler, which cuts the completion after the token that completes it.
    ``finished`` follows vLLM's finish_reason (stop: EOS or a stop string; length: cut)."""
    stop, eos = StopStrings.of(tok, ["日本", "]]"]), tok.eos_token_id
    nihon = byte_ids(tok, "日本")

    def run(parts, max_tokens=16):
        sampler = ResumedVllm(parts, stop, eos)
        return sampler, trio.run(lambda: sampler.sample([7, 8], temperature=1.0, max_tokens=max_tokens))

    first, rest = byte_ids(tok, "ab") + nihon[:4], nihon[4:] + byte_ids(tok, "xy]]")
    sampler, s = run([(first, "abort"), (rest, "stop")])
    assert s.tokens == byte_ids(tok, "ab") + nihon and tok.decode(s.tokens) == "ab日本" and s.finished
    assert s.versions == [1] * 6 + [2] * 2 and len(s.logprobs) == 8
    assert sampler.asked == [([7, 8], 16), ([7, 8, *first], 10)] and sampler.stats["stopped_across_resume"] == 1

    # "]" then "]": vLLM, seeing the second part alone, would have gone on to its own "]]"
    sampler, s = run([(byte_ids(tok, "[5]"), "abort"), (byte_ids(tok, "]x]]"), "stop")])
    assert s.tokens == byte_ids(tok, "[5]]") and s.finished and s.versions == [1, 1, 1, 2]

    for parts, max_tokens, tokens, finished in (
            ([(byte_ids(tok, "ab"), "abort"), (byte_ids(tok, "cd"), "length")], 4, byte_ids(tok, "abcd"), False),
            ([(byte_ids(tok, "ab"), "abort"), (byte_ids(tok, "c]"), "stop")], 16, byte_ids(tok, "abc]"), True),
            ([(byte_ids(tok, "ab"), "abort"), ([eos], "stop")], 16, byte_ids(tok, "ab") + [eos], True),
            ([(byte_ids(tok, "abcd"), "abort")], 4, byte_ids(tok, "abcd"), False)):  # the budget spent: no resubmission
        sampler, s = run(parts, max_tokens)
        assert (s.tokens, s.finished, sampler.parts) == (tokens, finished, [])
        assert sampler.stats["stopped_across_resume"] == 0
