"""The tiny base model tidal makes for itself, saved as a Hugging Face model directory.

No model can be downloaded on the development machine, so tidal builds a small Llama-architecture causal
LM with a byte-level BPE tokenizer, gives it a short supervised warm-up on transcripts of its environment
(random legal play, optionally mixed with the environment's expert moves: so it knows the action format,
and for some tasks a little of the strategy, as a real base model would), and saves it with
``save_pretrained``. Its tokenizer has a ChatML chat template (``actors.models.chat``), and the warm-up's
prompts are rendered through the run's prompt template (``warmup_prompt``): the model is used as it was tuned,
as an instruct model is.
Everything downstream loads it with ``from_pretrained``: the same path a real model directory takes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from actors.models.chat import CHAT_STYLES, PromptRenderer, give_chat_template, prompt_format
from actors.models.random_model import ModelShape, make_random_model, publish_model_dir
from actors.models.tokenizer import make_tokenizer
from actors.models.transcripts import demonstrations
from algos.losses import sft_loss
from envs.registry import make

log = logging.getLogger(__name__)
CHAT_WORDS = ["system\n", "user\n", "assistant\n"] * 50  # a chat template's role names, as tokens of their own


@dataclass(frozen=True)
class TinyModelConfig:
    hidden_size: int = 128
    layers: int = 2
    heads: int = 4  # head_dim = hidden_size / heads must stay >= 32 (vLLM's CPU attention)
    intermediate_size: int = 256
    vocab_size: int = 320
    # separate input and output embeddings: RL updates of the output side leave the reading of the board alone
    tie_embeddings: bool = False
    max_positions: int = 1024  # the context it declares (a Secret Keeper prompt is 400-500 of its tokens)
    warmup_env: str = "tictactoe"
    warmup_env_args: dict = field(default_factory=dict)
    warmup_expert_share: float = 0.0  # share of demonstration moves from the env's expert_action(), if it has one
    warmup_games: int = 3000
    warmup_steps: int = 600
    warmup_batch: int = 128
    warmup_lr: float = 2e-3
    warmup_prompt: str | None = None  # how warm-up prompts are rendered: chat | raw | a template (None: chat)
    chat_style: str = "chatml"  # the tokenizer's chat template (actors.models.chat.CHAT_STYLES)
    seed: int = 0

    def __post_init__(self):
        if self.chat_style not in CHAT_STYLES:
            raise ValueError(f"model.tiny.chat_style={self.chat_style!r}: choose one of {', '.join(CHAT_STYLES)}")

    def fingerprint(self) -> str:
        fields = asdict(self)
        fields["warmup_prompt"] = self.warmup_prompt or "chat"
        for key, neutral in (("warmup_env_args", {}), ("warmup_expert_share", 0.0)):
            if fields[key] == neutral:  # models made before these fields existed keep their name
                del fields[key]
        if self.warmup_expert_share:  # the demonstrations depend on the env's expert_action(): on its revision too
            revision = getattr(make(self.warmup_env, **self.warmup_env_args), "expert_revision", 0)
            if revision:  # an expert never revised keeps its models' names
                fields["expert_revision"] = revision
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def tiny_model_config(cfg) -> TinyModelConfig:
    """The tiny model of a run config (``actors.runs.config.RunConfig``): warmed up on the run's environment unless
    ``model.tiny.warmup_env`` names one."""
    tiny = {f: getattr(cfg.model.tiny, f) for f in cfg.model.tiny.__dataclass_fields__}
    if tiny.get("warmup_env") is None:
        tiny["warmup_env"] = cfg.env.args.env_name
        tiny["warmup_env_args"] = dict(cfg.env.args.env_args or {})
    if tiny.get("warmup_prompt") is None:
        tiny["warmup_prompt"] = cfg.prompt.template
    return TinyModelConfig(**tiny)


def make_model(tokenizer, cfg: TinyModelConfig):
    """The tiny model: a Llama shape of ``cfg``'s sizes, its embedding as long as the tokenizer, random weights."""

    if cfg.hidden_size // cfg.heads < 32:
        raise ValueError(f"head_dim {cfg.hidden_size // cfg.heads} < 32: vLLM's CPU attention needs >= 32")
    return make_random_model(tokenizer, ModelShape(
        architecture="llama", hidden_size=cfg.hidden_size, layers=cfg.layers, heads=cfg.heads, kv_heads=cfg.heads,
        intermediate_size=cfg.intermediate_size, vocab_size=len(tokenizer), max_positions=cfg.max_positions,
        tie_embeddings=cfg.tie_embeddings, tokenizer_vocab=len(tokenizer), seed=cfg.seed))


def rendered(tokenizer, pairs: list[tuple[str, str]], template: str | None) -> list[tuple[str, str]]:
    """(prompt, answer) pairs with each observation rendered as the ``template`` renders a turn's prompt
    (``prompt.template``; None: chat), so that the warm-up's prompts are the run's."""
    renderer = PromptRenderer(prompt_format(template or "chat"), codec=None, tokenizer=tokenizer)
    return [(renderer.text(observation), answer) for observation, answer in pairs]


def warm_up(model, tokenizer, pairs: list[tuple[str, str]], cfg: TinyModelConfig) -> list[float]:
    """Supervised warm-up on (prompt, answer) pairs: the loss falls on answer tokens (and EOS) only."""
    rng = random.Random(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.warmup_lr)
    model.train()
    losses = []
    for step in range(cfg.warmup_steps):
        batch = rng.sample(pairs, cfg.warmup_batch)
        input_ids, answer_mask = _encode_pairs(tokenizer, batch)
        logits = model(input_ids=input_ids, attention_mask=(input_ids != tokenizer.pad_token_id).long()).logits
        loss, _ = sft_loss(logits, input_ids, answer_mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % 100 == 0:
            log.info("warm-up step %d/%d loss %.3f", step, cfg.warmup_steps, loss.item())
    model.eval()
    return losses


def _encode_pairs(tokenizer, pairs):
    rows, masks = [], []
    for prompt, answer in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + a)
        masks.append([0] * len(p) + [1] * len(a))
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    answer_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
    return input_ids, answer_mask


def ensure_base_model(cache_dir: str | Path, cfg: TinyModelConfig = TinyModelConfig()) -> Path:
    """The directory of the tiny base model for ``cfg``: made and warmed up once, then reused."""
    path = Path(cache_dir).expanduser() / f"tiny-{cfg.warmup_env.replace(':', '-').replace('/', '-')}-{cfg.fingerprint()}"
    if (path / "config.json").exists():
        return path
    log.info("making the tiny base model in %s (a one-time warm-up)", path)
    torch.manual_seed(cfg.seed)
    pairs = demonstrations(cfg.warmup_env, cfg.warmup_games, cfg.seed, cfg.warmup_env_args, cfg.warmup_expert_share)
    tokenizer = make_tokenizer([text for pair in pairs for text in pair] + CHAT_WORDS, cfg.vocab_size)
    give_chat_template(tokenizer, cfg.chat_style)
    pairs = rendered(tokenizer, pairs, cfg.warmup_prompt)
    model = make_model(tokenizer, cfg)
    warm_up(model, tokenizer, pairs, cfg)

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "tidal_base_model.json").write_text(json.dumps(asdict(cfg), indent=2))

    return publish_model_dir(path, save)


def load_policy(path: str | Path):
    """(model, tokenizer) from a Hugging Face model directory, the model in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def stored_parameters(path: str | Path) -> int:
    """How many numbers the model directory ``path`` holds in its safetensors files (read from their headers, no
    tensor loaded): what a copy of the model costs, at any dtype."""
    from safetensors import safe_open

    total = 0
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            total += sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys())
    return total
