"""tidal's own tokenizer: a byte-level BPE trained on text tidal has at hand (no download).

Kept apart from ``base_model`` (which plays environments on trio to warm its model up) so that a model can be
made with nothing but torch, transformers and tokenizers installed (``random_model``, ``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

PAD, EOS = "<pad>", "<eos>"
BYTE_ALPHABET = 256  # a byte-level BPE holds every byte as a token, before any merge
# How Qwen2's tokenizer splits text before its byte-level BPE (transformers' Qwen2Tokenizer)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")
SPLITS = ("gpt2", "qwen2")


def make_tokenizer(corpus: list[str], vocab_size: int, split: str = "gpt2"):
    """A byte-level BPE tokenizer trained on ``corpus``, wrapped as a transformers fast tokenizer.

    It is the same kind of tokenizer GPT-2 and most open models use, so it saves, loads and decodes
    through the standard code path; training it on the game's own text keeps prompts short.

    ``split``: how text is cut into words before the BPE, GPT-2's way or Qwen2's (its regex, NFC-normalised).
    transformers 5 loads the tokenizer of a Qwen2 model directory as its ``Qwen2Tokenizer``, which puts Qwen2's
    split in place of the saved one: a Qwen2-shaped model's tokenizer is trained with that split, so that it
    encodes the same whichever class loads it.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if split not in SPLITS:
        raise ValueError(f"unknown tokenizer split {split!r}; choose one of {', '.join(SPLITS)}")
    core = Tokenizer(models.BPE())
    if split == "qwen2":
        core.normalizer = normalizers.NFC()
        core.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS)


def save_tokenizer(tokenizer, path: Path) -> None:
    """``save_pretrained``, saying that the tokenizer has no unknown token (a byte-level BPE encodes any text):
    else a model's own tokenizer class may add one when it loads (transformers 5's Qwen2Tokenizer adds
    ``<|endoftext|>``), and the tokenizer would grow by a token."""
    tokenizer.save_pretrained(path)
    config_path = Path(path) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["unk_token"] = None
    config_path.write_text(json.dumps(config, indent=2))
