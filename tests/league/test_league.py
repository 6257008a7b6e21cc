"""The league's pure parts: PFSP weightings, payoff, matchmaking by role, the snapshot rule, match messages,
immutable snapshots, and the LeagueActor's assignments, ratings and state on disk (no loop, no sockets)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from actors.league.actor import LeagueActor, LeagueConfig
from actors.league.matchmaking import MatchmakingConfig, Payoff, check_reset_probabilities, choose_opponent, \
    pairwise_scores, pfsp_probabilities, pfsp_weight, reset_after_snapshot, seat_match, snapshot_due
from actors.models.snapshots import SnapshotError, parse_snapshot_id, snapshot_id, verify_snapshot, write_snapshot
from streams.messages import MatchAssigned, MatchRequest, MatchResult
from streams.wire import FrameError, pack
from tests.factories import FakeCluster

MEMBERS = [{"id": "main", "role": "main"}, {"id": "exploiter", "role": "main_exploiter"},
           {"id": "leaguex", "role": "league_exploiter"}]


# -- PFSP and payoff -----------------------------------------------------------------------------------------

def test_pfsp_weightings_by_hand():
    assert pfsp_weight(0.25, "hard") == pytest.approx(0.5625)  # (1 - 0.25)^2
    assert pfsp_weight(0.25, "variance") == pytest.approx(0.1875)  # 0.25 * 0.75
    assert pfsp_weight(0.25, "linear_capped") == pytest.approx(0.5)  # min(0.5, 0.75)
    assert pfsp_weight(0.8, "linear_capped") == pytest.approx(0.2)
    assert pfsp_weight(1.0, "hard") == 0.0 and pfsp_weight(0.0, "variance") == 0.0
    with pytest.raises(ValueError, match="unknown PFSP weighting 'squared'"):
        pfsp_weight(0.5, "squared")
    with pytest.raises(ValueError, match="win rate"):
        pfsp_weight(1.5, "hard")


def test_pfsp_probabilities_favour_the_opponents_the_weighting_asks_for():
    rates = {"strong": 0.1, "even": 0.5, "weak": 0.9}
    hard = pfsp_probabilities(rates, "hard")  # 0.81, 0.25, 0.01 normalised
    assert hard["strong"] == pytest.approx(0.81 / 1.07) and hard["strong"] > hard["even"] > hard["weak"]
    variance = pfsp_probabilities(rates, "variance")  # 0.09, 0.25, 0.09
    assert variance["even"] == pytest.approx(0.25 / 0.43) and variance["strong"] == pytest.approx(variance["weak"])
    assert pfsp_probabilities({"a": 1.0, "b": 1.0}, "hard") == {"a": 0.5, "b": 0.5}  # beats all: uniform


def test_payoff_decays_and_is_antisymmetric():
    payoff = Payoff(decay=0.5)
    assert payoff.win_rate("a", "b") == 0.5 and payoff.matrix(["a", "b"]) == [[None, None], [None, None]]
    payoff.add("a", "b", 1.0)  # a: 1 win in 1
    payoff.add("a", "b", 0.0)  # decayed: 0.5 wins in 0.5 + 1 games
    assert payoff.win_rate("a", "b") == pytest.approx(0.5 / 1.5)
    assert payoff.win_rate("b", "a") == pytest.approx(1.0 / 1.5)
    payoff.add("a", "b", 0.5)  # a draw counts half
    assert payoff.win_rate("a", "b") + payoff.win_rate("b", "a") == pytest.approx(1.0)
    again = Payoff.from_json(json.loads(json.dumps(payoff.to_json())))
    assert again.matrix(["a", "b"]) == payoff.matrix(["a", "b"])


def test_pairwise_scores_compare_the_learner_with_every_other_seat():
    assert pairwise_scores(["main", "random"], [2.0, -2.0], "main") == [("random", 1.0)]
    assert pairwise_scores(["x", "main", "y"], [1.0, 1.0, 3.0], "main") == [("x", 0.5), ("y", 0.0)]


# -- matchmaking by role ---------------------------------------------------------------------------------------

def draws(member, role, snapshots, payoff, n=4000, **kwargs):
    rng, cfg = random.Random(0), MatchmakingConfig(**kwargs)
    return Counter(choose_opponent(member, role, ["main"], snapshots, payoff, cfg, rng) for _ in range(n))


def test_main_agent_plays_itself_fixed_opponents_and_pfsp_over_snapshots():
    payoff = Payoff()
    for _ in range(10):
        payoff.add("main", "main-v5", 1.0)  # main always beats main-v5 ...
        payoff.add("main", "exploiter-v3", 0.0)  # ... and always loses to exploiter-v3
    counts = draws("main", "main", {"main-v5": "main", "exploiter-v3": "exploiter"}, payoff,
                   self_play=0.3, fixed=0.2, fixed_opponents=["random"])
    assert counts["main"] / 4000 == pytest.approx(0.3, abs=0.03)
    assert counts["random"] / 4000 == pytest.approx(0.2, abs=0.03)
    assert counts["exploiter-v3"] / 4000 == pytest.approx(0.5, abs=0.03)  # hard: the one it beats gets ~0
    assert counts["main-v5"] < 40
    before_snapshots = draws("main", "main", {}, Payoff(), self_play=0.3, fixed=0.2)
    assert set(before_snapshots) == {"main", "random"} and before_snapshots["random"] / 4000 == pytest.approx(0.2, abs=0.03)


def test_main_exploiter_plays_the_live_main_until_it_loses_too_often_then_its_snapshots():
    payoff = Payoff()
    snapshots = {"main-v5": "main", "main-v9": "main", "leaguex-v2": "leaguex"}
    assert set(draws("exploiter", "main_exploiter", snapshots, payoff, n=200)) == {"main"}  # 0.5 >= floor
    for _ in range(30):
        payoff.add("exploiter", "main", 0.0)
    payoff.add("exploiter", "main-v5", 1.0)  # beats v5: variance weight 0 -> v9 only
    assert set(draws("exploiter", "main_exploiter", snapshots, payoff, n=200)) == {"main-v9"}


def test_league_exploiter_plays_pfsp_over_all_snapshots_or_the_mains_before_any():
    assert set(draws("leaguex", "league_exploiter", {}, Payoff(), n=100)) == {"main"}
    snapshots = {"main-v5": "main", "exploiter-v3": "exploiter"}
    assert set(draws("leaguex", "league_exploiter", snapshots, Payoff(), n=400)) == set(snapshots)


def test_seats_put_the_learner_in_every_seat_in_turn_and_fill_the_others():
    rng = random.Random(1)
    seats = [tuple(seat_match("main", "random", 2, rng)) for _ in range(400)]
    assert set(seats) == {("main", "random"), ("random", "main")}
    assert seat_match("main", "main", 3, rng) == ["main"] * 3
    many = iter(["a", "b", "c"])
    four = seat_match("main", "x", 5, rng, choose_more=lambda: next(many))
    assert sorted(four) == sorted(["main", "x", "a", "b", "c"])


def test_snapshot_rule_every_n_versions_or_on_a_win_rate():
    rule = dict(every_versions=10, min_versions=3, win_rate_threshold=0.7)
    assert snapshot_due(10, None, None, **rule) and not snapshot_due(9, None, None, **rule)
    assert snapshot_due(25, 15, None, **rule) and not snapshot_due(24, 15, 0.6, **rule)
    assert snapshot_due(18, 15, 0.75, **rule)  # strong enough, 3 versions on
    assert not snapshot_due(17, 15, 0.9, **rule)  # too soon after the last
    assert not snapshot_due(18, 15, 0.75, every_versions=10, min_versions=3, win_rate_threshold=None)


# -- messages --------------------------------------------------------------------------------------------------

def test_match_messages_round_trip_and_bad_ones_are_named():
    request = MatchRequest(3, "tcp://127.0.0.1:5000", ["main", "exploiter"])
    assert MatchRequest.from_body(request.to_body()) == request
    match = MatchAssigned(3, 17, "main", ["main-v4", "main"])
    assert MatchAssigned.from_body(match.to_body()) == match
    result = MatchResult(17, "main", ["main-v4", "main"], [-1.0, 1.0])
    assert MatchResult.from_body(result.to_body()) == result
    with pytest.raises(FrameError, match="holds no seat"):
        MatchAssigned.from_body(MatchAssigned(3, 17, "main", ["random", "random"]).to_body())
    with pytest.raises(FrameError, match="one number per seat"):
        MatchResult.from_body(pack({"match": 1, "learner": "m", "seats": ["m", "r"], "returns": [1.0], "errored": False}))
    with pytest.raises(FrameError, match="list of at most"):
        MatchRequest.from_body(pack({"id": 1, "reply_to": "tcp://127.0.0.1:1", "open": "main"}))


# -- snapshots -------------------------------------------------------------------------------------------------

def test_snapshot_ids_parse_back_to_member_and_version():
    assert parse_snapshot_id(snapshot_id("main", 12)) == ("main", 12)
    assert parse_snapshot_id("league_x2-v3") == ("league_x2", 3)
    assert parse_snapshot_id("main") is None and parse_snapshot_id("random") is None
    assert parse_snapshot_id("../etc-v1") is None  # never a path


def test_a_snapshot_is_written_once_checked_and_never_overwritten(tiny_model_dir, tmp_path):
    from actors.models.base_model import load_policy

    model, tokenizer = load_policy(tiny_model_dir)
    path = write_snapshot(model, tokenizer, tmp_path / "main-v3")
    assert verify_snapshot(path) == path and not (tmp_path / "main-v3.partial").exists()
    with pytest.raises(FileExistsError, match="never overwritten"):
        write_snapshot(model, tokenizer, path)
    weights = next(p for p in path.iterdir() if p.suffix == ".safetensors")
    weights.chmod(0o644)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="does not match its checksum"):
        verify_snapshot(path)
    with pytest.raises(SnapshotError, match="not a snapshot"):
        verify_snapshot(tmp_path / "main-v9")


# -- the league actor's logic ---------------------------------------------------------------------------------

def league(tmp_path, **kwargs) -> LeagueActor:
    return LeagueActor(LeagueConfig(members=MEMBERS, state_dir=str(tmp_path), snapshot_every_versions=10,
                                    history_every_matches=2, **kwargs))


def test_league_config_names_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="role 'captain'"):
        LeagueConfig(members=[{"id": "main", "role": "captain"}], state_dir=str(tmp_path))
    with pytest.raises(ValueError, match="fixed opponent's name"):
        LeagueConfig(members=[{"id": "random", "role": "main"}], state_dir=str(tmp_path))
    with pytest.raises(ValueError, match="at least one member with role 'main'"):
        LeagueConfig(members=[{"id": "x", "role": "league_exploiter"}], state_dir=str(tmp_path))
    with pytest.raises(ValueError, match="unknown fixed opponents"):
        LeagueConfig(members=MEMBERS, state_dir=str(tmp_path), matchmaking={"fixed_opponents": ["oracle"]})


def test_assignments_go_to_open_members_and_results_move_payoff_and_ratings(tmp_path):
    actor = league(tmp_path)
    for i in range(50):
        match = actor.assign(MatchRequest(i, "tcp://127.0.0.1:1", ["exploiter"]))
        assert match.learner == "exploiter" and "exploiter" in match.seats and len(match.seats) == 2
    actor.record(MatchResult(0, "exploiter", ["exploiter", "main"], [2.0, -2.0]))
    actor.record(MatchResult(1, "exploiter", ["main", "exploiter"], [-1.0, 1.0]))
    actor.record(MatchResult(2, "main", ["main", "main"], [1.0, -1.0]))  # mirror: no rating news
    actor.record(MatchResult(3, "main", ["main", "random"], [0.0, 0.0], errored=True))
    table = actor.table()
    assert table["ratings"]["exploiter"]["mu"] > table["ratings"]["main"]["mu"]
    assert actor.payoff.win_rate("exploiter", "main") > 0.5
    assert (table["matches"], table["unrated_matches"], table["errored_matches"]) == (3, 1, 1)
    assert [h["matches"] for h in actor.history] == [2]


def test_snapshots_are_asked_for_once_and_join_only_when_their_checksums_hold(tiny_model_dir, tmp_path):
    from actors.models.base_model import load_policy

    actor = league(tmp_path)
    assert actor.observe({"main": 9, "exploiter": 3}) == {}
    assert actor.observe({"main": 10, "exploiter": 3}) == {"main": False}  # a main agent is never reset
    assert actor.observe({"main": 11}) == {}  # asked already; the learner is writing it
    assert not actor.add_snapshot("main-v10", "main", 10, str(tmp_path / "missing"))  # refused, asked again
    assert actor.observe({"main": 11}) == {"main": False}
    model, tokenizer = load_policy(tiny_model_dir)
    path = write_snapshot(model, tokenizer, tmp_path / "main-v11")
    assert actor.add_snapshot("main-v11", "main", 11, str(path))
    assert actor.observe({"main": 20}) == {} and actor.observe({"main": 21}) == {"main": False}
    with pytest.raises(ValueError, match="not a member"):
        actor.observe({"ghost": 3})
    opponents = {o for m in range(200) for o in actor.assign(MatchRequest(m, "tcp://127.0.0.1:1", ["leaguex"])).seats}
    assert "main-v11" in opponents  # the league exploiter now plays the snapshot


def test_league_state_survives_a_restart_with_its_ratings(tmp_path):
    actor = league(tmp_path)
    for i in range(7):
        actor.record(MatchResult(actor.assign(MatchRequest(i, "tcp://127.0.0.1:1", ["main"])).match_id, "main",
                                 ["main", "random"], [1.0, -1.0]))
    actor.save()
    saved = actor.table()
    again = league(tmp_path, resume=True)
    assert again.table()["ratings"] == saved["ratings"] and again.table()["matches"] == 7
    assert again.payoff.win_rate("main", "random") == actor.payoff.win_rate("main", "random")
    assert again.assign(MatchRequest(0, "tcp://127.0.0.1:1", ["main"])).match_id == 7  # ids go on
    with pytest.raises(FileNotFoundError, match="no league_state.json"):
        league(tmp_path / "elsewhere", resume=True)
    other = [{"id": "main", "role": "main"}]
    with pytest.raises(ValueError, match="saved league has members"):
        LeagueActor(LeagueConfig(members=other, state_dir=str(tmp_path), resume=True))



def test_a_restarted_league_replays_the_results_it_journaled_after_its_last_save(tmp_path):
    from actors.league.actor import JOURNAL_FILE

    actor = league(tmp_path)
    for i in range(10):
        if i == 7:
            actor.save()  # the last save before a kill: three results after it
        actor.record(MatchResult(i, "main", ["main", "random"] if i % 3 else ["random", "main"], [1.0, -1.0]))
    with open(tmp_path / JOURNAL_FILE, "a") as journal:
        journal.write('[10, "main", ["main", "ran')  # killed in the middle of a line
    again = league(tmp_path, resume=True)
    assert again.table()["matches"] == 10 and again.table()["ratings"] == actor.table()["ratings"]
    assert again.payoff.win_rate("main", "random") == actor.payoff.win_rate("main", "random")
    assert [h["matches"] for h in again.history] == [h["matches"] for h in actor.history]
    assert (tmp_path / JOURNAL_FILE).read_text().count("\n") == 10  # the torn line is cut off
    again.record(MatchResult(10, "main", ["main", "random"], [0.0, 0.0]))
    assert league(tmp_path, resume=True).table()["matches"] == 11
    assert league(tmp_path).table()["matches"] == 0 and not (tmp_path / JOURNAL_FILE).exists()  # a new league

def test_six_player_matches_seat_the_learner_once_and_draw_every_other_seat(tmp_path):
    actor = LeagueActor(LeagueConfig(members=MEMBERS[:1] + MEMBERS[2:], state_dir=str(tmp_path), players=6,
                                     matchmaking={"self_play": 0.0, "fixed": 1.0, "fixed_opponents": ["random"]}))
    for i in range(20):
        match = actor.assign(MatchRequest(i, "tcp://127.0.0.1:1", ["main"]))
        assert len(match.seats) == 6 and match.seats.count("main") == 1 and match.seats.count("random") == 5
    actor.record(MatchResult(0, "main", ["random", "main", "random", "random", "random", "random"],
                             [-1.0, 5.0, -1.0, -1.0, -1.0, -1.0]))
    assert actor.payoff.win_rate("main", "random") > 0.5 and set(actor.ratings) == {"main", "random"}


# -- exploiter resets --------------------------------------------------------------------------------------------

def test_exploiters_are_reset_after_a_snapshot_with_their_roles_probability():
    rng, probabilities = random.Random(0), {"main_exploiter": 1.0, "league_exploiter": 0.25}
    assert all(reset_after_snapshot("main_exploiter", probabilities, rng) for _ in range(100))
    assert not any(reset_after_snapshot("main", probabilities, rng) for _ in range(100))  # not listed: never
    resets = sum(reset_after_snapshot("league_exploiter", probabilities, rng) for _ in range(4000))
    assert resets / 4000 == pytest.approx(0.25, abs=0.03)
    before = rng.getstate()
    reset_after_snapshot("main_exploiter", probabilities, rng)  # certain: no draw spent
    assert rng.getstate() == before
    with pytest.raises(ValueError, match="'main' cannot be reset"):
        check_reset_probabilities({"main": 0.5})
    with pytest.raises(ValueError, match="must be in \\[0, 1\\], not 2"):
        check_reset_probabilities({"league_exploiter": 2})


def test_the_league_asks_an_exploiters_learner_to_reset_and_records_it_with_the_snapshot(tiny_model_dir, tmp_path):
    from actors.models.base_model import load_policy

    actor = league(tmp_path)  # the default: main exploiters always, league exploiters with 0.25
    assert actor.observe({"main": 10, "exploiter": 10}) == {"main": False, "exploiter": True}
    model, tokenizer = load_policy(tiny_model_dir)
    path = write_snapshot(model, tokenizer, tmp_path / "exploiter-v10")
    assert actor.add_snapshot("exploiter-v10", "exploiter", 10, str(path))
    assert actor.resets == [{"member": "exploiter", "snapshot": "exploiter-v10", "version": 10}]
    assert actor.statistics()["resets"] == 1 and actor.table()["resets"] == actor.resets
    actor.save()
    assert league(tmp_path, resume=True).resets == actor.resets
    off = league(tmp_path / "off", reset_after_snapshot={})
    assert off.observe({"exploiter": 10}) == {"exploiter": False}
    with pytest.raises(ValueError, match="reset_after_snapshot: 'coach' cannot be reset"):
        league(tmp_path, reset_after_snapshot={"coach": 1.0})


def test_a_learner_reset_brings_back_the_base_weights_and_a_fresh_optimizer_as_a_new_version(tiny_model_dir):
    import torch

    from actors.learner.actor import LearnerActor, LearnerConfig

    learner = LearnerActor(LearnerConfig(model_path=str(tiny_model_dir), policy_id="exploiter"))
    learner._load(None)
    model, optimizer = learner.trainer.model, learner.trainer.optimizer
    base = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()  # one step away from the base model
    optimizer.step()
    learner.version, learner.trainer.state.baselines = 7, {0: 0.3}
    assert optimizer.state and any(not torch.equal(base[k], v) for k, v in model.state_dict().items())
    learner._reset()
    assert all(torch.equal(base[k], v) for k, v in model.state_dict().items())
    assert not optimizer.state and learner.trainer.state.baselines == {}
    assert learner.version == 8 and learner.statistics()["resets"] == [8]  # the version goes on up


# -- restarts in a league run --------------------------------------------------------------------------------------


def test_a_league_run_restarts_every_kind_of_actor(tmp_path):
    import json

    from actors.cli import load_config
    from actors.league.actor import STATE_FILE
    from actors.runs.driver import Driver
    from actors.runs.evaluations import Evaluations
    from actors.runs.league_steward import LeagueSteward
    from actors.runs.recovery import GroupRecovery
    from actors.runs.topology import plan_groups, Topology

    cfg = load_config([f"run.dir={tmp_path}", "run.name=l", "league.members=[{id: main, role: main}]",
                       "run.restart_backoff_s=0"], "league")
    run = Driver(cfg)
    cluster = FakeCluster()
    top = Topology(plan_groups(cfg, "base", run.dir), envs=["env-0"], league="league",
                   snapshots=str(run.dir / "league" / "snapshots"))
    group = top.groups["main"]
    group.rollouts.append("rollout-main-0")
    run.cluster, run.top = cluster, top
    run.evaluations = Evaluations(cluster, top.envs, cfg.eval, ["main"], [])
    run.steward = LeagueSteward(cluster, top, run.dir, run.evaluations.results)
    run.steward.asked = {"main": False}
    run.recoveries = {"main": GroupRecovery(cluster, group, top.envs)}
    assert (group.learner, group.policy_dir) == ("learner-main", run.dir / "members" / "main" / "policy")
    assert run.recover("rollout-main-0", RuntimeError())["name"] == "rollout-main-0"
    assert ("env-0", "reissue") in cluster.calls  # its unanswered requests are sent again
    run.recover("learner-main", RuntimeError())  # no checkpoint yet: from the base model; replay rewinds
    assert cluster.restarted[-1] == ("learner-main", {"resume": False, "life": 1})  # a new life
    assert ("replay-main", "rewind", 5) in cluster.calls
    assert ("learner-main", "snapshot", str(run.dir / "league" / "snapshots"), False) in cluster.calls  # asked again

    run.training = True  # an env actor: admission per member counts what it delivered; it trains at once
    run.recover("env-0", RuntimeError())
    assert cluster.restarted[-1] == ("env-0", {"incarnation": 1, "started_before": {"main": 7}})
    assert ("env-0", "set_training", True) in cluster.calls

    run.recover("league", RuntimeError())  # died before its first save: a fresh league
    assert cluster.restarted[-1] == ("league", {"resume": False})
    (run.dir / "league").mkdir(parents=True)
    (run.dir / "league" / STATE_FILE).write_text(json.dumps(
        {"stats": {"matches": 10}, "snapshots": {"main-v2": {}}, "evaluations": [{"tag": "start-main-random"}]}))
    steward = run.steward
    steward.evaluations[:] = [{"tag": "start-main-random"}, {"tag": "during-1-main-random"}]
    steward.matches, steward.registered, cluster.calls = 14, {"main-v2", "main-v4"}, []
    run.recover("league", RuntimeError())  # from its saved state (and journal): 10 of 14 results came back
    assert cluster.restarted[-1] == ("league", {"resume": True})
    assert steward.results_lost == 4 and steward.matches == 10
    assert steward.registered == {"main-v2"}  # main-v4 is registered again at the next tick
    assert cluster.calls == [("league", "expect_snapshots", {"main": False}),
                             ("league", "record_evaluation", {"tag": "during-1-main-random"}),
                             ("env-0", "reissue_match_request")]
    assert run.restarts == {"rollout-main-0": 1, "learner-main": 1, "env-0": 1, "league": 2}


def test_a_league_run_with_restarts_off_ends_saying_how_to_resume(tmp_path):
    from actors.cli import load_config
    from actors.runs.driver import Driver

    run = Driver(load_config([f"run.dir={tmp_path}", "run.name=l", "run.restart=false"], "league"))
    with pytest.raises(RuntimeError, match="the league actor died .*run.restart is off.*`tidal league run resume="):
        run.recover("league", RuntimeError())
