"""``tidal replay``: the learner's history run again from its recorded batches, bit for bit, and counterfactuals.

A run's learner leaves two records (``actors/learner/dataset.py``, ``actors/learner/ledger.py``): each trained
batch as Parquet, and, per version, what else made it (the learning rate, the seed, the newest token version
accepted, the guard's rollbacks and anchors, restarts and resets) with a digest of the weights it published.
``Rerun`` rebuilds the learner in this process (no Ray, no actors) from the base model or a checkpoint, feeds it
the batches in the ledger's order with the recorded schedule, and checks each version's digest: the first that
differs stops it, naming the version, the batch and the first tensor that differs.

With a counterfactual config (any ``learner.*`` override) a second learner trains beside the faithful one on the
same batches with the same schedule (a rollback or an anchor where the run had one; its learning rate the
recorded one times its own ``lr`` over the run's), and after each update the report compares them: each side's
loss statistics and importance weights, and the KL from the recorded policy to the counterfactual one on the
batch's action tokens. Outputs go to ``<run>/replays/<stamp>/``, never into the run itself.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from actors.learner.batch import collate
from actors.learner.dataset import DATASET_DIR, batch_file
from actors.learner.group import Shard, join_group, leave_group, open_rendezvous
from actors.learner.ledger import (LEDGER_DIR, LedgerError, code_fingerprint, first_difference, ledger_path, read_ledger,
                                   weights_digest)
from actors.learner.trainer import Trainer
from actors.learner.update import action_logits
from actors.models.checkpoint_dir import TRAINER_STATE, find_checkpoint
from actors.models.checkpoints import load_trainer_state
from streams.schema import NAMES, TRAJECTORY_SCHEMA

log = logging.getLogger(__name__)
REPLAYS_DIR = "replays"
KL_CHUNK_TOKENS = 1 << 14  # padded tokens per pass of the KL measurement
REPORTED = ("pg_loss", "approx_kl", "clip_fraction", "is_ess", "logprob_gap", "is_weight_mean", "is_outside_share")


class ReplayRefused(ValueError):
    """The run cannot be replayed as asked: names what is missing and the last version that can be replayed."""


@dataclass
class Divergence:
    version: int
    batch: dict | None
    tensor: str | None
    detail: str

    def __str__(self) -> str:
        where = f" (batch {self.batch['life']}/{self.batch['member']}/{self.batch['seq']})" if self.batch else ""
        tensor = f": tensor {self.tensor} differs first" if self.tensor else ""
        return f"diverged at version {self.version}{where}{tensor}; {self.detail}"


@dataclass
class Recorded:
    """A run's records of one member: its directory, the ledger's entries and where its batches lie."""

    run_dir: Path
    member: str
    entries: list[dict]

    @property
    def dataset(self) -> Path:
        return self.run_dir / DATASET_DIR

    @property
    def versions(self) -> int:
        return max((e["version"] for e in self.entries), default=0)


def open_recorded(run_dir: str | Path, member: str | None = None) -> Recorded:
    """The records of ``run_dir`` (of ``member``: needed only when the run had several), or ``ReplayRefused``."""
    run_dir = Path(run_dir).expanduser()
    if not (run_dir / "config.json").exists():
        raise ReplayRefused(f"{run_dir} is not a run directory (no config.json)")
    root = run_dir / DATASET_DIR
    if not root.is_dir():
        raise ReplayRefused(f"{run_dir} has no episode dataset ({DATASET_DIR}/): the run was made with "
                            "observe.dataset=false, so its trained batches were not kept and nothing can be replayed")
    ledgers = sorted((root / LEDGER_DIR).glob("*.jsonl")) if (root / LEDGER_DIR).is_dir() else []
    if not ledgers:
        raise ReplayRefused(f"{run_dir} has an episode dataset but no learner ledger ({DATASET_DIR}/{LEDGER_DIR}/): it "
                            "was recorded by a tidal from before the ledger, so its learner cannot be replayed")
    members = [p.stem for p in ledgers]
    if member is None and len(members) > 1:
        raise ReplayRefused(f"{run_dir} has several members ({', '.join(members)}): name one with --member")
    member = member or members[0]
    if member not in members:
        raise ReplayRefused(f"{run_dir} has no ledger of member {member!r} (it has {', '.join(members)})")
    try:
        entries = read_ledger(ledger_path(root, member))
    except LedgerError as error:
        raise ReplayRefused(f"the ledger cannot be read: {error}") from None
    if not entries:
        raise ReplayRefused(f"{ledger_path(root, member)} is empty: the learner never started")
    return Recorded(run_dir, member, entries)


def load_batch(recorded: Recorded, batch: dict) -> pa.Table:
    """A recorded batch as the learner received it (the trajectory columns, in its schema)."""
    path = batch_file(recorded.dataset, batch["life"], batch["member"], batch["seq"])
    table = pq.read_table(path)
    missing = [name for name in NAMES if name not in table.column_names]
    if missing:
        raise ValueError(f"{path} lacks the columns {', '.join(missing)}")
    return table.select(list(NAMES)).cast(TRAJECTORY_SCHEMA)


def replayable_until(recorded: Recorded, start: int) -> tuple[int, str]:
    """How far the batches on disk reach from ledger entry ``start``: the last version whose every batch exists,
    and what is missing after it ("" if nothing)."""
    version = recorded.entries[start]["version"]
    for entry in recorded.entries[start + 1:]:
        if entry["kind"] == "update":
            batch = entry["batch"]
            if not batch_file(recorded.dataset, batch["life"], batch["member"], batch["seq"]).exists():
                return version, (f"batch {batch['life']}/{batch['member']}/{batch['seq']} (version {entry['version']}) "
                                 "is not in the dataset")
        if entry["kind"] in ("update", "reset"):
            version = entry["version"]
    return version, ""


def checkpoints_at(run_dir: Path, policy_dir: Path) -> dict[int, Path]:
    """The full checkpoints a replay can start from, by version: the run's own, and those earlier replays wrote
    (``--to-version``)."""
    found = {}
    for candidate in [find_checkpoint(policy_dir), *sorted((run_dir / REPLAYS_DIR).glob("*/v*"))]:
        if candidate is not None and (candidate / TRAINER_STATE).exists():
            found.setdefault(int(load_trainer_state(candidate / TRAINER_STATE)["version"]), candidate)
    return found


def serve_rank(cfg, rank: int, rendezvous: str) -> None:
    """Rank ``rank`` of a replay's learner group, in a process of its own, until rank 0 stops the group."""
    from actors.learner.rank import LearnerRankActor, RankConfig

    logging.basicConfig(level=logging.WARNING)
    LearnerRankActor(RankConfig(cfg, rank, rendezvous), f"replay-rank{rank}")._serve()


def held_after(held: list[int], entry: dict) -> list[int]:
    """The anchors' versions a learner holds after the update ``entry`` (``Trainer.keep_anchor``: the last two;
    ``restore_anchor``: back to the older, which it keeps)."""
    if entry["guard"]["rollback"]:
        return held[:1]
    return [*held, entry["version"]][-2:] if entry["guard"]["anchored"] else held


def rollback_anchors(entries: list[dict]) -> dict[int, int]:
    """Each rollback's version -> the version of the anchor it went back to, from the whole ledger."""
    held, found = [], {}
    for entry in entries:
        if entry["kind"] == "start":
            held = []
        elif entry["kind"] == "update":
            if entry["guard"]["rollback"]:
                found[entry["version"]] = held[0] if held else -1
            held = held_after(held, entry)
    return found


def policy_kl(recorded, counter, table: pa.Table, temperature: float, pad_id: int) -> float:
    """Mean KL(recorded || counterfactual) over ``table``'s action tokens, full distributions."""
    batch = collate(table, pad_id)
    lengths = batch.attention_mask.sum(1)
    total, tokens, rows = 0.0, 0, batch.input_ids.shape[0]
    per_pass = max(1, KL_CHUNK_TOKENS // max(int(lengths.max()), 1))
    device = next(recorded.parameters()).device
    with torch.no_grad():
        for begin in range(0, rows, per_pass):
            part = batch.rows(torch.arange(begin, min(begin + per_pass, rows))).trimmed().to(device)
            mask = part.action_mask[:, 1:]
            p = torch.log_softmax(action_logits(recorded, part).float() / temperature, -1)[mask]
            q = torch.log_softmax(action_logits(counter, part).float() / temperature, -1)[mask]
            total += float((p.exp() * (p - q)).sum())
            tokens += int(mask.sum())
    return total / max(tokens, 1)


class Rerun:
    """One replay of ``recorded`` with the learner config ``cfg`` (the run's), and optionally a counterfactual
    learner config ``counter`` beside it. ``out``: the replay's own directory."""

    def __init__(self, recorded: Recorded, cfg, out: Path, counter=None, from_checkpoint: Path | None = None,
                 to_version: int | None = None, force: bool = False, progress_every_s: float = 10.0,
                 ranks: int | None = None, policies_at: tuple[int, ...] = ()):
        self.recorded, self.out, self.to_version = recorded, out, to_version
        self.policies_at = set(policies_at)  # versions whose policies are written (HF directories), for --eval
        self.policies: dict[int, dict[str, str]] = {}  # version -> {"recorded": dir, "counterfactual": dir}
        recorded_ranks = {e.get("ranks", 1) for e in recorded.entries if e["kind"] == "start"}
        ranks = ranks or max(recorded_ranks)
        # bitwise only on the group size the run trained with: another one's digests are counted, not stopped at
        self.exact = recorded_ranks == {ranks}
        self.cfg = replace(cfg, dataset_dir=None, save_dir=None, resume=False, ranks=ranks)
        if counter is not None and ranks > 1:
            raise ReplayRefused("a counterfactual replay runs on one learner rank (this process holds one learner "
                                f"group, and the run's takes {ranks}): replay with --ranks 1 beside it")
        self.counter_cfg = replace(counter, dataset_dir=None, save_dir=None, resume=False, ranks=1) if counter else None
        self._ranks: list = []  # ranks 1.. of a group, as processes
        self.from_checkpoint, self.progress_every_s = from_checkpoint, progress_every_s
        self.start = self._start_index()
        self._check_code(force)
        until, missing = replayable_until(recorded, self.start)
        if missing and (to_version is None or to_version > until):
            raise ReplayRefused(f"{missing}: the last version that can be replayed is {until} (--to-version {until} "
                                "replays up to it)")
        self.version = recorded.entries[self.start]["version"]
        self.rows: list[dict] = []  # the counterfactual report, one row per update
        self.held: list[int] = []  # the versions of the anchors the replay's trainers hold (as the learner did)
        self.anchor_of = rollback_anchors(recorded.entries)

    def _start_index(self) -> int:
        entries = self.recorded.entries
        if self.from_checkpoint is None:
            first = entries[0]
            if first["version"] != 0 or first.get("from") != "base":
                raise ReplayRefused(f"the ledger begins at version {first['version']}, from a checkpoint (the dataset "
                                    "was turned on during the run): replay it from a checkpoint (--from-version)")
            return 0
        version = int(load_trainer_state(self.from_checkpoint / TRAINER_STATE)["version"])
        # the entry that made the version (a version has one update or reset; a start holds the base's, version 0)
        made = [i for kinds in (("update", "reset"), ("start",)) for i, e in enumerate(entries)
                if e["kind"] in kinds and e["version"] == version]
        if not made:
            raise ReplayRefused(f"the ledger holds no version {version} (it reaches {self.recorded.versions})")
        return made[0]

    def _check_code(self, force: bool) -> None:
        recorded = [e["code"] for e in self.recorded.entries if e["kind"] == "start"]
        now = code_fingerprint()
        if any(code != now for code in recorded):
            message = (f"the run was recorded by other code than this tidal's (code fingerprints {sorted(set(recorded))} "
                       f"against {now}: the update's code or torch changed: actors/learner/ledger.py CODE_FILES)")
            if not force:
                raise ReplayRefused(message + "; --force replays it anyway, and stops at the first divergence")
            log.warning("%s: replaying anyway (--force)", message)

    def run(self) -> dict:
        started = time.perf_counter()
        faithful = self._trainer(self.cfg)
        try:
            return self._run(faithful, started)
        finally:
            self._leave(faithful)

    def _run(self, faithful: Trainer, started: float) -> dict:
        entries = self.recorded.entries
        counter = self._trainer(self.counter_cfg) if self.counter_cfg else None
        last = self.recorded.versions if self.to_version is None else min(self.to_version, self.recorded.versions)
        total = sum(1 for e in entries[self.start + 1:] if e["kind"] in ("update", "reset") and e["version"] <= last)
        result = {"from_version": self.version, "versions": total, "versions_equal": 0, "divergence": None,
                  "run_learner_s": 0.0, "ranks": self.cfg.ranks, "exact": self.exact}
        divergence = self._check(faithful, entries[self.start], None)
        last_said = time.perf_counter()
        for entry in entries[self.start + 1:]:
            if divergence is not None or (self.to_version is not None and self.version >= self.to_version):
                break
            divergence = self._step(entry, faithful, counter, result)
            if divergence is None and self.version in self.policies_at and self.version not in self.policies:
                self.policies[self.version] = {side: self._policy(trainer, f"{side}-v{self.version}") for side, trainer
                                               in (("recorded", faithful), ("counterfactual", counter)) if trainer}
            if not self.exact:  # another group size: counted, not stopped at
                result.setdefault("first_divergence", str(divergence) if divergence else None)
                divergence = None
            if time.perf_counter() - last_said >= self.progress_every_s:
                last_said = time.perf_counter()
                log.info("replay: version %d of %d (%d checked equal), %.0f s", self.version,
                         self.recorded.versions, result["versions_equal"], last_said - started)
        result.update(divergence=str(divergence) if divergence else None, reached_version=self.version,
                      replay_s=time.perf_counter() - started,
                      digests_equal=result["versions_equal"] / total if total else 1.0)
        if self.to_version is not None and divergence is None:
            result["saved"] = str(self._save(faithful, self.out / f"v{self.version}"))
            if counter is not None:
                result["saved_counterfactual"] = str(self._save(counter, self.out / f"counterfactual-v{self.version}"))
        return result

    def _trainer(self, cfg) -> Trainer:
        """A learner as the run's: one rank, or rank 0 of a group whose other ranks are processes of their own."""
        trainer = Trainer(cfg, Shard(0, cfg.ranks))
        if cfg.ranks > 1:
            store, rendezvous = open_rendezvous("127.0.0.1", cfg.ranks)
            spawn = multiprocessing.get_context("spawn")
            self._ranks = [spawn.Process(target=serve_rank, args=(cfg, r, rendezvous), daemon=True,
                                         name=f"replay-rank{r}") for r in range(1, cfg.ranks)]
            for process in self._ranks:
                process.start()
            join_group(trainer.shard, trainer.device, rendezvous, store)
        trainer.load(self.from_checkpoint)
        return trainer

    def _leave(self, trainer: Trainer) -> None:
        if self._ranks:
            trainer.stop_group()
            for process in self._ranks:
                process.join(timeout=60)
            leave_group()
            self._ranks = []

    def _step(self, entry: dict, faithful: Trainer, counter: Trainer | None, result: dict) -> Divergence | None:
        kind = entry["kind"]
        if kind == "dropped_batch":
            return None
        if kind == "start":  # a restart: the weights are the checkpoint's, and no anchor is held
            self.held = []
            for trainer in filter(None, (faithful, counter)):
                trainer.drop_anchors()
            return self._check(faithful, entry, None, "the learner restarted from a checkpoint that did not hold "
                                                      "the weights it had trained")
        if kind == "reset":
            for trainer in filter(None, (faithful, counter)):
                trainer.reset()
            self.version = entry["version"]
            return self._counted(self._check(faithful, entry, None), result)
        table = load_batch(self.recorded, entry["batch"])
        if table.num_rows != entry["rows"]:
            return Divergence(entry["version"], entry["batch"], None, f"its file holds {table.num_rows} rows, the "
                              f"ledger says {entry['rows']} were trained")
        if entry["guard"]["rollback"] and self.held[:1] != [self.anchor_of[entry["version"]]]:
            raise ReplayRefused(f"version {entry['version']} rolled back to the anchor of version "
                                f"{self.anchor_of[entry['version']]}, which this replay (from version "
                                f"{self.recorded.entries[self.start]['version']}) does not hold: replay from an "
                                "earlier version")
        stats = self._update(faithful, table, entry, entry["lr"])
        if counter is not None:
            scale = self.counter_cfg.lr / self.cfg.lr if self.cfg.lr else 1.0
            counter_stats = self._update(counter, table, entry, entry["lr"] * scale)
            self.rows.append(self._report_row(entry, stats, counter_stats, faithful, counter, table))
        self.held = held_after(self.held, entry)
        self.version = entry["version"]
        result["run_learner_s"] += entry.get("train_s", 0.0)
        return self._counted(self._check(faithful, entry, entry["batch"]), result)

    def _update(self, trainer: Trainer, table: pa.Table, entry: dict, lr: float) -> dict:
        trainable, _ = trainer.within_context(table)
        stats = trainer.update(trainable, lr, self.version, entry["max_version"])
        if entry["guard"]["rollback"]:
            trainer.restore_anchor()
        elif entry["guard"]["anchored"]:
            trainer.keep_anchor()
        return stats

    @staticmethod
    def _counted(divergence: Divergence | None, result: dict) -> Divergence | None:
        if divergence is None:
            result["versions_equal"] += 1
        return divergence

    @staticmethod
    def _check(trainer: Trainer, entry: dict, batch: dict | None, why: str = "") -> Divergence | None:
        """Does the trainer hold the weights ``entry`` recorded? (A divergence naming the first tensor if not.)"""
        replayed = weights_digest(trainer.full_state())
        tensor = first_difference(entry["digest"], replayed)
        if tensor is None:
            return None
        detail = why or (f"recorded digest {entry['digest'].get(tensor)}, replayed {replayed.get(tensor)}")
        return Divergence(entry["version"], batch, tensor, detail)

    def _report_row(self, entry: dict, stats: dict, counter_stats: dict, faithful: Trainer, counter: Trainer,
                    table: pa.Table) -> dict:
        row = {"version": entry["version"], "rows": table.num_rows,
               "kl_recorded_to_counterfactual": policy_kl(faithful.model, counter.model, table, self.cfg.temperature,
                                                          faithful.tokenizer.pad_token_id)}
        for key in REPORTED:
            for side, values in (("recorded", stats), ("counterfactual", counter_stats)):
                if isinstance(values.get(key), (int, float)):
                    row[f"{key}_{side}"] = float(values[key])
        for side, values in (("recorded", stats), ("counterfactual", counter_stats)):
            if values.get("is_weight_hist"):
                row[f"is_weight_hist_{side}"] = values["is_weight_hist"]
        return row

    def _policy(self, trainer: Trainer, name: str) -> str:
        """The policy as a Hugging Face model directory (to evaluate it)."""
        trainer.snapshot(self.out / name)
        return str(self.out / name)

    def _save(self, trainer: Trainer, path: Path) -> Path:
        """A full checkpoint (an HF model directory, its optimizer and trainer state): to inspect, or to replay
        from (``--from-version``)."""
        trainer.save(path, {"version": self.version, "rng": torch.get_rng_state(), "resets": [], "totals": {},
                            "staleness": {}, "cursor": {}, "wall_s": 0.0, "staleness_control": {}})
        return path

    def write_report(self, result: dict) -> None:
        """``result.json``, and with a counterfactual ``report.jsonl`` (per update) and ``report.md`` (side by
        side, by quarter of the replay)."""
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "result.json").write_text(json.dumps(result, indent=2))
        if not self.rows:
            return
        with open(self.out / "report.jsonl", "w") as f:
            for row in self.rows:
                f.write(json.dumps(row) + "\n")
        (self.out / "report.md").write_text(side_by_side(self.rows, result))


def side_by_side(rows: list[dict], result: dict) -> str:
    """The counterfactual report: each statistic's mean on both sides, over each quarter of the updates."""
    quarters = [rows[i * len(rows) // 4:(i + 1) * len(rows) // 4] for i in range(4)]
    quarters = [q for q in quarters if q]
    head = ["statistic", *(f"v{q[0]['version']}-{q[-1]['version']}" for q in quarters)]
    lines = [f"# Counterfactual replay: {result.get('counterfactual', '')}", "",
             f"Recorded against counterfactual on the same {len(rows)} batches (mean per update).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = ["kl_recorded_to_counterfactual"] + [f"{k}_{side}" for k in REPORTED for side in ("recorded", "counterfactual")]
    for key in keys:
        cells = []
        for q in quarters:
            values = [r[key] for r in q if key in r]
            cells.append(f"{sum(values) / len(values):.4g}" if values else "")
        if any(cells):
            lines.append("| " + " | ".join([key, *cells]) + " |")
    return "\n".join(lines) + "\n"
