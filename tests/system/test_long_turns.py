"""Long turns as a reasoning model takes them: a random-init Qwen2 shape prompted through the SPIRAL-style template,
``max_new_tokens`` in the thousands, moves read from the last ``\\boxed{}``, through ``tidal launch`` (local mode):
every completion is kept whole and trained, a cut one is marked, an unreadable one loses its game and the run
goes on."""

import pyarrow.parquet as pq
from transformers import AutoTokenizer

from actors.cli import launch, load_config
from streams.schema import Columns

SMALL_QWEN2 = ["model.init=random", "model.shape.architecture=qwen2", "model.shape.hidden_size=64",
               "model.shape.layers=1", "model.shape.heads=2", "model.shape.kv_heads=1",
               "model.shape.intermediate_size=64", "model.shape.vocab_size=4000", "model.shape.max_positions=4096",
               "model.shape.tokenizer_vocab=512", "model.shape.tokenizer_env=builtin"]


def test_a_qwen2_shape_with_the_spiral_template_takes_turns_of_a_thousand_tokens(tmp_path):
    overrides = [*SMALL_QWEN2, f"model.cache_dir={tmp_path / 'models'}", "prompt.template=spiral",
                 "env.args.answer=boxed", "sampling.max_new_tokens=1024", "run.mode=local", "run.max_versions=2",
                 "run.minutes=20", f"run.dir={tmp_path}", "run.name=long", "run.progress=false",
                 "replay.args.batch_episodes=4", "env.args.concurrency=4", "eval.every_s=0",
                 "eval.endpoint_games_per_seat=1", "learner.checkpoint_every=0", "learner.max_staleness=0"]
    summary = launch(load_config(overrides))
    assert summary["final_version"] >= 2 and not summary["interrupted"]
    assert summary["truncated_actions"] > 0  # random weights over 4000 ids rarely write EOS: most turns run to the budget
    run = tmp_path / "long"
    model_dir = next((tmp_path / "models").glob("random-qwen2-*"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [row for path in sorted(run.glob("episodes/*/main/batch-*.parquet")) for row in pq.read_table(path).to_pylist()]
    assert len(rows) >= 8
    assert any(r[Columns.ACTION_TRUNCATED] for r in rows)  # turns of a thousand tokens, trained whole
    for r in rows:
        assert len(r[Columns.BEHAVIOUR_LOGPROBS]) == len(r[Columns.ACTION_IDS]) == len(r[Columns.POLICY_VERSIONS])
        assert r[Columns.ACTION_TRUNCATED] == (len(r[Columns.ACTION_IDS]) == 1024
                                               and r[Columns.ACTION_IDS][-1] != tokenizer.eos_token_id)
        prompt = tokenizer.decode(r[Columns.PROMPT_IDS])
        assert "put your final answer within \\boxed{}" in prompt and prompt.endswith("<|im_start|>assistant\n")
