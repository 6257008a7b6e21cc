"""A batch of trajectories with every column filled: the traffic of `benchmarks/stream_bench.py`, and the episode
body the fuzzer (`stream_fuzz.py`) makes its bad frames from."""

from __future__ import annotations

import numpy as np

from streams.schema import Columns, trajectory_table

TOKENS = 512


def trajectory_batch(records: int, seed: int = 0):
    """``records`` agent-turns of 512 tokens each (256 prompt, 256 action) with every column filled."""
    rng = np.random.default_rng(seed)
    half = TOKENS // 2
    rows = [{
        Columns.EPISODE_ID: f"e{seed}-{i}", Columns.ENV_NAME: "bench", Columns.SEED: i, Columns.TURN: 0,
        Columns.AGENT: 0, Columns.MATCHUP: "main,main", Columns.POLICY_ID: "main",
        Columns.PROMPT_IDS: rng.integers(0, 32000, half).tolist(), Columns.ACTION_IDS: rng.integers(0, 32000, half).tolist(),
        Columns.ACTION_TEXT: "x" * 64, Columns.BEHAVIOUR_LOGPROBS: (-rng.random(half)).tolist(),
        Columns.POLICY_VERSIONS: [3] * half, Columns.REWARD: 1.0, Columns.TERMINATED: True,
        Columns.TRUNCATED: False, Columns.EPISODE_RETURN: 1.0, Columns.INVALID_ACTION: False,
        Columns.CREATED_AT: 0.0, Columns.GENERATED_AT: 0.0, Columns.SCORED_AT: 0.0,
    } for i in range(records)]
    return trajectory_table(rows)

