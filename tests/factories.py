"""A small run config for tests: the default job's shape, a tiny budget; and a run going on in a thread."""

import json
import threading

from actors.cli import load_config


def small_config(run_dir, **overrides) -> dict:
    args = [f"run.dir={run_dir}", "run.name=test", "run.progress=false", "replay.args.batch_episodes=8",
            "replay.args.capacity_episodes=16", "env.args.concurrency=8", "eval.every_s=0",
            "eval.games_per_seat=4", "eval.endpoint_games_per_seat=4", "sampling.max_new_tokens=4"]
    return load_config(args + [f"{k}={v}" for k, v in overrides.items()])


class BackgroundRun:
    """``Driver(cfg)`` executing in a thread, for tests that act on a run while it goes on."""

    def __init__(self, cfg: dict):
        from actors.runs.driver import Driver

        self.run, self.outcome = Driver(cfg), {}
        self.thread = threading.Thread(target=lambda: self.outcome.setdefault("summary", self.run.execute()))
        self.thread.start()

    def last_row(self, empty: dict) -> dict:
        """The run's last metrics row (``empty`` before the first); fails if the run already ended."""
        assert self.thread.is_alive(), "the run ended early"
        metrics = self.run.dir / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        return json.loads(lines[-1]) if lines else empty

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in (self.run.dir / "metrics.jsonl").read_text().splitlines()]

    def join(self, timeout: float) -> dict | None:
        """Wait for the run to end; its summary."""
        self.thread.join(timeout)
        return self.outcome.get("summary")


def dataset_accounts(run) -> dict:
    """DuckDB on a run's episode dataset: distinct episodes per life, the ids found in more than one batch, and the
    episodes its learner trained (its last checkpoint's count): each trained episode once means ``sum(per_life)
    == trained`` and no id twice."""
    import duckdb
    import torch

    from actors.models.checkpoints import TRAINER_STATE, find_checkpoint

    files = f"{run}/episodes/*/*/*.parquet"
    per_life = dict(duckdb.sql(f"select life, count(distinct episode_id) from read_parquet('{files}') group by life")
                    .fetchall())
    twice = duckdb.sql(f"select episode_id from read_parquet('{files}') group by member, episode_id "
                       "having count(distinct (life, batch_seq)) > 1").fetchall()
    trained = torch.load(find_checkpoint(run / "policy") / TRAINER_STATE, weights_only=True)["totals"]["episodes"]
    return {"per_life": per_life, "twice": [i for (i,) in twice], "trained": trained}
