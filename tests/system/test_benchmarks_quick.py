"""The asynchrony benchmarks' --quick modes: real runs end to end, and the last line the issue asks for."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RESEARCH = Path(__file__).resolve().parents[2] / "research"


def run(script: str, tmp_path, *args, folder: Path = BENCHMARKS) -> list[str]:
    done = subprocess.run([sys.executable, str(folder / script), "--quick", "--out", str(tmp_path), *args,
                           f"model.cache_dir={tmp_path / 'models'}"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()


@pytest.mark.timeout(600)
def test_staleness_quick(tmp_path):
    lines = run("staleness.py", tmp_path)
    assert re.fullmatch(r"decoupled_eta4_vs_eta0=[\d.]+ decoupled_min_final=[\d.]+ decoupled_min_final_any=[\d.]+ "
                        r"decoupled_guard_trips=\d+ naive_eta4_vs_eta0=[\d.]+ auto_vs_eta0=[\d.]+", lines[-1]), lines[-1]
    assert (tmp_path / "staleness.png").exists()
    # every run kept its bound: no trained token is older than eta (auto: than its ceiling, 4 by default)
    import json

    results = json.loads((tmp_path / "staleness.json").read_text())
    assert sorted((r["loss"], str(r["eta"])) for r in results) == [
        ("decoupled", "0"), ("decoupled", "4"), ("decoupled", "auto"), ("naive", "0"), ("naive", "4")]
    for result in results:
        assert max(int(k) for k in result["staleness"]) <= (4 if result["eta"] == "auto" else result["eta"])
    assert any(line.strip().startswith("decoupled eta=auto") for line in lines)  # the table's cell


@pytest.mark.slow  # about 70 s, the harness's output only: the suite measured 18:32 on 2 cores with it
@pytest.mark.timeout(600)
def test_async_vs_sync_quick(tmp_path):
    lines = run("async_vs_sync.py", tmp_path)
    assert re.fullmatch(r"speedup=[\d.]+ learner_busy=[\d.]+ eta=\d+ auto_vs_best=[\d.]+ auto_reached=[01]",
                        lines[-1]), lines[-1]
    assert all(any(line.startswith(f"eta={eta}:") for line in lines) for eta in (0, 2, "auto"))


@pytest.mark.slow  # about 70 s; leagues on Ray are tested in test_league.py: the suite measured 18:32 with it
@pytest.mark.ray
@pytest.mark.timeout(600)
def test_league_quick_on_ray(tmp_path, tiny_model_dir):
    """Three learning members and their snapshots on Kuhn Poker, every actor a Ray actor, streams on ZeroMQ."""
    import json

    lines = run("league.py", tmp_path, f"model.path={tiny_model_dir}")
    last = re.fullmatch(r"members=3 snapshots=(\d+) matches=(\d+) main_exploitability=([\d.]+) "
                        r"main_vs_random=([\d.]+)", lines[-1])
    assert last, lines[-1]
    assert int(last[1]) >= 1 and int(last[2]) > 0
    report = json.loads((tmp_path / "league.json").read_text())
    assert report["snapshots_played"]  # snapshots were served from disk by rollout actors and played
    assert 0 <= report["main_nash_conv"] <= 3 and len(report["main_policy"]) == 12  # every information state
    assert set(report["exact_vs_random"]) == {"base", "main"}
    average = report["main_snapshots_average_nash_conv"]  # None when the main agent had no snapshot yet
    assert average is None or 0 <= average <= 3
    assert all(0 <= v["win_rate"] <= 1 and -2 <= v["chips"] <= 2 for v in report["exact_vs_random"].values())


def test_tictactoe_tactics_scores_every_position_with_a_threat(tiny_model_dir):
    import importlib.util

    spec = importlib.util.spec_from_file_location("tictactoe_tactics", RESEARCH / "tictactoe_tactics.py")
    tactics = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tactics)
    games = tactics.positions()
    assert len(games) == 4520  # TicTacToe's 5478 legal positions less its 958 finished ones
    board = [0, 0, None, 1, 1, None, None, None, None]  # X on 1 and 2, O on 4 and 5
    assert tactics.completing(board, 0) == {2} and tactics.completing(board, 1) == {5}
    # the exact non-loss of a uniformly random player against another: X wins 0.585 and draws 0.127 of games
    uniform = torch.tensor([[float(g.board[c] is None) / g.board.count(None) for c in range(9)] for g in games])
    assert tactics.exact_nonloss(games, uniform, 0) == pytest.approx(0.5849 + 0.1270, abs=2e-4)
    assert tactics.exact_nonloss(games, uniform, 1) == pytest.approx(0.2881 + 0.1270, abs=2e-4)
    assert tactics.exact_nonloss(games, uniform * 0.5, 0) < 0.5  # half of every move invalid: forfeits

    done = subprocess.run([sys.executable, str(RESEARCH / "tictactoe_tactics.py"), str(tiny_model_dir)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    numbers = re.fullmatch(r"tactical_x=([\d.]+) tactical_o=([\d.]+) priority_x=([\d.]+) priority_o=([\d.]+) "
                           r"nonloss_x=([\d.]+) nonloss_o=([\d.]+)", last)
    assert numbers, last
    assert all(0.0 <= float(v) <= 1.0 for v in numbers.groups())


def load_league_benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location("league_benchmark", BENCHMARKS / "league.py")
    league = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(league)
    return league


def test_kuhn_nash_conv_reads_each_move_as_openspiel_numbers_it():
    """The league benchmark's NashConv: each information state's two moves in OpenSpiel's action order (pass,
    bet), so Kuhn's equilibrium player scores 0 and the same player with call and fold swapped does not."""
    from envs.opponents import KuhnEquilibrium

    league = load_league_benchmark()
    play = league.opponent_probabilities(KuhnEquilibrium(alpha=0.2))

    def swapped(prompt, moves):
        probs = play(prompt, moves)
        return probs[::-1] if moves[0] == "[fold]" else probs

    nash_conv, table = league.policy_nash_conv(play)
    assert nash_conv == pytest.approx(0.0, abs=1e-9)
    assert table["0b"] == {"[fold]": 1.0, "[call]": 0.0} and table["2pb"] == {"[fold]": 0.0, "[call]": 1.0}
    assert league.policy_nash_conv(swapped)[0] > 1.0


def test_kuhn_average_of_policies_weights_each_by_its_own_reach():
    """Two Kuhn equilibria averaged stay an equilibrium; one policy averaged is itself; and "always bet or call"
    averaged with "always check or fold" is not uniform play: after checking and facing a bet only the checker
    is there to answer (it folds)."""
    from envs.opponents import KuhnEquilibrium

    league = load_league_benchmark()
    equilibria = [league.tabular_policy(league.opponent_probabilities(KuhnEquilibrium(alpha=a)))[0]
                  for a in (0, 1 / 3)]
    assert league.average_nash_conv(equilibria) == pytest.approx(0.0, abs=1e-9)
    uniform = lambda prompt, moves: [0.5, 0.5]  # noqa: E731
    uniform_nash_conv = league.policy_nash_conv(uniform)[0]
    assert league.average_nash_conv([league.tabular_policy(uniform)[0]]) == pytest.approx(uniform_nash_conv)
    bold, _ = league.tabular_policy(lambda prompt, moves: [0.0, 1.0])
    timid, _ = league.tabular_policy(lambda prompt, moves: [1.0, 0.0])
    assert abs(league.average_nash_conv([bold, timid]) - uniform_nash_conv) > 0.05


def test_kuhn_exact_play_against_random():
    """Win rate and chips against the uniform player, exactly. By hand: a player who always checks or folds
    wins only the showdowns after two checks (1/2 of its hands reach one, it wins half of them) and loses its ante
    whenever random bets (1/2): 0.25 of hands, -0.5 chips a hand. The uniform player against itself: 0.5, 0."""
    league = load_league_benchmark()
    passive, _ = league.tabular_policy(lambda prompt, moves: [1.0, 0.0])
    assert league.exact_vs_random(passive) == pytest.approx((0.25, -0.5))
    uniform, _ = league.tabular_policy(lambda prompt, moves: [0.5, 0.5])
    assert league.exact_vs_random(uniform) == pytest.approx((0.5, 0.0))


def test_kuhn_bounds_quick(tmp_path):
    """No Kuhn Poker equilibrium wins more than half its hands against random (the league's two targets), and the
    KL-regularised fixed point towards a uniform magnet lies near an equilibrium (uniform play itself: 0.917)."""
    import json

    uniform = {f"{card}{history}": ({"[fold]": 0.5, "[call]": 0.5} if history.endswith("b") else
                                    {"[check]": 0.5, "[bet]": 0.5})
               for card in range(3) for history in ("", "p", "b", "pb")}
    (tmp_path / "league.json").write_text(json.dumps({"base_policy": uniform}))
    done = subprocess.run([sys.executable, str(RESEARCH / "kuhn_bounds.py"), "--quick", "--magnet",
                           str(tmp_path / "league.json"), "--alphas", "0.05"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    last = re.fullmatch(r"equilibrium_vs_random=([\d.]+) max_vs_random_at_nash_conv_0.1=([\d.]+|nan) "
                        r"seat_blind_min_nash_conv=([\d.]+)", lines[-1])
    assert last, done.stdout[-500:]
    assert float(last[1]) <= 0.5 + 1e-9 and float(last[3]) > 0
    fixed = next(line for line in lines if line.startswith("KL-regularised fixed point, alpha=0.05"))
    assert float(re.search(r"NashConv ([\d.]+)", fixed)[1]) < 0.1


@pytest.mark.slow  # about a minute (a base model of its own, warmed up on the recipe): the suite is at its budget
@pytest.mark.timeout(600)
def test_role_selfplay_quick(tmp_path):
    """The arithmetic role recipe end to end: proposals, solver attempts with roles, the task buffer kept with
    the run, the held-out scoring before and after."""
    lines = run("role_selfplay.py", tmp_path, folder=RESEARCH)
    last = re.fullmatch(r"solver_heldout_start=([\d.]+) solver_heldout_final=([\d.]+) solver_gain=(-?[\d.]+) "
                        r"proposal_solve_rate_last_third=([\d.]+|nan) valid_proposals=([\d.]+|nan)", lines[-1])
    assert last, lines[-1]
    assert 0 <= float(last[1]) <= 1 and 0 <= float(last[2]) <= 1
    import json

    run_dir = tmp_path / "propose-solve"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("turns_role_proposer", 0) > 0 and r.get("turns_role_solver", 0) > 0 for r in rows)
    assert list((run_dir / "tasks").glob("*.arrows"))  # the task buffer, kept with the run


@pytest.mark.slow  # about four minutes (two one-minute runs of the default job): the suite is at its budget
@pytest.mark.timeout(900)
def test_observability_quick(tmp_path):
    lines = run("observability.py", tmp_path)
    found = re.fullmatch(r"overhead=(-?[\d.]+) tb_tags=(\d+) parquet_episodes=(\d+) trained_episodes=(\d+) "
                         r"parquet_match=([01])", lines[-1])
    assert found, lines[-1]
    assert int(found[2]) >= 20 and found[5] == "1" and found[3] == found[4] != "0"


def test_formats_renders_every_history_mode_as_apply_chat_template_does():
    """benchmarks/formats.py's template_match, in process: both templates, every history mode, with and without a
    system message, three turns of a game played through play_episode."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("formats", BENCHMARKS / "formats.py")
    formats = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(formats)
    match, cases = formats.template_match()
    assert match == 1 and len(cases) == 12 and all(c["matched"] == c["turns"] == 3 for c in cases)


@pytest.mark.slow  # two short runs of the default job: the harness's output only
@pytest.mark.timeout(600)
def test_formats_quick(tmp_path):
    lines = run("formats.py", tmp_path)
    assert re.fullmatch(r"template_match=1 tokens_per_move_ratio=[\d.]+ episodes_per_s_ratio=[\d.]+", lines[-1])


@pytest.mark.slow  # about 3 minutes: a run killed and resumed, then three replays (the system tests cover each part)
def test_replay_quick(tmp_path):
    lines = run("replay.py", tmp_path)
    assert re.fullmatch(r"versions=\d+ digests_equal=1\.000 replay_s=[\d.]+ run_learner_s=[\d.]+ "
                        r"replay_vs_learner=[\d.]+ counterfactual_kl=[\d.e+-]+ rescored_differ=0", lines[-1]), lines[-1]
    assert "rollbacks=[15]" in lines[-2] and "(0, 'base')" in lines[-2] and "'checkpoint')" in lines[-2], lines[-2]
