"""Propose and solve (envs/propose_solve.py) and its task buffer (envs/task_buffer.py)."""

from collections import Counter
import random
from fractions import Fraction

import pyarrow as pa
import pytest
import trio

from actors.env.episode import EpisodeSettings, play_episode
from envs.countdown import numbers_used, evaluate, parse_expression, reachable
from envs.propose_solve import ProposeSolve, kind_balance, task_kind
from envs.registry import make
from envs.task_buffer import SCHEMA, TaskBuffer, shared_buffer
from envs.witness import DRAWN, FORMS, SHOWN, form_of, witnesses
from streams.messages import Completion
from streams.schema import Columns

RIGHT, WRONG = "[(3 * 4) + 5]", "[3 + 4 + 5]"  # for the task [3 4 5 -> 17]


def game(max_retries=0, **kwargs):
    return make("propose_solve", invalid_penalty=-0.5, max_retries=max_retries, **{"buffer": None, **kwargs})


def play(g, moves):
    results = []
    for move in moves:
        results.append(g.step(move))
    return results


@pytest.mark.parametrize("answers,proposer", [
    ([RIGHT, WRONG, RIGHT, WRONG], 0.5), ([RIGHT, WRONG, WRONG, WRONG], 0.75), ([RIGHT, RIGHT, RIGHT, WRONG], 0.25),
    ([RIGHT] * 4, 0.0), ([WRONG] * 4, 0.0)])
def test_solvers_score_their_answers_and_the_proposer_the_learnability(answers, proposer):
    g = game()
    g.reset(0)
    assert g.current_player == 0 and g.roles == ["proposer"] + ["solver"] * 4
    results = play(g, ["I propose [3 4 5 -> 17]", *answers])
    assert [g_.terminated for g_ in results] == [False] * 4 + [True] and not any(r.invalid for r in results)
    assert all(r.rewards == [0.0] * 5 for r in results[:-1])  # everything is paid at the end
    assert results[-1].rewards == [proposer, *(1.0 if a == RIGHT else 0.0 for a in answers)]
    assert results[-1].info["solve_rate"] == answers.count(RIGHT) / 4


def test_a_solver_may_use_fewer_numbers_and_only_the_given_ones():
    g = game(solvers=3)
    g.reset(0)
    results = play(g, ["[3 4 5 -> 12]", "[3 * 4]", "[12]", "[3 * 4 * 5 / 5]"])  # 12 is not given; 5 used twice
    assert results[-1].rewards == pytest.approx([1 - 1 / 3, 1.0, 0.0, 0.0])


@pytest.mark.parametrize("proposal,reason", [
    ("[3 4 -> 50]", "cannot be reached"), ("[3 4 5 -> 51]", "target from 1 to 50"),
    ("[11 2 -> 13]", "numbers from 1 to 10"), ("[0 2 -> 2]", "numbers from 1 to 10"),
    ("[1 2 3 4 5 -> 3]", "a task like"), ("[7 -> 7]", "a task like"), ("3 4 5 -> 17", "a task like"),
    ("[3 4 5 17]", "a task like"), ("[3 4 5 -> --17]", "a task like")])
def test_an_invalid_proposal_ends_the_episode_with_the_penalty(proposal, reason):
    g = game()
    g.reset(0)
    result = g.step(proposal)
    assert result.invalid and result.terminated and result.info["forfeit"] == 0 and reason in result.info["reason"]
    assert result.rewards == [-0.5, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(RuntimeError, match="finished game"):  # no solver moves
        g.step(RIGHT)


def test_a_retried_proposal_is_told_why_and_changes_nothing():
    g = game(max_retries=1)
    g.reset(0)
    before = g.observation(0)
    retried = g.step("[3 4 -> 50]")
    assert retried.invalid and not retried.terminated and g.current_player == 0
    assert "cannot be reached" in g.observation(0) and g.observation(0).endswith(before)
    assert not g.step("[3 4 -> 7]").invalid and g.current_player == 1


def test_an_unreadable_answer_forfeits_that_solver_only():
    g = game()
    g.reset(0)
    play(g, ["[3 4 5 -> 17]", RIGHT])
    forfeit = g.step("I give up")
    assert forfeit.invalid and not forfeit.terminated and forfeit.info["forfeit"] == 2
    assert forfeit.rewards == [0.0, 0.0, -0.5, 0.0, 0.0] and g.current_player == 3
    assert g.step(RIGHT).rewards == [0.0] * 5
    last = g.step("[17]")  # a wrong answer, not an invalid one
    assert last.terminated and not last.invalid and last.rewards == [0.5, 1.0, 0.0, 1.0, 0.0]  # 2 of 4 solved


def test_a_solver_sees_the_task_and_never_another_solvers_answer():
    g = game(solvers=3)
    g.reset(0)
    g.step("[3 4 5 -> 17]")
    prompts = []
    for seat, answer in zip((1, 2, 3), ("[(3 * 4) + 5] first", "[5 + (4 * 3)] second", "[3 + 4 + 5] third")):
        assert g.current_player == seat
        prompts.append(g.observation(seat))
        g.step(answer)
        assert all(word not in g.observation(s) for s in range(4) for word in ("first", "second", "third", "(4 * 3)"))
    assert prompts[0] == prompts[1] == prompts[2] and "Numbers: 3 4 5. Target: 17." in prompts[0]


def test_the_legal_moves_are_a_valid_task_and_well_formed_answers_and_the_expert_solves():
    for seed in range(20):
        g = game()
        g.reset(seed)
        proposal = g.legal_actions()[0]
        assert not g.step(proposal).invalid
        solution = parse_expression(g.expert_action()[1:-1])
        assert evaluate(solution) == g.target
        answers = g.legal_actions()  # well-formed answers of the task's numbers, right or wrong
        assert answers and all(parse_expression(a[1:-1]) is not None for a in answers)
        assert not any(numbers_used(parse_expression(a[1:-1])) - Counter(g.numbers) for a in answers)
        assert g.expert_action() is not None and not g.step(answers[0]).invalid


def test_reachable_is_exact_and_complete_for_two_numbers():
    found = reachable((3, 7))
    assert set(found) == {Fraction(3), Fraction(7), Fraction(10), Fraction(21), Fraction(4), Fraction(-4),
                          Fraction(3, 7), Fraction(7, 3)}
    assert all(evaluate(parse_expression(text)) == value for value, text in reachable((2, 5, 7, 9)).items())
    with pytest.raises(ValueError, match="1 to 4 numbers"):
        reachable((1, 2, 3, 4, 5))


def test_the_seed_decides_the_episode():
    def transcript(seed):
        buffer = TaskBuffer(8)
        for numbers, target in (([3, 4, 5], 17), ([2, 9], 18), ([1, 6, 8], 14)):
            buffer.record(numbers, target, 0.5)
        g = game(buffer=buffer, buffer_share=0.5)
        g.reset(seed)
        return [g.current_player, g.observation(0), g.observation(1), g.legal_actions()]

    runs = [transcript(seed) for seed in range(12)]
    assert runs == [transcript(seed) for seed in range(12)]
    assert len({str(r) for r in runs}) > 6 and {r[0] for r in runs} == {0, 1}  # proposed and replayed episodes


def test_a_buffered_task_is_replayed_to_the_solvers_only_and_recorded():
    buffer = TaskBuffer(8)
    buffer.record([3, 4, 5], 17, 1.0)
    g = game(buffer=buffer, buffer_share=1.0)
    g.reset(1)
    assert g.current_player == 1 and "no move" in g.observation(0)
    assert "Target: 17." in g.observation(1)
    results = play(g, [RIGHT, WRONG, WRONG, WRONG])
    assert results[-1].terminated and results[-1].rewards == [0.0, 1.0, 0.0, 0.0, 0.0]  # 0 < r < 1: still 0
    assert buffer.get([5, 4, 3], 17).solve_rates == [1.0, 0.25]


def test_valid_episodes_fill_the_buffer_and_show_it_to_the_proposer():
    buffer = TaskBuffer(8)
    g = game(buffer=buffer, buffer_share=0.0)
    g.reset(0)
    play(g, ["[3 4 5 -> 17]", RIGHT, WRONG, RIGHT, WRONG])
    g.reset(1)
    g.step("[3 4 -> 50]")  # invalid: not kept
    assert [(t.numbers, t.target, t.solve_rates) for t in buffer.tasks()] == [((3, 4, 5), 17, [0.5])]
    g.reset(2)
    assert "Earlier tasks:\n[3 4 5 -> 17] solved 50%" in g.observation(0)


def test_the_buffer_is_deduplicated_bounded_and_sampled():
    buffer = TaskBuffer(capacity=3, seed=0)
    buffer.record([3, 4, 5], 17, 0.0)
    buffer.record((5, 3, 4), 17, 1.0)  # the same task
    assert len(buffer) == 1 and buffer.get([4, 5, 3], 17).solve_rates == [0.0, 1.0]
    for target in (12, 7, 2):
        buffer.record([3, 4, 5], target, 0.5)
    assert [t.target for t in buffer.tasks()] == [12, 7, 2]  # the oldest went first
    drawn = buffer.sample(2, random.Random(5))
    assert len(drawn) == 2 and len({t.target for t in drawn}) == 2 and all(t in buffer.tasks() for t in drawn)
    assert sorted(t.target for t in buffer.sample(10)) == [2, 7, 12]
    assert buffer.sample(2, random.Random(5)) == drawn
    with pytest.raises(ValueError, match="solve rate"):
        buffer.record([3, 4], 7, 1.5)


def test_the_histogram_counts_tasks_by_mean_solve_rate():
    buffer = TaskBuffer(10)
    for target, rates in ((1, [0.0]), (2, [0.25, 0.35]), (5, [0.5]), (7, [1.0]), (12, [0.75, 1.0]), (6, [])):
        buffer.record([2, 3, 4], target)
        for rate in rates:
            buffer.record([2, 3, 4], target, rate)
    stats = buffer.statistics()
    assert stats["size"] == 6 and stats["unrated"] == 1
    assert stats["solve_rate_histogram"] == [1, 1, 1, 0, 2]
    assert stats["mean_solve_rate"] == pytest.approx((0.0 + 0.3 + 0.5 + 1.0 + 0.875) / 5)


def test_save_and_load_round_trip(tmp_path):
    buffer = TaskBuffer(10)
    buffer.record([3, 4, 5], 17, 0.5)
    buffer.record([2, 9], 18, 0.0)
    buffer.record([2, 9], 18, 0.25)
    path = str(tmp_path / "tasks.arrow")
    buffer.save(path)
    copy = TaskBuffer(10)
    assert copy.load(path) == {"loaded": 2, "skipped": 0}
    assert copy.to_table().equals(buffer.to_table()) and copy.statistics() == buffer.statistics()


def test_a_corrupt_file_is_a_clear_error_and_bad_rows_are_skipped(tmp_path):
    garbage = tmp_path / "garbage.arrow"
    garbage.write_bytes(b"\x00not arrow at all" * 10)
    with pytest.raises(ValueError, match="not a task buffer file"):
        TaskBuffer().load(str(garbage))
    wrong = tmp_path / "wrong.arrow"
    table = pa.table({"numbers": [[3, 4]], "target": ["7"], "solve_rates": [[0.5]]})
    with pa.OSFile(str(wrong), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(ValueError, match="its columns are"):
        TaskBuffer().load(str(wrong))
    with pytest.raises(ValueError, match="not a task buffer file"):
        TaskBuffer().load(str(tmp_path / "missing.arrow"))
    rows = pa.table({"numbers": [[3, 4], [3, 4], [7], [3, None], [3, 4], [3, 4, 5]],
                     "target": [7, 50, 7, 3, 12, 17],
                     "solve_rates": [[0.5], [0.5], [0.5], [0.5], [1.5], [float("nan")]]}, schema=SCHEMA)
    bad = tmp_path / "bad.arrow"
    with pa.OSFile(str(bad), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_table(rows)
    buffer = TaskBuffer()
    assert buffer.load(str(bad)) == {"loaded": 1, "skipped": 5}
    assert [(t.numbers, t.target) for t in buffer.tasks()] == [((3, 4), 7)]


def test_games_of_a_process_share_the_named_buffer():
    first, second = make("propose_solve", buffer="test-shared"), make("propose_solve", buffer="test-shared")
    assert first.buffer is second.buffer is shared_buffer("test-shared")
    assert make("propose_solve", buffer=None).buffer is None
    with pytest.raises(ValueError, match="holds 1024 tasks"):
        make("propose_solve", buffer="test-shared", buffer_capacity=5)
    with pytest.raises(ValueError, match="solvers must be 1 to 8"):
        ProposeSolve(solvers=9)


class CharCodec:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_an_episode_writes_rows_with_their_roles():
    answers = iter([RIGHT, WRONG, "[5 + 4 * 3]", "[4 * 5 - 3]"])  # 3 of 4 solve

    async def policy(prompt_ids, max_tokens, policy_id):
        prompt = CharCodec().decode(prompt_ids)
        text = "[3 4 5 -> 17]" if prompt.startswith("Propose") else next(answers)
        tokens = CharCodec().encode(text)
        return Completion(1, tokens, [-0.5] * len(tokens), [1] * len(tokens), True)

    g = game(max_new_tokens=24)
    settings = EpisodeSettings("propose_solve", max_new_tokens=8)
    rows, returns = trio.run(lambda: play_episode(g, ["main"] * 5, policy, CharCodec(), settings,
                                                  episode_id="e-0", seed=3, learner="main"))
    assert [r[Columns.ROLE] for r in rows] == ["proposer"] + ["solver"] * 4
    assert [r[Columns.AGENT] for r in rows] == [0, 1, 2, 3, 4]
    # the solvers are asked together (simultaneous_players), so which seat got which answer is the scheduler's
    assert returns[0] == 0.25 and sorted(returns[1:]) == [0.0, 1.0, 1.0, 1.0]
    assert [r[Columns.REWARD] for r in rows] == returns
    assert all(r[Columns.TERMINATED] for r in rows)


def test_the_solvers_of_a_task_are_asked_together():
    """Once the task is set every solver still to answer may be asked at once: none sees another's answer."""
    from envs.registry import make

    game = make("propose_solve", solvers=3, buffer=None)
    game.reset(1)
    assert game.simultaneous_players() == []  # the proposer first
    game.step("[3 4 5 -> 17]")
    assert game.simultaneous_players() == [1, 2, 3]
    game.step("[(3 * 4) + 5]")
    assert game.simultaneous_players() == [2, 3]


def test_a_task_the_buffer_holds_earns_the_proposer_only_repeat_reward():
    """Learnability pays for new tasks: proposing one the buffer already holds earns repeat_reward times it."""
    buffer = TaskBuffer(capacity=16)
    for repeat_reward, expected in [(0.0, [0.5, 0.0]), (0.5, [0.5, 0.25])]:
        buffer = TaskBuffer(capacity=16)
        rewards = []
        for _ in range(2):
            g = ProposeSolve(solvers=2, buffer=buffer, buffer_share=0.0, repeat_reward=repeat_reward)
            g.reset(0)
            g.step("[3 4 5 -> 17]")
            g.step("[(3 * 4) + 5]")
            result = g.step("[3 + 4]")
            rewards.append(result.rewards[0])
        assert rewards == expected and result.info["novel"] is False


def targets_of(numbers, max_target=50):
    return sorted(int(v) for v in reachable(tuple(sorted(numbers))) if v.denominator == 1 and 1 <= v <= max_target)


def test_dealt_numbers_come_from_the_seed_and_the_proposer_writes_only_a_target():
    deals = {}
    for seed in range(40):
        g = game(deal_numbers=True)
        g.reset(seed)
        again = game(deal_numbers=True)
        again.reset(seed)
        assert g.dealt == again.dealt and g.legal_actions() == again.legal_actions()  # the seed decides
        assert 2 <= len(g.dealt) <= 4 and all(1 <= n <= 10 for n in g.dealt) and targets_of(g.dealt)
        assert f"Numbers: {' '.join(map(str, g.dealt))}." in g.observation(0) and g.observation(0).endswith("Target:")
        deals[seed] = (g.dealt, g.legal_actions()[0])
        assert not g.step(g.legal_actions()[0]).invalid and g.numbers == g.dealt  # a legal target sets the task
        assert g.target == int(deals[seed][1][1:-1]) and f"Numbers: {' '.join(map(str, g.dealt))}." in g.observation(1)
        assert evaluate(parse_expression(g.expert_action()[1:-1])) == g.target
    assert len({d for d, _ in deals.values()}) > 30 and len({t for _, t in deals.values()}) > 15  # diverse tasks


def test_a_dealt_task_is_scored_like_a_proposed_one():
    g = game(deal_numbers=True, solvers=2)
    g.reset(7)
    target = targets_of(g.dealt)[-1]
    right = reachable(tuple(sorted(g.dealt)))[Fraction(target)]
    results = play(g, [f"the target is [{target}]", f"[{right}]", "[1]"])
    assert results[-1].terminated and results[-1].rewards == [0.5, 1.0, 0.0]
    assert results[-1].info["task"] == f"[{' '.join(map(str, g.dealt))} -> {target}]"


@pytest.mark.parametrize("move,reason", [
    ("[3 4 5 -> 17]", "a target like [17]"), ("17", "a target like [17]"), ("[-3]", "a target like [17]"),
    ("[0]", "a target from 1 to 50"), ("[51]", "a target from 1 to 50"), ("unreachable", "cannot be reached")])
def test_an_invalid_target_for_dealt_numbers_ends_the_episode(move, reason):
    g = game(deal_numbers=True)
    g.reset(3)
    if move == "unreachable":
        move = f"[{next(t for t in range(1, 51) if t not in targets_of(g.dealt))}]"
    result = g.step(move)
    assert result.invalid and result.terminated and reason in result.info["reason"]
    assert result.rewards == [-0.5, 0.0, 0.0, 0.0, 0.0] and g.numbers is None


def test_with_dealt_numbers_a_repeat_pays_its_full_learnability():
    """A repeat is the deal's doing when the env picks the numbers: repeat_reward applies only to chosen numbers."""
    buffer, rewards = TaskBuffer(capacity=16), []
    for _ in range(2):
        g = ProposeSolve(solvers=2, buffer=buffer, buffer_share=0.0, repeat_reward=0.0, deal_numbers=True)
        g.reset(11)
        target = next(t for t in targets_of(g.dealt) if t not in g.dealt)
        g.step(f"[{target}]")
        g.step(f"[{reachable(tuple(sorted(g.dealt)))[Fraction(target)]}]")
        result = g.step("[1000]")
        rewards.append(result.rewards[0])
    assert rewards == [0.5, 0.5] and result.info["novel"] is False and len(buffer) == 1


def test_a_replayed_episode_deals_nothing_and_deal_numbers_must_be_a_bool():
    buffer = TaskBuffer(8)
    buffer.record([3, 4, 5], 17, 0.5)
    g = game(buffer=buffer, buffer_share=1.0, deal_numbers=True)
    g.reset(0)
    assert g.dealt is None and g.current_player == 1 and g.numbers is not None
    with pytest.raises(ValueError, match="deal_numbers must be true or false"):
        ProposeSolve(deal_numbers="yes")


@pytest.mark.parametrize("deal_numbers", [False, True])
def test_a_target_that_is_one_of_the_numbers_earns_the_proposer_nothing(deal_numbers):
    """No arithmetic is needed to reach it: it is valid, the solvers are scored, and the proposer gets 0."""
    g = game(solvers=2, deal_numbers=deal_numbers)
    g.reset(5)
    numbers = g.dealt or (3, 4, 5)
    proposal = f"[{numbers[0]}]" if deal_numbers else f"[3 4 5 -> {numbers[0]}]"
    results = play(g, [proposal, f"[{numbers[0]}]", "[1000]"])
    assert not any(r.invalid for r in results) and results[-1].rewards == [0.0, 1.0, 0.0]
    assert results[-1].info["trivial"] and results[-1].info["solve_rate"] == 0.5


@pytest.mark.parametrize("deal_numbers", [False, True])
def test_with_copy_target_invalid_a_target_that_is_one_of_the_numbers_is_a_forfeit(deal_numbers):
    """``copy_target=invalid``: a task must need arithmetic; the proposer's forfeit ends the episode, and the
    legal proposals (the warm-up's) never copy a number."""
    g = game(solvers=2, deal_numbers=deal_numbers, copy_target="invalid")
    g.reset(5)
    numbers = g.dealt or (3, 4, 5)
    proposal = f"[{numbers[0]}]" if deal_numbers else f"[3 4 5 -> {numbers[0]}]"
    result = g.step(proposal)
    assert result.invalid and "is one of the numbers" in result.info["reason"]
    for seed in range(50):
        g.reset(seed)
        g.step(g.legal_actions()[0])
        assert g.turn == 1 and g.target not in g.numbers
    with pytest.raises(ValueError, match="copy_target must be one of unpaid, invalid"):
        ProposeSolve(copy_target="free")


def test_task_kinds_name_what_a_task_asks():
    assert [task_kind(n, t) for n, t in [((3, 4, 5), 4), ((3, 4, 5), 9), ((3, 4, 5), 20), ((3, 4, 5), 1),
                                         ((3, 4, 5), 17), ((2, 4), 2)]] == ["copy", "a+b", "a*b", "a-b", "other",
                                                                           "copy"]


def test_with_balance_kinds_a_kind_past_its_fair_share_pays_less():
    """The proposer's learnability is scaled by a fair share (a quarter) over its kind's share of the recent
    proposals, one of each kind counted besides: the first task's kind has a share of 2 in 6, and once three of
    four recent tasks were `a * b`, 4 in 9."""
    buffer = TaskBuffer(capacity=16)

    def proposer_reward(task: str, answers: list[str]) -> float:
        g = ProposeSolve(solvers=2, buffer=buffer, buffer_share=0.0, balance_kinds=True)
        g.reset(0)
        return play(g, [task, *answers])[-1].rewards[0]

    assert kind_balance(0, 0) == kind_balance(1, 10) == 1.0 and kind_balance(7, 11) == 0.5
    assert proposer_reward("[3 4 5 -> 9]", ["[3 + 4]", "[4 + 5]"]) == pytest.approx(0.5 * 0.25 / (2 / 6))
    for task in ["[3 4 5 -> 12]", "[2 4 5 -> 20]"]:
        proposer_reward(task, ["[3 * 4]", "[4 * 5]"])
    assert buffer.statistics()["recent_kinds"] == {"a*b": 2, "a+b": 1}
    assert proposer_reward("[2 3 5 -> 15]", ["[3 * 5]", "[2]"]) == pytest.approx(0.5 * 0.25 / (4 / 9))
    assert proposer_reward("[2 3 5 -> 2]", ["[2]", "[3]"]) == 0.0  # a copy: unpaid, and counted
    assert buffer.recent_kinds() == {"a*b": 3, "a+b": 1, "copy": 1}
    with pytest.raises(ValueError, match="balance_kinds .* needs a buffer"):
        ProposeSolve(balance_kinds=True, buffer=None)


def test_the_benchmarks_answer_forms_account_for_every_held_out_task(tiny_model_dir):
    """``role_selfplay.py --answers``: every task's answer is right, wrong, unreadable or of other numbers, and
    the tasks by kind add up to the set."""
    import ast
    import re

    from research.role_selfplay import answer_forms, heldout_tasks

    text = answer_forms(tiny_model_dir, heldout_tasks(12))
    verdicts = ast.literal_eval(re.search(r"answers: (\{.*?\});", text)[1])
    assert set(verdicts) <= {"right", "wrong", "unreadable", "other numbers"} and sum(verdicts.values()) == 12
    kinds = re.findall(r"(\w[\w+*-]*) (\d+)/(\d+)", text.split("right by kind: ")[1])
    assert sum(int(n) for *_, n in kinds) == 12 and all(int(r) <= int(n) for _, r, n in kinds)
    assert sum(int(r) for _, r, _ in kinds) == verdicts.get("right", 0)


def test_the_recipes_config_makes_a_typed_game_whose_legal_moves_are_valid():
    """configs/env/propose_solve.yaml as +recipe=propose_solve loads it: the game it makes draws each form of its
    ``forms`` and accepts its own legal proposal."""
    from actors.cli import load_config

    cfg = load_config(["+recipe=propose_solve"])
    args = {**cfg.env.args.env_args, "buffer": None}
    assert (args["deal_numbers"], args["witness"]) == (True, "typed") and cfg.learner.args.objective.advantage == "role_grpo"
    drawn = set()
    for seed in range(40):
        g = make("propose_solve", invalid_penalty=cfg.env.args.invalid_penalty, max_retries=0, **args)
        g.reset(seed)
        drawn.add(g.task_type)
        assert not g.step(g.legal_actions()[0]).invalid
    assert drawn == set(args["forms"]) == {"copy", "a+b", "a-b", "a*b"}


def test_the_benchmarks_proposal_validity_counts_every_deal_with_and_without_stored_tasks(tiny_model_dir):
    """``role_selfplay.py --proposals``: each deal's form is counted once a part, and no more are valid than drawn."""
    import re

    from research.role_selfplay import proposal_validity

    text = proposal_validity(tiny_model_dir, episodes=8)
    parts = text.split("; ")
    assert [p.split(": ")[0].split(", ")[-1] for p in parts] == ["without stored tasks", "with stored tasks"], text
    for part in parts:
        counts = [(form, int(v), int(n)) for form, v, n in re.findall(r"(copy|a[+*-]b) (\d+)/(\d+)", part)]
        assert sum(n for *_, n in counts) == 8 and all(v <= n for _, v, n in counts), part


def test_with_dealt_tasks_the_proposer_sits_out_and_the_solvers_answer_the_seed_s_task():
    tasks = set()
    for seed in range(30):
        g, again = game(deal_tasks=True, solvers=2), game(deal_tasks=True, solvers=2)
        g.reset(seed)
        again.reset(seed)
        assert (g.numbers, g.target) == (again.numbers, again.target) and g.current_player == 1  # the seed decides
        assert g.target in targets_of(g.numbers) and "was dealt: you have no move" in g.observation(0)
        tasks.add((g.numbers, g.target))
        right = g.expert_action()
        results = play(g, [right, "[1000]"])
        assert results[-1].terminated and results[-1].rewards == [0.0, 1.0, 0.0]  # learnable, yet unpaid
    assert len(tasks) > 20
    with pytest.raises(ValueError, match="deal_numbers must then be false"):
        ProposeSolve(deal_tasks=True, deal_numbers=True)
    with pytest.raises(ValueError, match="deal_tasks must be true or false"):
        ProposeSolve(deal_tasks="yes")


def test_a_typed_witness_draws_a_form_and_the_env_computes_the_target_of_the_proposers_expression():
    forms = Counter()
    for seed in range(60):
        g, again = game(deal_numbers=True, witness="typed"), game(deal_numbers=True, witness="typed")
        g.reset(seed)
        again.reset(seed)
        assert (g.dealt, g.form, g.legal_actions()) == (again.dealt, again.form, again.legal_actions())  # the seed
        assert g.form in DRAWN and witnesses(g.dealt, g.form, 50) and SHOWN[g.form] in g.observation(0)
        forms[g.form] += 1
        move = g.legal_actions()[0]
        expression = parse_expression(move[1:-1])
        assert form_of(expression) == g.form
        result = g.step(f"here it is: {move}")
        assert not result.invalid and (g.numbers, g.target) == (tuple(sorted(g.dealt)), evaluate(expression))
        assert f"Numbers: {' '.join(map(str, sorted(g.dealt)))}. Target: {g.target}." in g.observation(1)
        assert "[" not in g.observation(1).split("Target:")[0]  # the solver never sees the witness
    assert set(forms) == set(DRAWN) and min(forms.values()) >= 6  # each drawn (evenly: 15 of 60 expected)


def test_the_forms_drawn_are_the_configs_and_each_is_the_episodes_task_type():
    forms = Counter()
    for seed in range(40):
        g = game(deal_numbers=True, witness="typed", forms=["copy", "a*b"])  # a list, as Hydra passes it
        g.reset(seed)
        assert g.task_type == g.form and g.form in ("copy", "a*b")
        forms[g.form] += 1
        move = g.legal_actions()[0]
        assert form_of(parse_expression(move[1:-1])) == g.form and not g.step(move).invalid
    assert set(forms) == {"copy", "a*b"}
    g = game(deal_numbers=True, witness="typed", forms=["copy"])
    g.reset(0)
    assert g.step(f"[{g.dealt[0]}]").invalid is False and g.target == g.dealt[0]  # a copy: valid, unpaid
    assert [game(**kwargs).task_type for kwargs in ({}, {"deal_numbers": True, "witness": "free"})] == ["", ""]
    for forms in ([], ["a+b", "a+b"], ["a/b"]):
        with pytest.raises(ValueError, match="forms must be distinct forms of copy, a\\+b"):
            game(deal_numbers=True, witness="typed", forms=forms)


def test_a_typed_episodes_rows_carry_its_task_type_in_the_matchup_so_the_proposers_baseline_is_per_form():
    async def policy(prompt_ids, max_tokens, policy_id):
        prompt = CharCodec().decode(prompt_ids)
        numbers = prompt.split("Numbers: ")[1].split(".")[0].split()
        text = f"[{numbers[0]} * {numbers[1]}]" if prompt.startswith("Set") else "[1]"
        tokens = CharCodec().encode(text)
        return Completion(1, tokens, [-0.5] * len(tokens), [1] * len(tokens), True)

    g = game(deal_numbers=True, witness="typed", forms=["a*b"], solvers=2, max_new_tokens=24)
    rows, _ = trio.run(lambda: play_episode(g, ["main"] * 3, policy, CharCodec(), EpisodeSettings("propose_solve", max_new_tokens=24),
                                            episode_id="e-0", seed=3, learner="main"))
    assert [r[Columns.ROLE] for r in rows] == ["proposer", "solver", "solver"] and not rows[0][Columns.INVALID_ACTION]
    assert {r[Columns.MATCHUP] for r in rows} == {"main,main,main/a*b"}


def test_a_witness_of_another_form_or_numbers_not_dealt_or_an_out_of_range_value_is_a_forfeit():
    g = game(deal_numbers=True, witness="typed")
    for seed in range(100):
        g.reset(seed)
        if g.form == "a*b":
            break
    a, b = sorted(g.dealt)[-2:]
    not_dealt = next(n for n in range(1, 11) if n not in g.dealt)
    for move, reason in ((f"[{a} + {b}]", "multiplies two of them"), (f"[{a} * {not_dealt}]", "each at most once"),
                         (f"[{a}]", "multiplies two of them"), ("[a * b]", "an expression of the numbers"),
                         (f"[{a} * {a} * {a} * {a}]", "each at most once")):
        g.reset(seed)
        result = g.step(move)
        assert result.invalid and result.terminated and reason in result.info["reason"], (move, result.info)
        assert g.numbers is None
    free = game(deal_numbers=True, witness="free", max_target=5)
    free.reset(seed)
    assert free.step(f"[{free.dealt[0]}]").info["reason"] == "an expression that has at least one operation"
    free.reset(seed)
    low, high = sorted(free.dealt[:2])
    assert free.step(f"[{low} - {high}]").info["reason"].endswith("a whole number from 1 to 5")  # 0 or less
    with pytest.raises(ValueError, match="deal_numbers must then be true"):
        ProposeSolve(witness="free")
    with pytest.raises(ValueError, match="witness must be one of"):
        ProposeSolve(deal_numbers=True, witness="yes")


def test_witnesses_of_each_form_reach_whole_targets_in_range():
    assert witnesses((3, 4), "a-b", 50) == ["4 - 3"] and witnesses((3, 4), "a*b", 10) == []
    assert witnesses((4, 3, 4), "copy", 50) == ["3", "4"] and witnesses((4, 60), "copy", 50) == ["4"]
    assert "8 / 4" in witnesses((4, 8, 2), "other", 50) and "4 / 8" not in witnesses((4, 8, 2), "other", 50)
    for form in FORMS:
        for text in witnesses((2, 5, 7, 9), form, 50):
            value = evaluate(parse_expression(text))
            assert form_of(parse_expression(text)) == form and value.denominator == 1 and 1 <= value <= 50
    with pytest.raises(ValueError, match="form must be one of"):
        witnesses((3, 4), "a^b", 50)


def test_free_witnesses_are_dealt_numbers_that_allow_some_operation_even_with_a_small_max_target():
    for seed in range(40):  # with max_target 3 many deals reach only a copy, (3, 8) -> 3: they are dealt again
        g = game(deal_numbers=True, witness="free", max_target=3)
        g.reset(seed)
        move = g.legal_actions()[0]
        assert form_of(parse_expression(move[1:-1])) != "copy" and not g.step(move).invalid


def test_the_benchmarks_held_out_filter_sees_every_task_set_in_the_run_not_only_the_buffers(tmp_path):
    """``seen_tasks``: a task the buffer pushed out early still counts as set (it is in the episode dataset), read
    back from the solvers' prompts as the game writes them; a run without its dataset is refused by name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from research.role_selfplay import heldout_tasks, seen_tasks, solver_task
    from envs.task_buffer import TaskBuffer

    held = heldout_tasks(4)
    with pytest.raises(FileNotFoundError, match="run.dataset=true"):
        seen_tasks(tmp_path)
    prompts, roles = [], []
    for numbers, target in held[:3]:  # the solvers' prompts of three tasks, and a proposer's that names no task
        g = ProposeSolve(solvers=2, buffer=None)
        g.reset(0)
        g.numbers, g.target, g.turn = tuple(reversed(numbers)), target, 1  # as a run's solvers see it
        prompts += [g.observation(1), g.observation(0)]
        roles += ["solver", "proposer"]
    batches = tmp_path / "episodes" / "life" / "main"
    batches.mkdir(parents=True)
    pq.write_table(pa.table({"role": roles, "prompt_text": prompts}), batches / "b.parquet")
    buffer = TaskBuffer(capacity=1)  # the buffer kept the last task only
    for numbers, target in held[2:]:
        buffer.record(numbers, target, 0.5)
    (tmp_path / "tasks").mkdir()
    buffer.save(tmp_path / "tasks" / "env-0.arrows")
    assert seen_tasks(tmp_path) == set(held) and solver_task(prompts[1]) is None


def test_a_reserved_task_is_never_dealt_and_a_proposal_of_one_ends_the_episode_unplayed(tmp_path):
    """``reserved`` (a benchmark's held-out set): dealt tasks avoid it; a typed proposal that lands on one is valid
    but never set (no solver answers, everyone 0, not stored); ``make`` reads the file a config names."""
    from envs.task_buffer import TaskBuffer

    dealt = {}
    for seed in range(60):
        g = game(deal_tasks=True, solvers=2)
        g.reset(seed)
        dealt[seed] = (tuple(sorted(g.numbers)), g.target)
    stored = TaskBuffer(capacity=100)
    for numbers, target in dealt.values():
        stored.record(numbers, target)
    stored.save(tmp_path / "heldout.arrows")
    for seed in range(60):
        g = game(deal_tasks=True, solvers=2, reserved=str(tmp_path / "heldout.arrows"))
        g.reset(seed)
        assert (tuple(sorted(g.numbers)), g.target) not in set(dealt.values())
    buffer = TaskBuffer(capacity=8)
    g = ProposeSolve(buffer=buffer, buffer_share=0.0, deal_numbers=True, witness="typed", forms=["a+b"], solvers=2)
    g.reset(3)
    move = g.legal_actions()[0]
    g.step(move)
    task = (tuple(sorted(g.numbers)), g.target)
    held = ProposeSolve(buffer=buffer, buffer_share=0.0, deal_numbers=True, witness="typed", forms=["a+b"], solvers=2,
                        reserved=[task])
    held.reset(3)
    result = held.step(move)
    assert result.terminated and not result.invalid and result.rewards == [0.0, 0.0, 0.0] and result.info["reserved"]
    assert held.done and buffer.get(*task) is None  # the solvers never saw it, and the buffer never held it
    every = [((1,) * n, t) for n in (2, 3, 4) for t in range(1, 5)]  # all the tasks of ones up to 4
    with pytest.raises(ValueError, match="reached only reserved targets"):
        ProposeSolve(deal_tasks=True, max_number=1, max_target=4, buffer=None, reserved=every)


def test_a_reserved_tasks_file_that_holds_a_non_task_is_refused_by_name(tmp_path):
    import pyarrow as pa

    from envs.task_buffer import SCHEMA, reserved_tasks

    path = tmp_path / "bad.arrows"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
        rows = {"numbers": [[1, 2], [3]], "target": [3, 9], "solve_rates": [[], []]}  # [3 -> 9] is no task
        writer.write_table(pa.table(rows, schema=SCHEMA))
    with pytest.raises(ValueError, match="a reserved task must be a task"):
        reserved_tasks(str(path))
    (tmp_path / "text.arrows").write_text("1 2 -> 3")
    with pytest.raises(ValueError, match="is not a task buffer file"):
        reserved_tasks(str(tmp_path / "text.arrows"))
