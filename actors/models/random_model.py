"""A random-init model of a real architecture's shape, saved as a Hugging Face model directory (``model.init=random``).

Throughput and memory depend on a model's shape, not on what it has learnt, so tidal can measure a real size on any
machine without downloading one: ``ModelShape`` names an architecture (Llama or Qwen2, built with transformers'
own ``LlamaConfig`` / ``Qwen2Config``) and its sizes, and ``ensure_random_model`` builds it with random weights
(float32, safetensors) and tidal's own tokenizer, once, in ``model.cache_dir`` under a fingerprint of the shape.
Everything downstream loads it with ``from_pretrained``, like any model directory.

The tokenizer is the small byte-level BPE of ``actors.models.tokenizer`` (``tokenizer_vocab`` tokens, trained on
the run's environment text or on a built-in text; a Qwen2 shape's splits text as Qwen2's does), while the embedding
has ``vocab_size`` rows, as a real model's does (Qwen2's 151936): the rows past the tokenizer's length are ids no
text encodes to. A random policy may still sample them; they decode to nothing, as a real model's unused ids do.

Nothing here imports trio, Ray, ZeroMQ or vLLM unless ``tokenizer_env`` names an environment: with the built-in
text, a model is made where only torch, transformers and tokenizers are installed (``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from actors.models.chat import CHAT_STYLES, give_chat_template
from actors.models.checksums import checksum_problem, write_checksums
from actors.models.tokenizer import BYTE_ALPHABET, make_tokenizer, save_tokenizer

log = logging.getLogger(__name__)

ARCHITECTURES = ("llama", "qwen2")
BUILTIN = "builtin"  # tokenizer_env: the built-in text, no environment needed
CORPUS_GAMES = 1000  # random-play games whose text trains the tokenizer on an environment
MIN_TOKENIZER_VOCAB = BYTE_ALPHABET + 2  # every byte, pad and eos


@dataclass(frozen=True)
class ModelShape:
    """An architecture's shape (``model.shape``). The defaults are ``configs/model/random_25m.yaml``'s."""

    architecture: str = "llama"  # llama | qwen2 (transformers' LlamaConfig / Qwen2Config)
    hidden_size: int = 512
    layers: int = 8
    heads: int = 8
    kv_heads: int = 8  # key/value heads (grouped-query attention when fewer than heads); must divide heads
    intermediate_size: int = 1376
    vocab_size: int = 8192  # rows of the embedding; >= tokenizer_vocab
    max_positions: int = 2048
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    tokenizer_vocab: int = 512  # the BPE's target size (its text may support fewer tokens)
    tokenizer_env: str = BUILTIN  # whose random-play text trains the BPE: an environment's name, or builtin
    tokenizer_env_args: dict = field(default_factory=dict)
    chat_style: str = "chatml"  # the tokenizer's chat template (actors.models.chat.CHAT_STYLES)
    seed: int = 0

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self, prefix: str = "model.shape.") -> list[str]:
        """What is wrong with this shape, each naming its key."""
        k = {name: f"{prefix}{name}={getattr(self, name)!r}" for name in self.__dataclass_fields__}
        if self.architecture not in ARCHITECTURES:
            return [f"{k['architecture']}: choose one of {', '.join(ARCHITECTURES)}"]
        sizes = ("hidden_size", "layers", "heads", "kv_heads", "intermediate_size", "vocab_size", "max_positions")
        problems = [f"{k[name]} must be a positive integer" for name in sizes if getattr(self, name) < 1]
        if problems:
            return problems
        if self.hidden_size % self.heads:
            problems.append(f"{k['heads']} does not divide {k['hidden_size']} (head_dim = hidden_size / heads)")
        elif (self.hidden_size // self.heads) % 2:
            problems.append(f"{k['hidden_size']} / {k['heads']} is an odd head_dim: rotary embeddings need it even")
        if self.heads % self.kv_heads:
            problems.append(f"{k['kv_heads']} does not divide {k['heads']} (each key/value head serves a group)")
        if self.chat_style not in CHAT_STYLES:
            return [f"{k['chat_style']}: choose one of {', '.join(CHAT_STYLES)}"]
        if self.tokenizer_vocab < MIN_TOKENIZER_VOCAB:
            problems.append(f"{k['tokenizer_vocab']} is below {MIN_TOKENIZER_VOCAB} (every byte, pad and eos)")
        elif self.vocab_size < self.tokenizer_vocab:
            problems.append(f"{k['vocab_size']} is smaller than {k['tokenizer_vocab']}: the embedding needs a row "
                            "for every token of the tokenizer")
        if self.rope_theta <= 0:
            problems.append(f"{k['rope_theta']} must be positive")
        return problems

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def directory_name(self) -> str:
        return f"random-{self.architecture}-h{self.hidden_size}-l{self.layers}-{self.fingerprint()}"


def random_model_config(cfg) -> ModelShape:
    """The shape of a run config (``actors.runs.config.RunConfig``): its tokenizer trained on the run's environment
    unless ``model.shape.tokenizer_env`` names one (or ``builtin``)."""
    shape = {name: getattr(cfg.model.shape, name) for name in ModelShape.__dataclass_fields__}
    if shape.get("tokenizer_env") is None:
        shape["tokenizer_env"] = cfg.env.args.env_name
        shape["tokenizer_env_args"] = dict(cfg.env.args.env_args or {})
    return ModelShape(**shape)


def builtin_corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    """Text in the manner of tidal's prompts and moves (words, numbers, bracketed actions, board rows), made
    without any environment: the tokenizer's text where no environment's code may be imported."""
    words = ("you are player the a board move turn your opponent wins loses draw game over check bet call fold "
             "bid liar offer accept deny for wood stone gold value target number higher lower answer lookup tool "
             "sum row column cell card hand dice round score reward legal action invalid choose one of and is "
             "it to reach with from your values total left right").split()
    rng = random.Random(seed)
    text = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.5:
            line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 14)))
            text.append(line.capitalize() + rng.choice((".", ":", "?", "!")))
        elif kind < 0.75:
            text.append("|".join(rng.choice("XO.") + str(i) for i in range(1, 10)) + "\n")
        else:
            action = rng.choice([str(rng.randint(0, 100)), f"{rng.choice(words)} {rng.randint(1, 9)}",
                                 f"({rng.randint(1, 50)} {rng.choice('+-*/')} {rng.randint(1, 50)})"])
            text.append(f"[{action}]")
    return text


def tokenizer_corpus(shape: ModelShape) -> list[str]:
    if shape.tokenizer_env == BUILTIN:
        return builtin_corpus(seed=shape.seed)
    from actors.models.transcripts import demonstrations  # plays the environment (on trio)

    pairs = demonstrations(shape.tokenizer_env, CORPUS_GAMES, shape.seed, shape.tokenizer_env_args)
    return [text for pair in pairs for text in pair]


def make_random_model(tokenizer, shape: ModelShape):
    """The shape's causal LM with random weights (float32, seeded), its embedding ``vocab_size`` rows long."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if len(tokenizer) > shape.vocab_size:
        raise ValueError(f"model.shape.vocab_size={shape.vocab_size} is smaller than the tokenizer "
                         f"({len(tokenizer)} tokens, its chat template's included)")
    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM),
                                 "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[shape.architecture]
    config = config_class(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=shape.tie_embeddings,
        rope_theta=shape.rope_theta,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(shape.seed)
    with torch.no_grad():
        return model_class(config).float().eval()


def parameter_count(model) -> int:
    """Parameters, each once (tied embeddings count once)."""
    return sum(p.numel() for p in model.parameters())


def ensure_random_model(cache_dir: str | Path, shape: ModelShape = ModelShape()) -> Path:
    """The directory of the random model of ``shape``: made once, then reused (the same shape and seed give
    the same weights, so processes that make it at once agree)."""
    path = Path(cache_dir).expanduser() / shape.directory_name()
    if cached_model(path):
        return path
    log.info("making a random %s model in %s", shape.architecture, path)
    tokenizer = make_tokenizer(tokenizer_corpus(shape), shape.tokenizer_vocab,
                               split="qwen2" if shape.architecture == "qwen2" else "gpt2")
    give_chat_template(tokenizer, shape.chat_style)
    model = make_random_model(tokenizer, shape)
    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)  # safetensors
        save_tokenizer(tokenizer, tmp)
        (tmp / "tidal_base_model.json").write_text(json.dumps(
            {"init": "random", "shape": asdict(shape), "parameters": parameter_count(model),
             "tokenizer_tokens": len(tokenizer)}, indent=2))

    return publish_model_dir(path, save)


def cached_model(path: Path) -> bool:
    """Whether the model directory ``path`` that tidal made before may be used again: every file matches its
    checksum file. One that does not (changed since, cut short, or made by a tidal before checksums) is removed,
    said in the log, to be made again."""
    if not path.exists():
        return False
    problem = checksum_problem(path)
    if problem is None:
        return True
    log.warning("the cached model %s is not used (%s): it is made again", path, problem)
    shutil.rmtree(path)
    return False


def publish_model_dir(path: Path, save) -> Path:
    """``save(tmp)`` into a directory of this process, checksummed (``checksums.py``), then renamed to ``path``.
    Several processes may make the same model at once: the same config and seed made the same model, so the
    first one there is kept."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    save(tmp)
    write_checksums(tmp)
    try:
        tmp.rename(path)
    except OSError:
        if checksum_problem(path) is not None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return path
