"""The Scaler on what its ``ScaleContext`` hands it, without a driver: an env scale-down pauses training, shares the
admission allowance again among the actors that stay, and lets the others go; a rollout scale-down moves the env
actors' requests first."""

from types import SimpleNamespace

from actors.cli import load_config
from actors.runs.scaling import ScaleContext, Scaler


class Cluster:
    """Env actors that have started ``started`` training episodes each and delivered every one; records the rest."""

    def __init__(self, started: dict[str, int]):
        self.started, self.calls = started, []

    def statistics(self, name):
        return {"started": self.started[name], "admission_offset": 0, "drained": True}

    def call(self, name, method, *args):
        self.calls.append((name, method, *args))
        return 0

    def reconfigure(self, name, **changes):
        self.calls.append((name, "reconfigure", changes))

    def set_peers(self, name, key, addresses, member=None):
        self.calls.append((name, "set_peers", addresses, member))

    def stop(self, name):
        self.calls.append((name, "stop"))

    def is_dead(self, error):
        return False


def context(cluster, top, training: list, retired: list) -> ScaleContext:
    return ScaleContext(cfg=load_config(["run.mode=ray"]), cluster=cluster, top=top,
                        evaluations=SimpleNamespace(open=[]), metrics=SimpleNamespace(retired=retired.append),
                        restarts={}, recover=None, training=lambda: True,
                        set_training=lambda on, envs: training.append((on, envs)))


def test_an_env_scale_down_pauses_training_shares_the_allowance_again_and_lets_the_last_go():
    cluster = Cluster({"env-0": 5, "env-1": 4, "env-2": 3})
    top = SimpleNamespace(envs=["env-0", "env-1", "env-2"], league=None, groups={"main": None})
    training, retired = [], []
    scaler = Scaler(context(cluster, top, training, retired))
    try:
        scaler.requests.put(("env", 2))
        scaler.apply()  # env-2 is told to retire, and has delivered all it started
        assert cluster.calls == [("env-2", "retire")] and scaler.busy
        scaler.apply()
    finally:
        scaler.close()
    # 12 started in all: 6 each for the two that stay, their counts moved by the difference
    assert cluster.calls[1:] == [("env-0", "reconfigure", {"admission_slot": (0, 2), "admission_offset": 1}),
                                 ("env-0", "rebalance", (0, 2), 1),
                                 ("env-1", "reconfigure", {"admission_slot": (1, 2), "admission_offset": 2}),
                                 ("env-1", "rebalance", (1, 2), 2), ("env-2", "stop")]
    assert training == [(False, ["env-0", "env-1"]), (True, None)]  # paused while the shares move, then as before
    assert top.envs == ["env-0", "env-1"] and retired == ["env-2"] and not scaler.busy
    assert [(e["kind"], e["from"], e["to"]) for e in scaler.events] == [("env", 3, 2)] and "applied" in scaler.events[0]


def test_a_rollout_scale_down_moves_the_requests_before_the_leaving_actor_goes():
    cluster = Cluster({})
    group = SimpleNamespace(rollouts=["rollout-0", "rollout-1"], requests={"rollout-0": "a0", "rollout-1": "a1"})
    top = SimpleNamespace(envs=["env-0"], league=None, groups={"main": group})
    retired = []
    scaler = Scaler(context(cluster, top, [], retired))
    try:
        scaler.requests.put(("rollout", 1))
        scaler.apply()
    finally:
        scaler.close()
    assert cluster.calls == [("env-0", "set_peers", ["a0"], "main"), ("env-0", "set_rollouts", ["a0"], "main"),
                             ("rollout-1", "stop"), ("env-0", "reissue")]
    assert group.rollouts == ["rollout-0"] and group.requests == {"rollout-0": "a0"} and retired == ["rollout-1"]
