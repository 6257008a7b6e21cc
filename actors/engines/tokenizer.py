"""tidal's own tokenizer: a byte-level BPE trained on text tidal has at hand (no download).

Kept apart from ``base_model`` (which plays environments on trio to warm its model up) so that a model can be
made with nothing but torch, transformers and tokenizers installed (``random_model``, ``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

PAD, EOS = "<pad>", "<eos>"
BYTE_ALPHABET = 256  # a byte-level BPE holds every byte as a token, before any merge


def make_tokenizer(corpus: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``corpus``, wrapped as a transformers fast tokenizer.

    It is the same kind of tokenizer GPT-2 and most open models use, so it saves, loads and decodes
    through the standard code path; training it on the game's own text keeps prompts short.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
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
