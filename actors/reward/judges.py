"""A reward actor's own model: a judge that scores what no rule can (``reward.args.scorer: judge``).

Two kinds (``reward.args.judge.kind``), either loaded with transformers from any Hugging Face model directory
(``model_path``) onto the reward actor's ``device`` (the CPU by default):

- ``generative``: a causal LM asked, through ``template``, to judge a turn; it answers greedily in at most
  ``max_new_tokens`` tokens, and its reply is read for ``[yes]`` (1) or ``[no]`` (0) or a number in [0, 1], whichever
  comes first (`parse_reply`). A reply with neither, or only a number outside [0, 1], is ``unparsable``.
- ``classifier``: a sequence-classification reward model with one logit; the score is ``sigmoid(logit)``, or the
  logit itself (``classifier_output: logit``).

What the judge sees: ``template`` filled in with ``{env}`` (the episode's environment), ``{role}`` (the agent's role,
or ``seat <n>``), ``{prompt}`` (the prompt the policy saw at that turn: its ``prompt_ids`` decoded with the run's
tokenizer, the policy's own, so its last observation and whatever history the env put in it; "" when the actor has
no tokenizer) and ``{response}`` (the policy's ``action_text``). The judge re-encodes that text with its own
tokenizer, keeping the last ``max_input_tokens`` tokens. One judge prompt per agent of an episode: its last turn
(`actors.reward.scorers.apply_scores` says how the score becomes rewards and returns).

Batched and asynchronous: ``score`` queues an episode's prompts and waits; one batcher task takes what is waiting,
up to ``batch_size`` prompts, waiting at most ``max_wait_s`` for more after the first, and runs the model on them in
one call in a worker thread (``trio.to_thread``), so the reward actor goes on receiving meanwhile. A batch that
raises (``error``) or takes longer than ``timeout_s`` (``timeout``: its thread is abandoned) leaves every episode in
it unscored; so does a prompt whose score is unparsable or not finite. One judge call runs at a time: a batch that
comes while an abandoned call still runs waits for it (within its own ``timeout_s``) before it starts its own, so
a judge slower than the timeout is not called again and again on the same model in threads nobody waits for
(``abandoned_calls`` counts the calls given up on). Unscored, never zero: the reward actor counts
such an episode and passes nothing of it on.

Scores are tagged (``scored_by``) with the judge's identity, ``judge:<model directory name>@<hash>``: the hash is
of the model's ``config.json``, the names and sizes of its weight files, and how it is asked (kind, template,
output), so a different judge, or the same one asked differently, never shares a tag.
"""

from __future__ import annotations

import hashlib
import math
import re
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pyarrow as pa
import trio

from actors.models.devices import check_device
from actors.reward.scorers import Unscored, apply_scores, last_turns
from streams.schema import Columns

KINDS = ("generative", "classifier")
OUTPUTS = ("sigmoid", "logit")
FIELDS = ("env", "role", "prompt", "response")
DEFAULT_TEMPLATE = ("You judge one move in the game {env}, played as {role}.\nThe player saw:\n{prompt}\n"
                    "The player answered: {response}\nIs that a good answer? Reply [yes] or [no].\nReply: ")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
_REPLY = re.compile(r"\[(yes|no)\]|(?<![\w.])(\d+(?:\.\d+)?|\.\d+)", re.IGNORECASE)


@dataclass
class JudgeConfig:
    """``reward.args.judge``: the reward actor's judge (used with ``reward.args.scorer: judge``)."""

    model_path: Optional[str] = None  # a Hugging Face model directory (required with scorer=judge)
    kind: str = "generative"  # generative: a causal LM's reply | classifier: a one-logit sequence classifier
    template: str = DEFAULT_TEMPLATE  # with {response}, and optionally {env}, {role}, {prompt}
    max_new_tokens: int = 8  # generative: the reply's length at most
    batch_size: int = 8  # judge prompts in one model call at most
    max_wait_s: float = 0.05  # after the first prompt, how long a batch waits for more
    timeout_s: float = 60.0  # a batch that takes longer leaves its episodes unscored
    device: str = "cpu"  # auto | cpu | cuda | cuda:<i>
    max_input_tokens: int = 1024  # the judge reads the last this many tokens of its prompt
    classifier_output: str = "sigmoid"  # classifier: sigmoid(logit) in (0, 1), or the raw logit

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown judge kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.classifier_output not in OUTPUTS:
            raise ValueError(f"unknown classifier_output {self.classifier_output!r}; choose one of {', '.join(OUTPUTS)}")
        for key, value, low in (("max_new_tokens", self.max_new_tokens, 1), ("batch_size", self.batch_size, 1),
                                ("max_input_tokens", self.max_input_tokens, 1)):
            if value < low:
                raise ValueError(f"judge.{key} must be >= {low}, not {value}")
        if not self.max_wait_s >= 0 or not self.timeout_s > 0:
            raise ValueError(f"judge.max_wait_s must be >= 0 and judge.timeout_s > 0, not {self.max_wait_s}, "
                             f"{self.timeout_s}")
        check_device(self.device)
        check_template(self.template)


def check_template(template: str) -> None:
    """A template that names only `FIELDS` and names ``{response}``; else a ValueError saying what is wrong."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        template.format(**{name: "" for name in FIELDS})
    except (ValueError, KeyError, IndexError) as error:
        raise ValueError(f"judge.template does not format with {', '.join(FIELDS)}: {error!r}") from error
    if "response" not in names:
        raise ValueError("judge.template must show the judge the policy's answer: put {response} in it")


def parse_reply(reply: str) -> float | None:
    """A generative judge's score: ``[yes]`` 1, ``[no]`` 0, or a number in [0, 1], whichever comes first; None for
    a reply with none of them, or whose first number is outside [0, 1]."""
    found = _REPLY.search(reply)
    if found is None:
        return None
    if found.group(1):
        return 1.0 if found.group(1).lower() == "yes" else 0.0
    value = float(found.group(2))
    return value if 0.0 <= value <= 1.0 else None


def judge_identity(model_path: str | Path, cfg: JudgeConfig) -> str:
    """``judge:<directory name>@<hash>`` of the model's config, weight files (names, sizes) and how it is asked."""
    path = Path(model_path)
    digest = hashlib.sha256()
    config = path / "config.json"
    digest.update(config.read_bytes() if config.exists() else b"")
    for weights in sorted(p for p in path.iterdir() if p.name.endswith(WEIGHT_SUFFIXES)):
        digest.update(f"{weights.name}:{weights.stat().st_size}\n".encode())
    digest.update(f"{cfg.kind}\n{cfg.classifier_output}\n{cfg.template}".encode())
    return f"judge:{path.resolve().name}@{digest.hexdigest()[:10]}"


class GenerativeJudge:
    """A causal LM that answers each judge prompt greedily; its replies are parsed (`parse_reply`). Blocking."""

    def __init__(self, path: str, cfg: JudgeConfig):
        from transformers import AutoModelForCausalLM

        self.cfg, self.tokenizer, self.device = cfg, _tokenizer(path, padding_side="left"), _device(cfg)
        self.model = AutoModelForCausalLM.from_pretrained(path).to(self.device).eval()
        self.last_replies: list[str] = []

    def __call__(self, texts: list[str]) -> list[float | None]:
        import torch

        inputs = _encode(self.tokenizer, texts, self.cfg, self.device)
        with torch.no_grad():
            out = self.model.generate(**inputs, do_sample=False, max_new_tokens=self.cfg.max_new_tokens,
                                      pad_token_id=self.tokenizer.pad_token_id,
                                      eos_token_id=self.tokenizer.eos_token_id)
        self.last_replies = self.tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        return [parse_reply(reply) for reply in self.last_replies]


class ClassifierJudge:
    """A sequence-classification reward model with one logit: sigmoid(logit) or the logit. Blocking."""

    def __init__(self, path: str, cfg: JudgeConfig):
        from transformers import AutoModelForSequenceClassification

        self.cfg, self.tokenizer, self.device = cfg, _tokenizer(path, padding_side="right"), _device(cfg)
        self.model = AutoModelForSequenceClassification.from_pretrained(path).to(self.device).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(f"judge {path}: a classifier judge needs one logit (num_labels=1), this one has "
                             f"{self.model.config.num_labels}")
        if self.model.config.pad_token_id is None:  # it finds each row's last token by the padding
            self.model.config.pad_token_id = self.tokenizer.pad_token_id

    def __call__(self, texts: list[str]) -> list[float | None]:
        import torch

        with torch.no_grad():
            logits = self.model(**_encode(self.tokenizer, texts, self.cfg, self.device)).logits[:, 0].float()
        scores = torch.sigmoid(logits) if self.cfg.classifier_output == "sigmoid" else logits
        return scores.cpu().tolist()


def _device(cfg: JudgeConfig):
    from actors.models.devices import resolve_device

    return resolve_device(cfg.device)


def _tokenizer(path: str, padding_side: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side, tokenizer.truncation_side = padding_side, "left"  # the answer is at the end: keep it
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _encode(tokenizer, texts: list[str], cfg: JudgeConfig, device) -> dict:
    encoded = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=cfg.max_input_tokens)
    return {key: encoded[key].to(device) for key in ("input_ids", "attention_mask")}


MODELS = {"generative": GenerativeJudge, "classifier": ClassifierJudge}


class _Prompt:
    """One judge prompt waiting for its score (or the reason it has none)."""

    __slots__ = ("text", "score", "reason", "detail", "done")

    def __init__(self, text: str):
        self.text, self.score, self.reason, self.detail, self.done = text, None, "", "", trio.Event()


class JudgeScorer:
    """The ``judge`` scorer: episodes' last turns judged in batches by ``judge`` (texts -> scores, None for an
    unparsable one), in a worker thread. ``decode`` turns a row's prompt ids into text ({prompt}); None leaves it ""."""

    def __init__(self, cfg: JudgeConfig, judge: Callable[[list[str]], list[float | None]], scored_by: str,
                 decode: Callable[[list[int]], str] | None = None):
        self.cfg, self.judge, self.scored_by, self.decode = cfg, judge, scored_by, decode
        self.concurrency = 2 * cfg.batch_size  # one batch gathers while the one before it is judged
        self._queue: trio.MemorySendChannel | None = None
        self._stats = {"batches": 0, "judged": 0, "judge_s": 0.0, "largest_batch": 0, "abandoned_calls": 0}
        self._idle = trio.Event()  # set while no judge call runs (a call's own event, set when it returns)
        self._idle.set()

    @classmethod
    def from_config(cls, reward_cfg) -> "JudgeScorer":
        """The judge of a ``RewardConfig``: its model loaded, the run's tokenizer for the prompts."""
        cfg = reward_cfg.judge
        if not cfg.model_path:
            raise ValueError("reward.args.scorer=judge needs reward.args.judge.model_path (a model directory)")
        decode = None
        if reward_cfg.tokenizer_path:
            from transformers import AutoTokenizer

            policy_tokenizer = AutoTokenizer.from_pretrained(reward_cfg.tokenizer_path)
            decode = lambda ids: policy_tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        return cls(cfg, MODELS[cfg.kind](cfg.model_path, cfg), judge_identity(cfg.model_path, cfg), decode)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The batcher: takes what is waiting, up to ``batch_size`` prompts, and judges them in one call."""
        send, receive = trio.open_memory_channel(float("inf"))
        self._queue = send
        task_status.started()
        async with receive:
            while True:
                batch = [await receive.receive()]
                with trio.move_on_after(self.cfg.max_wait_s):
                    while len(batch) < self.cfg.batch_size:
                        batch.append(await receive.receive())
                await self._judge(batch)

    async def score(self, episode: pa.Table) -> pa.Table:
        if self._queue is None:
            raise RuntimeError("the judge's batcher is not running: start JudgeScorer.run first")
        prompts = {agent: _Prompt(self.prompt_text(episode, index)) for agent, index in last_turns(episode).items()}
        for prompt in prompts.values():
            self._queue.send_nowait(prompt)
        for prompt in prompts.values():
            await prompt.done.wait()
        failed = next((p for p in prompts.values() if p.reason), None)
        if failed is not None:
            raise Unscored(failed.reason, failed.detail)
        return apply_scores(episode, {agent: p.score for agent, p in prompts.items()}, self.scored_by)

    def prompt_text(self, episode: pa.Table, index: int) -> str:
        """What the judge sees of row ``index`` (the module's docstring)."""
        row = {name: episode.column(name)[index].as_py() for name in (
            Columns.ENV_NAME, Columns.ROLE, Columns.AGENT, Columns.PROMPT_IDS, Columns.ACTION_TEXT)}
        prompt = self.decode(row[Columns.PROMPT_IDS] or []) if self.decode else ""
        return self.cfg.template.format(env=row[Columns.ENV_NAME], role=row[Columns.ROLE] or f"seat {row[Columns.AGENT]}",
                                        prompt=prompt, response=row[Columns.ACTION_TEXT] or "")

    async def _judge(self, batch: list[_Prompt]) -> None:
        started, called = time.monotonic(), False
        try:
            with trio.fail_after(self.cfg.timeout_s):
                await self._idle.wait()  # an abandoned call still running: one call at a time
                idle = self._idle = trio.Event()
                called = True
                scores = await trio.to_thread.run_sync(self._call, [p.text for p in batch], idle,
                                                       abandon_on_cancel=True)
            if len(scores) != len(batch):
                raise ValueError(f"the judge gave {len(scores)} scores for {len(batch)} prompts")
        except trio.TooSlowError:
            if called:
                self._stats["abandoned_calls"] += 1
                _fail(batch, "timeout", f"a batch of {len(batch)} took longer than timeout_s={self.cfg.timeout_s}")
            else:
                _fail(batch, "timeout", f"the judge's call abandoned at its timeout still ran after timeout_s="
                                        f"{self.cfg.timeout_s} more (one call at a time)")
        except Exception as error:  # the judge's failure, whatever it is: its episodes stay unscored
            _fail(batch, "error", f"{type(error).__name__}: {error}")
        else:
            for prompt, score in zip(batch, scores):
                if score is None or not isinstance(score, (int, float)) or not math.isfinite(score):
                    prompt.reason, prompt.detail = "unparsable", f"score {score!r} for {prompt.text[-80:]!r}"
                else:
                    prompt.score = float(score)
        finally:
            for prompt in batch:
                prompt.done.set()
        self._stats["batches"] += 1
        self._stats["judged"] += len(batch)
        self._stats["judge_s"] += time.monotonic() - started
        self._stats["largest_batch"] = max(self._stats["largest_batch"], len(batch))

    def _call(self, texts: list[str], idle: trio.Event) -> list[float | None]:
        """The judge on ``texts``, in a worker thread; ``idle`` is set when it returns, even abandoned."""
        try:
            return self.judge(texts)
        finally:
            try:
                trio.from_thread.run_sync(idle.set)
            except trio.RunFinishedError:  # the actor's loop has ended: nobody waits
                pass

    def statistics(self) -> dict:
        batches = self._stats["batches"]
        return {**self._stats, "scored_by": self.scored_by,
                "mean_batch": self._stats["judged"] / batches if batches else 0.0}


def _fail(batch: list[_Prompt], reason: str, detail: str) -> None:
    for prompt in batch:
        prompt.reason, prompt.detail = reason, detail
