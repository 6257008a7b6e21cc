"""A small run config for tests: the default job's shape, a tiny budget."""

from actors.cli import load_config


def small_config(run_dir, **overrides) -> dict:
    args = [f"run.dir={run_dir}", "run.name=test", "run.progress=false", "replay.args.batch_episodes=8",
            "replay.args.capacity_episodes=16", "env.args.concurrency=8", "eval.every_s=0",
            "eval.games_per_seat=4", "eval.endpoint_games_per_seat=4", "sampling.max_new_tokens=4"]
    return load_config(args + [f"{k}={v}" for k, v in overrides.items()])
