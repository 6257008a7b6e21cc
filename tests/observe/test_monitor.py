"""The metrics log: the training return over a sliding window."""

from actors.observe.monitor import MetricsLog


def stats(episodes: int, return_sum: float) -> dict:
    return {"learner": {"version": 0, "episodes": 0, "train_s": 0.0},
            "env-0": {"episodes": episodes, "turns": 0, "invalid_actions": 0, "train_episodes": episodes,
                      "train_return_sum": return_sum}}


def test_training_return_is_the_mean_over_episodes_in_the_window(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("actors.observe.monitor.time.time", lambda: now[0])
    log = MetricsLog(tmp_path, window_s=30.0)
    log.snapshot(stats(0, 0.0))
    for t, episodes, total in [(10, 10, 0.0), (20, 20, 5.0), (40, 30, 15.0), (60, 40, 16.0)]:
        now[0] = 1000.0 + t
        row = log.snapshot(stats(episodes, total))
    # at t=60 the window starts at the newest snapshot at least 30 s old: t=20
    assert row["train_return"] == (16.0 - 5.0) / (40 - 20)
    now[0] = 1075.0  # and now at t=40
    assert log.snapshot(stats(50, 17.0))["train_return"] == (17.0 - 15.0) / (50 - 30)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 6


def snapshots(tmp_path, monkeypatch, series, **window) -> list[dict]:
    """The rows of a fresh log given (seconds, episodes ended, their return sum) after a first empty snapshot."""
    now = [1000.0]
    monkeypatch.setattr("actors.observe.monitor.time.time", lambda: now[0])
    log = MetricsLog(tmp_path, **window)
    log.snapshot(stats(0, 0.0))
    rows = []
    for t, episodes, total in series:
        now[0] = 1000.0 + t
        rows.append(log.snapshot(stats(episodes, total)))
    return rows


def test_training_return_waits_for_enough_episodes_and_reaches_back_for_them(tmp_path, monkeypatch):
    rows = snapshots(tmp_path, monkeypatch, [(10, 10, 0.0), (40, 15, 5.0), (80, 30, 11.0), (120, 32, 13.0)],
                     window_s=30.0, window_episodes=20)
    assert rows[0]["train_return"] is None and rows[1]["train_return"] is None  # fewer than 20 episodes ended
    assert rows[2]["train_return"] == 11.0 / 20  # from t=10: the 30 s window alone would hold 15 episodes
    # at t=120 the 30 s window holds 2 episodes; it reaches back to t=10, the newest snapshot >= 20 episodes ago
    assert rows[3]["train_return"] == (13.0 - 0.0) / (32 - 10)


def test_a_window_of_episodes_alone_reads_the_same_count_at_any_pace(tmp_path, monkeypatch):
    """window_s = 0: the mean over the newest snapshots holding at least window_episodes episodes, however long
    they took to end (what async_vs_sync.py uses, so that a slow run and a fast one are read with equal noise)."""
    rows = snapshots(tmp_path, monkeypatch, [(1, 10, 0.0), (2, 25, 6.0), (3, 40, 21.0), (300, 45, 26.0)],
                     window_s=0.0, window_episodes=20)
    assert rows[0]["train_return"] is None
    assert rows[1]["train_return"] == 6.0 / 25  # back to the start: the first 20 episodes reach that far
    assert rows[2]["train_return"] == (21.0 - 0.0) / (40 - 10)  # t=2 holds only 15: back to t=1
    assert rows[3]["train_return"] == (26.0 - 6.0) / (45 - 25)  # 5 minutes later, still the last >= 20


def test_totals_go_on_across_a_restart_and_after_an_actor_leaves(tmp_path):
    from actors.observe.monitor import MetricsLog

    log = MetricsLog(tmp_path)
    learner = {"version": 1, "episodes": 0, "train_s": 0.0}
    env = {"episodes": 10, "turns": 30, "invalid_actions": 1}
    log.snapshot({"learner": learner, "env-0": env, "rollout-0": {"tokens": 100, "requests": 4},
                  "rollout-1": {"tokens": 50, "requests": 2}})
    log.restarted("rollout-0")  # back from 0
    log.retired("rollout-1")  # gone, with what it counted
    log.retired("rollout-2")  # joined and left between two snapshots: counted nothing here
    row = log.snapshot({"learner": learner, "env-0": env, "rollout-0": {"tokens": 5, "requests": 1}})
    assert row["tokens"] == 155 and row["tokens_per_s"] >= 0 and row["restarts"] == 1
    # each rollout actor's requests answered, its restarts' and the retired ones' included
    assert row["rollout_requests"] == {"rollout-0": 5, "rollout-1": 2, "rollout-2": 0}, row["rollout_requests"]


def test_a_role_games_figures_are_in_each_row_and_on_the_curve(tmp_path):
    """Per role: the invalid-move rate over the env actors, the learner's last return, the task buffer."""
    from actors.observe.monitor import plot_learning_curve

    log = MetricsLog(tmp_path, window_s=0.0)
    both = stats(4, 1.0)
    both["learner"]["last"] = {"return_role_proposer": 0.25, "return_role_solver": 0.5, "return_seat0": 0.25}
    both["env-0"].update(turns_by_role={"proposer": 4, "solver": 12}, invalid_by_role={"proposer": 1, "solver": 0},
                         task_buffer={"size": 3, "mean_solve_rate": 0.5, "recent_kinds": {"a+b": 2, "copy": 1}})
    both["env-1"] = {**stats(2, 0.0)["env-0"], "turns_by_role": {"proposer": 4}, "invalid_by_role": {"proposer": 3},
                     "task_buffer": {"size": 2, "mean_solve_rate": None, "recent_kinds": {"a+b": 1}}}
    row = log.snapshot(both)
    assert row["invalid_rate_role_proposer"] == 4 / 8 and row["invalid_rate_role_solver"] == 0.0
    assert (row["return_role_proposer"], row["return_role_solver"]) == (0.25, 0.5)
    assert (row["task_buffer_size"], row["task_solve_rate"]) == (3, 0.5)
    assert (row["task_kind_share_a+b"], row["task_kind_share_copy"]) == (0.75, 0.25)
    evaluation = {"minute": 0.0, "nonloss": 0.5, "nonloss_by_seat": {0: 0.5}}
    plot_learning_curve([evaluation], log.rows, tmp_path / "curve.png", "random")
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_unreadable_completions_are_summed_and_read_as_a_rate_of_the_turns(tmp_path):
    log = MetricsLog(tmp_path)
    learner = {"version": 1, "episodes": 0, "train_s": 0.0}
    before = {"episodes": 1, "turns": 10, "invalid_actions": 2, "unreadable_actions": 1}
    log.snapshot({"learner": learner, "env-0": before, "env-1": {"episodes": 0, "turns": 0, "invalid_actions": 0}})
    log.restarted("env-0")  # back from 0: what it counted stays in the totals
    row = log.snapshot({"learner": learner, "env-0": {"episodes": 1, "turns": 10, "invalid_actions": 4,
                                                      "unreadable_actions": 3},
                        "env-1": {"episodes": 0, "turns": 10, "invalid_actions": 0}})
    assert row["unreadable_actions"] == 4 and row["invalid_actions"] == 6
    assert row["unreadable_rate"] == 3 / 20 and row["invalid_rate"] == 4 / 20


def test_the_row_says_where_episodes_were_dropped_and_a_stall_is_said_once(tmp_path, caplog):
    """Reward's and replay's drops and the env actors' lost completions and admission given back are in the row;
    with nothing that could make a batch (replay under B, no episode live) and the version still, the fifth such
    row warns, once, and a version that moves ends the stall."""
    from actors.observe.monitor import STALL_ROWS

    log = MetricsLog(tmp_path, batch_episodes=8)
    log.started = 0.0

    def row(version: int, buffered: int = 3, live: int = 0) -> dict:
        env = {**stats(4, 1.0)["env-0"], "live_episodes": live, "lost_completions": 1,
               "given_back_by_reason": {"unscored": 2, "errored": 1}}
        return log.snapshot({"learner": {"version": version, "episodes": 0, "train_s": 0.0}, "env-0": env,
                             "env-1": {**env, "given_back_by_reason": {"unscored": 1}},
                             "reward": {"unscored": 3, "rejected_episodes": 1},
                             "replay": {"buffered": buffered, "rejected_episodes": 2, "refused_episodes": 1}})

    first = row(4)
    assert (first["unscored_episodes"], first["rejected_by_reward"], first["rejected_by_replay"],
            first["refused_by_replay"], first["lost_completions"]) == (3, 1, 2, 1, 2)
    assert first["given_back"] == {"unscored": 3, "errored": 1}
    assert [row(4)["stalled_rows"] for _ in range(STALL_ROWS + 1)] == list(range(1, STALL_ROWS + 2))
    stalled = [r for r in caplog.records if "the run is stalled" in r.getMessage()]
    assert len(stalled) == 1 and "unscored 3" in stalled[0].getMessage()
    assert row(5)["stalled_rows"] == 0  # the learner moved
    assert row(5, buffered=8)["stalled_rows"] == row(5, live=2)["stalled_rows"] == 0  # a batch can form
