"""The sampler's log-probs must be what the learner recomputes; collate must align them with the tokens; the
learner says how many episodes it dropped as stale without a line at every update."""

import logging
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.rollout.sampling import sample
from actors.learner.batch import collate
from actors.learner.update import Objective, ObjectiveState, action_logprobs, policy_gradient_step
from streams.weights import load_weights, weights_to_bytes
from algos.losses import kl_cost_to_go, token_logprobs
from streams.schema import Columns, trajectory_table
from tests.factories import sampled_row as row


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


def prompts(tokenizer):
    texts = ["TicTacToe. You are X.\n1|2|3\n4|5|6\n7|8|9\nMove:", "TicTacToe. You are O.\nX|2|3\n4|5|6\n7|8|9\nMove:", "Hi"]
    return [tokenizer(t)["input_ids"] for t in texts]



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
    for seed in range(2, 40):  # two different moves for one prompt (identical ones would cancel out)
        samples = sample(model, [p0, p0, p1], eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=4,
                         generator=torch.Generator().manual_seed(seed))
        if samples[0].tokens != samples[1].tokens:
            break
    assert samples[0].tokens != samples[1].tokens
    rows = [row(p0, samples[0], seat=0, ret=1.0), row(p0, samples[1], seat=0, ret=-1.0, episode="e1"),
            row(p1, samples[2], seat=1, ret=0.0, episode="e2")]
    batch = collate(trajectory_table(rows), tok.pad_token_id)
    before = weights_to_bytes(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # a small step: its direction is what counts
    objective = Objective(loss="ppo", advantage="grpo")
    stats = policy_gradient_step(model, optimizer, batch, objective, ObjectiveState(), temperature=1.0)
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


def test_the_kl_as_a_cost_pulls_sampled_moves_towards_the_reference(model_and_tokenizer, tiny_model_dir):
    """kl_estimator=reward: with nothing to learn from the returns, a step descends coef * E[(log pi - log ref) log pi]:
    the moves the policy samples more often than the reference lose probability, the others gain."""
    _, tok = model_and_tokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(5)))
    ps = prompts(tok)[:3]
    samples = sample(model, ps, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=4,
                     generator=torch.Generator().manual_seed(4))
    rows = [row(p, s, ret=0.0, episode=f"e{i}") for i, (p, s) in enumerate(zip(ps, samples))]
    batch = collate(trajectory_table(rows), tok.pad_token_id)
    mask = batch.action_mask[:, 1:]
    with torch.no_grad():
        cost, _ = kl_cost_to_go(action_logprobs(model, batch, 1.0), action_logprobs(reference, batch, 1.0), mask)
    objective = Objective(loss="reinforce", advantage="grpo_mean", kl_coef=1.0, kl_estimator="reward", minibatches=1)
    stats = policy_gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.05), batch, objective,
                                 ObjectiveState(), temperature=1.0, reference=reference)
    with torch.no_grad():
        after = action_logprobs(model, batch, 1.0)
    before = batch.behaviour_logprobs[:, 1:]
    assert cost.abs().sum() > 0 and stats["kl_ref"] != 0
    assert (cost * after)[mask].sum() < (cost * before)[mask].sum()
    with pytest.raises(ValueError, match="KL estimator"):
        Objective(kl_estimator="k2")


@pytest.mark.parametrize("estimator", ["loss", "reward"])
def test_a_roles_own_kl_coefficient_anchors_that_role_alone(model_and_tokenizer, tiny_model_dir, estimator):
    """kl_coef_by_role={solver: 1}: with nothing to learn from the returns, a batch of solver rows moves the weights
    (the KL towards a perturbed reference), and the same batch as proposer rows (coefficient 0) does not."""
    _, tok = model_and_tokenizer
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(5)))
    ps = prompts(tok)[:3]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    samples = sample(model, ps, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=4,
                     generator=torch.Generator().manual_seed(4))
    objective = Objective(loss="reinforce", advantage="grpo_mean", kl_coef=0.0, kl_coef_by_role={"solver": 1.0},
                          kl_estimator=estimator, minibatches=1)
    assert objective.anchored and objective.kl_coefs([("e", "m", "solver"), ("e", "m", "proposer")]).tolist() == [1, 0]
    moved = {}
    for role in ("solver", "proposer"):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        before = [p.detach().clone() for p in model.parameters()]
        rows = [{**row(p, s, ret=0.0, episode=f"e{i}"), Columns.ROLE: role}
                for i, (p, s) in enumerate(zip(ps, samples))]
        batch = collate(trajectory_table(rows), tok.pad_token_id)
        policy_gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.05), batch, objective, ObjectiveState(),
                             temperature=1.0, reference=reference)
        moved[role] = sum((p.detach() - b).abs().sum().item() for p, b in zip(model.parameters(), before))
    assert moved["solver"] > 0 and moved["proposer"] == 0, moved
    with pytest.raises(ValueError, match="a KL coefficient must be a number >= 0"):
        Objective(kl_coef_by_role={"solver": -1})


def test_the_same_version_gap_leaves_out_tokens_of_older_versions(model_and_tokenizer, tiny_model_dir):
    """logprob_gap mixes staleness with engine mismatch; logprob_gap_same_version holds the mismatch alone."""
    _, tok = model_and_tokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    p0, p1 = prompts(tok)[:2]
    fresh, stale = sample(model, [p0, p1], eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=4,
                          generator=torch.Generator().manual_seed(3))
    stale.logprobs = [lp - 0.5 for lp in stale.logprobs]  # as if an older policy had sampled it
    rows = [row(p0, fresh, version=7, ret=1.0), row(p1, stale, version=6, ret=-1.0, episode="e1")]
    batch = collate(trajectory_table(rows), tok.pad_token_id)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = policy_gradient_step(model, optimizer, batch, Objective(minibatches=2), ObjectiveState(), temperature=1.0,
                                 version=7)
    n_fresh, n_stale = len(fresh.tokens), len(stale.tokens)
    assert stats["logprob_gap_same_version"] < 1e-4
    assert stats["logprob_gap"] == pytest.approx(0.5 * n_stale / (n_fresh + n_stale), abs=1e-4)
    # the importance weights' histogram (TensorBoard's): the stale tokens at w = e^0.5 (log2 w = 0.72, the bin up
    # to 2), the fresh ones at w = 1, on the edge between the bins up to 1 and up to 2^0.5
    hist = stats["is_weight_hist"]
    assert hist["2"] == n_stale and hist.get("1", 0) + hist.get("1.414", 0) == n_fresh, hist


def test_a_linear_learning_rate_decay_follows_whichever_budget_runs_out_first():
    from actors.learner.actor import LearnerConfig

    cfg = LearnerConfig(model_path="m", lr=1e-3, lr_decay="linear", lr_final=0.1, budget_s=100.0, budget_versions=50)
    assert cfg.learning_rate(0.0, 0) == pytest.approx(1e-3)
    assert cfg.learning_rate(50.0, 10) == pytest.approx(1e-3 * (1 - 0.9 * 0.5))  # half the time, a fifth of updates
    assert cfg.learning_rate(10.0, 40) == pytest.approx(1e-3 * (1 - 0.9 * 0.8))  # updates run out first
    assert cfg.learning_rate(500.0, 500) == pytest.approx(1e-4)  # past the budget: lr * lr_final
    assert LearnerConfig(model_path="m", lr=1e-3).learning_rate(500.0, 500) == 1e-3  # constant by default
    with pytest.raises(ValueError, match="needs the run's budget"):
        LearnerConfig(model_path="m", lr_decay="linear")
    with pytest.raises(ValueError, match="unknown lr_decay 'cosine'"):
        LearnerConfig(model_path="m", lr_decay="cosine", budget_s=1.0)
    with pytest.raises(ValueError, match="lr_final"):
        LearnerConfig(model_path="m", lr_decay="linear", lr_final=2.0, budget_s=1.0)


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
    state = ObjectiveState()
    groups = state.roles(collate(trajectory_table(rows), tok.pad_token_id).role_keys).tolist()
    assert groups[2] == groups[3] and len({groups[0], groups[1], groups[2]}) == 3
    # ids are stable from batch to batch (RAE's baselines are kept by them)
    again = state.roles(collate(trajectory_table(rows[::-1]), tok.pad_token_id).role_keys).tolist()
    assert again == groups[::-1]


def test_generation_switches_weights_between_tokens_and_says_so(model_and_tokenizer, tiny_model_dir):
    """Interruptible generation: after the swap, tokens and log-probs come from the new weights."""
    _, tok = model_and_tokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.05, alpha=1.0)
    new_weights = weights_to_bytes(new)
    calls = []

    def swap():  # new weights arrive after the second token
        calls.append(1)
        if len(calls) == 2:
            load_weights(model, new_weights)
            return 8
        return None

    ps = prompts(tok)
    samples = sample(model, ps, eos_id=-1, pad_id=tok.pad_token_id, max_new_tokens=5, version=7,
                     swap_weights=swap, generator=torch.Generator().manual_seed(3))
    for prompt, s in zip(ps, samples):
        assert s.versions == [7, 7, 8, 8, 8]
        with torch.no_grad():
            logits = new(input_ids=torch.tensor([prompt + s.tokens])).logits[0, len(prompt) - 1 : -1]
        expected = token_logprobs(logits, torch.tensor(s.tokens))
        assert torch.allclose(torch.tensor(s.logprobs[2:]), expected[2:], atol=1e-4)
        assert not torch.allclose(torch.tensor(s.logprobs[:2]), expected[:2], atol=1e-4)


def test_objective_names_are_checked():
    with pytest.raises(ValueError, match="unknown loss 'ppo2'"):
        Objective(loss="ppo2")
    with pytest.raises(ValueError, match="unknown advantage"):
        Objective(advantage="gae")


@pytest.mark.parametrize("loss, advantage", [("decoupled_ppo", "rae"), ("truncated_is", "rae"), ("reinforce", "rae"),
                                             ("decoupled_ppo", "rae_state")])
def test_every_loss_trains_with_minibatches(model_and_tokenizer, tiny_model_dir, loss, advantage):
    _, tok = model_and_tokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    p0, p1 = prompts(tok)[:2]
    samples = sample(model, [p0, p0, p1, p1], eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=4,
                     generator=torch.Generator().manual_seed(4))
    rows = [row(p, s, seat=i % 2, ret=r, episode=f"e{i}") for i, (p, s, r) in
            enumerate(zip([p0, p0, p1, p1], samples, [1.0, -1.0, 1.0, 0.0]))]
    batch = collate(trajectory_table(rows), tok.pad_token_id)
    objective = Objective(loss=loss, advantage=advantage, minibatches=2, entropy_coef=0.01)
    state = ObjectiveState()
    stats = policy_gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, objective, state,
                                 temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert stats["tokens"] == int(batch.action_mask.sum()) and math.isfinite(stats["pg_loss"])
    assert stats["entropy"] > 0 and len(state.baselines) == 2
    if advantage == "rae_state":  # one mean per (seat, prompt); the digest is the prompt's, not the row's
        assert len(state.state_values) == 4 and batch.state_keys[0] == batch.state_keys[1] != batch.state_keys[2]


def test_the_proximal_log_probs_of_every_minibatch_are_the_models_before_the_first_step(model_and_tokenizer,
                                                                                        tiny_model_dir):
    """pi_prox is computed up front for every row: with a zero learning rate nothing moves, so pi_theta equals
    pi_prox row by row in every minibatch (a row matched with another row's log-probs would show here), and
    logprob_gap is the full batch's."""
    _, tok = model_and_tokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ps = prompts(tok)
    picked = [ps[i % len(ps)] for i in range(7)]
    samples = sample(model, picked, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=4,
                     generator=torch.Generator().manual_seed(5))
    for s in samples[::2]:
        s.logprobs = [lp - 0.25 for lp in s.logprobs]  # every other row as if an older policy had sampled it
    rows = [row(p, s, ret=float(i % 3 - 1), episode=f"e{i}") for i, (p, s) in enumerate(zip(picked, samples))]
    batch = collate(trajectory_table(rows), tok.pad_token_id)
    mask = batch.action_mask[:, 1:]
    with torch.no_grad():
        full = action_logprobs(model, batch, 1.0)
    expected_gap = float(((full - batch.behaviour_logprobs[:, 1:]).abs() * mask).sum() / mask.sum())
    stats = policy_gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, Objective(minibatches=3),
                                 ObjectiveState(), temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert abs(stats["approx_kl"]) < 1e-6 and stats["clip_fraction"] == 0.0
    assert stats["logprob_gap"] == pytest.approx(expected_gap, abs=1e-5)
    assert expected_gap > 0.05  # the shifted rows are in it


def test_turns_dropped_as_stale_are_logged_at_most_every_30_s(caplog, monkeypatch):
    """Stale turns are dropped at many updates: one log line at most every 30 s, with the count since the last
    (the total is in the statistics)."""
    import actors.learner.staleness as control_module

    clock = [1000.0]
    monkeypatch.setattr(control_module.time, "monotonic", lambda: clock[0])
    control = control_module.StalenessBound(2)
    control._rejected_logged = (1000.0, 0)
    totals = {"rejected_turns": 0, "rejected_episodes": 0, "rejected_tokens": 0}
    tokens = SimpleNamespace(tokens=[4], logprobs=[-0.1])
    stale = trajectory_table([row([1, 2], tokens, version=0)])
    caplog.set_level(logging.INFO, logger="actors.learner.staleness")
    for now in [1010.0, 1031.0, 1040.0, 1060.0, 1062.0]:
        clock[0] = now
        assert control.drop_stale(stale, 7, totals) is None
    assert totals["rejected_turns"] == 5
    assert [r.getMessage() for r in caplog.records] == [
        "dropped 2 turns past the staleness bound (now 2) in the last 31 s (2 in all; learner at version 7)",
        "dropped 3 turns past the staleness bound (now 2) in the last 31 s (5 in all; learner at version 7)"]


def test_the_bound_drops_stale_turns_and_keeps_an_episodes_fresh_ones():
    """Learner at version 8, eta = 2: a turn with any token older than version 6 goes, whatever its episode;
    the fresh later turn of a slow episode stays, and an episode left with no turn counts as rejected."""
    from actors.learner.actor import LearnerActor, LearnerConfig

    learner = LearnerActor(LearnerConfig(model_path="unused: nothing is loaded", max_staleness=2))
    learner.version = 8
    tokens = SimpleNamespace(tokens=[4, 5], logprobs=[-0.1, -0.2])
    rows = [row([1, 2], tokens, version=5, episode="slow"), row([1, 2], tokens, version=8, episode="slow"),
            row([1, 2], tokens, version=6, episode="fresh"), row([1, 2], tokens, version=3, episode="stale")]
    rows[1][Columns.TURN] = 1
    rows[2][Columns.POLICY_VERSIONS] = [6, 7]  # interrupted by a weight update: its oldest token counts
    kept = learner._within_bound(trajectory_table(rows))
    assert list(zip(kept.column(Columns.EPISODE_ID).to_pylist(), kept.column(Columns.TURN).to_pylist())) == \
        [("slow", 1), ("fresh", 0)]
    totals = learner.statistics()
    assert (totals["rejected_turns"], totals["rejected_episodes"], totals["rejected_tokens"]) == (2, 1, 4)
    assert learner._within_bound(trajectory_table(rows[3:])) is None  # nothing left to train on
