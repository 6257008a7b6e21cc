"""The sampler's log-probs must be what the learner recomputes; collate must align them with the tokens."""

import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.sampling import sample
from actors.training import collate, policy_gradient_step
from actors.weights import load_weights, weights_to_bytes
from algos.losses import token_logprobs
from streams.schema import Columns, trajectory_table


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


def prompts(tokenizer):
    texts = ["TicTacToe. You are X.\n1|2|3\n4|5|6\n7|8|9\nMove:", "TicTacToe. You are O.\nX|2|3\n4|5|6\n7|8|9\nMove:", "Hi"]
    return [tokenizer(t)["input_ids"] for t in texts]


def row(prompt, sampled, version=0, seat=0, ret=1.0, episode="e0", matchup="main,main"):
    return {
        Columns.EPISODE_ID: episode, Columns.ENV_NAME: "tictactoe", Columns.SEED: 0, Columns.TURN: 0,
        Columns.AGENT: seat, Columns.MATCHUP: matchup, Columns.POLICY_ID: "main", Columns.PROMPT_IDS: prompt,
        Columns.ACTION_IDS: sampled.tokens, Columns.ACTION_TEXT: "", Columns.BEHAVIOUR_LOGPROBS: sampled.logprobs,
        Columns.POLICY_VERSIONS: [version] * len(sampled.tokens), Columns.REWARD: ret, Columns.TERMINATED: True,
        Columns.TRUNCATED: False, Columns.EPISODE_RETURN: ret, Columns.INVALID_ACTION: False,
        Columns.CREATED_AT: 0.0, Columns.GENERATED_AT: 0.0, Columns.SCORED_AT: 0.0,
    }


def test_batched_left_padded_logprobs_equal_a_plain_forward_pass(model_and_tokenizer):
    model, tok = model_and_tokenizer
    ps = prompts(tok)
    samples = sample(model, ps, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=0.7,
                     max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    for prompt, s in zip(ps, samples):
        assert 1 <= len(s.tokens) <= 6 and len(s.logprobs) == len(s.tokens)
        assert s.finished == (s.tokens[-1] == tok.eos_token_id)
        ids = torch.tensor([prompt + s.tokens])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        expected = token_logprobs(logits, torch.tensor(s.tokens), temperature=0.7)
        assert torch.allclose(torch.tensor(s.logprobs), expected, atol=1e-4)


def test_rows_stop_at_eos_and_are_cut_at_max_tokens(model_and_tokenizer):
    model, tok = model_and_tokenizer
    samples = sample(model, prompts(tok) * 8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                     temperature=2.0, max_new_tokens=2, generator=torch.Generator().manual_seed(1))
    for s in samples:
        assert len(s.tokens) <= 2
        assert tok.eos_token_id not in s.tokens[:-1]
        assert s.finished == (s.tokens[-1] == tok.eos_token_id)


def test_empty_prompt_is_rejected(model_and_tokenizer):
    model, tok = model_and_tokenizer
    with pytest.raises(ValueError, match="empty prompt"):
        sample(model, [[]], eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)


def test_collate_puts_behaviour_logprobs_on_the_action_tokens(model_and_tokenizer):
    model, tok = model_and_tokenizer
    ps = prompts(tok)
    samples = sample(model, ps, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=4)
    batch = collate(trajectory_table([row(p, s, version=3) for p, s in zip(ps, samples)]), tok.pad_token_id)
    # the learner's own log-probs of the action tokens are the behaviour log-probs (same weights)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = token_logprobs(logits[:, :-1], batch.input_ids[:, 1:])
    mask = batch.action_mask[:, 1:]
    assert torch.allclose(logp[mask], batch.behaviour_logprobs[:, 1:][mask], atol=1e-4)
    assert int(mask.sum()) == sum(len(s.tokens) for s in samples)
    assert set(batch.versions[batch.action_mask].tolist()) == {3}


def test_a_step_moves_probability_towards_positive_advantage(model_and_tokenizer, tiny_model_dir):
    _, tok = model_and_tokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    p0, p1 = prompts(tok)[:2]
    samples = sample(model, [p0, p0, p1], eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=4,
                     generator=torch.Generator().manual_seed(2))
    rows = [row(p0, samples[0], seat=0, ret=1.0), row(p0, samples[1], seat=0, ret=-1.0, episode="e1"),
            row(p1, samples[2], seat=1, ret=0.0, episode="e2")]
    batch = collate(trajectory_table(rows), tok.pad_token_id)
    before = weights_to_bytes(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    stats = policy_gradient_step(model, optimizer, batch, temperature=1.0, clip_eps=0.2, max_grad_norm=1.0)
    assert stats["tokens"] == int(batch.action_mask.sum()) and stats["logprob_gap"] < 1e-4
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    new = token_logprobs(logits[:, :-1], batch.input_ids[:, 1:])
    mask = batch.action_mask[:, 1:]
    assert new[0][mask[0]].sum() > batch.behaviour_logprobs[0, 1:][mask[0]].sum()
    load_weights(model, before)  # and the weight round trip restores the old parameters exactly
    with torch.no_grad():
        again = token_logprobs(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1],
                               batch.input_ids[:, 1:])
    assert torch.allclose(again[mask], batch.behaviour_logprobs[:, 1:][mask], atol=1e-4)


def test_weights_of_another_model_are_refused(model_and_tokenizer):
    model, _ = model_and_tokenizer
    from safetensors.torch import save

    with pytest.raises(ValueError, match="do not fit"):
        load_weights(model, save({"other.weight": torch.zeros(2)}))


def test_baselines_are_kept_per_matchup_and_seat(model_and_tokenizer):
    model, tok = model_and_tokenizer
    p = prompts(tok)[0]
    s = sample(model, [p], eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=4)[0]
    rows = [row(p, s, seat=0), row(p, s, seat=1), row(p, s, seat=0, matchup="main,random"),
            row(p, s, seat=0, matchup="main,random")]
    groups = collate(trajectory_table(rows), tok.pad_token_id).groups.tolist()
    assert groups[2] == groups[3] and len({groups[0], groups[1], groups[2]}) == 3
