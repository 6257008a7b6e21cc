"""Episodes dropped after their delivery give their admission back: the notices from the reward actor and replay
(``streams.drop_notices``), the env actor that takes them once, and, in one process, a batch that forms at
max_staleness 0 although the scorer drops episodes (without the notices admission ran out and nothing moved)."""

import pytest
import trio
import trio.testing
from transformers import AutoTokenizer

from actors.env.actor import EnvActor, EnvConfig
from actors.replay.actor import ReplayActor, ReplayConfig
from actors.reward.actor import RewardActor, RewardConfig
from actors.reward.scorers import Unscored
from streams.channels import MemoryTransport
from streams.drop_notices import REPEAT_S, REPEATS, DropNotices
from streams.endpoints import Inbox
from streams.messages import EpisodeDropped, dropped_topic
from streams.schema import Columns, decode_batch
from streams.wire import FrameError, Kind
from tests.factories import scripted_rollout


def test_a_drop_notice_reaches_only_its_env_actor_and_goes_out_again_a_few_times():
    got = {"env-1": [], "env-10": []}

    async def main():
        transport = MemoryTransport()
        async with transport.open_publisher() as publisher, trio.open_nursery() as nursery, \
                transport.open_subscriber([publisher.address], [dropped_topic("env-1")], capacity=64) as one, \
                transport.open_subscriber([publisher.address], [dropped_topic("env-10")], capacity=64) as ten:
            notices = DropNotices(publisher, "reward")
            nursery.start_soon(notices.run)
            for name, subscriber in (("env-1", one), ("env-10", ten)):
                inbox = Inbox(subscriber, Kind.DROPPED, EpisodeDropped.from_body, topic=True)
                nursery.start_soon(_collect, inbox, got[name])
            notices.dropped("main", "20260101-000000/env-1-0-7", "unscored")
            notices.dropped("main", None, "rejected_by_reward")  # no id: started by nobody, told to nobody
            notices.dropped("main", "env-1-0-" + "9" * 5000, "rejected_by_reward")  # forged: no frame would hold it
            await trio.sleep(REPEAT_S * (REPEATS + 2))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert got["env-10"] == []  # "env-1" is a prefix of "env-10": the topic's closing slash keeps them apart
    assert got["env-1"] == [EpisodeDropped("main", "20260101-000000/env-1-0-7", "unscored")] * REPEATS


async def _collect(inbox, into):
    while True:
        into.append(await inbox.receive())


def test_a_drop_notice_with_a_missing_field_is_refused():
    from streams.wire import pack

    with pytest.raises(FrameError, match="lacks reason"):
        EpisodeDropped.from_body(pack({"policy": "main", "episode": "env-0-0-1"}))


def test_an_env_actor_gives_back_each_dropped_episode_of_its_own_once(tiny_model_dir, tmp_path):
    env = EnvActor(EnvConfig(tokenizer_path=str(tiny_model_dir), life="L", incarnation=2, max_staleness=0,
                             batch_episodes=4, ledger_dir=str(tmp_path)), name="env-1")
    for _ in range(4):
        env._admission.started("main")
    assert env._admission.admitted() == []
    for notice in [EpisodeDropped("main", "L/env-1-2-0", "unscored"),
                   EpisodeDropped("main", "L/env-1-2-0", "unscored"),  # the same notice again: counted once
                   EpisodeDropped("main", "L/env-1-1-5", "unscored"),  # a predecessor's: its restart counted it
                   EpisodeDropped("main", "L/env-10-2-0", "unscored"),  # another actor's
                   EpisodeDropped("main", "K/env-1-2-1", "unscored"),  # another life's
                   EpisodeDropped("rival", "L/env-1-2-3", "unscored"),  # a member not admitted here
                   EpisodeDropped("main", "L/env-1-2-1", "refused_by_replay"),
                   EpisodeDropped("main", "L/env-1-2-2", "made up")]:
        env.episode_dropped(notice)
    stats = env.statistics()
    assert stats["started"] == 1 and env._admission.admitted() == ["main"]
    assert stats["given_back_by_reason"] == {"unscored": 1, "refused_by_replay": 1, "dropped": 1}
    assert (tmp_path / "env-1.dropped").read_text().splitlines() == [  # the accounting's: dropped, not lost
        "L/env-1-2-0 unscored", "L/env-1-2-1 refused_by_replay", "L/env-1-2-2 dropped"]
    assert not list(tmp_path.glob("*.txt"))  # what account_episodes reads as delivered


class DropsEveryOther:
    """A scorer that leaves every second episode unscored, as a judge that times out does."""

    def __init__(self):
        self.calls = 0

    def __call__(self, episode):
        self.calls += 1
        if self.calls % 2 == 0:
            raise Unscored("timeout", "the judge took too long")
        return episode


def test_at_eta_0_episodes_the_scorer_drops_are_given_back_and_a_batch_still_forms(tiny_model_dir):
    """B = 4 and max_staleness = 0: the env actor may have 4 episodes started and not consumed. Half are dropped
    unscored; without a notice back it would stop at 4 started with 2 in replay, and no batch would ever form."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    seen = {}

    async def main():
        transport = MemoryTransport()
        async with transport.open_receiver() as requests, transport.open_receiver(capacity=1) as learner, \
                trio.open_nursery() as nursery:
            nursery.start_soon(scripted_rollout, transport, requests, tokenizer, "[5]", 0, None)
            replay = ReplayActor(ReplayConfig(batch_episodes=4, capacity_episodes=8))
            replay_at = await nursery.start(replay.run, transport, {"learner": [learner.address]})
            reward = RewardActor(RewardConfig(), scorer=DropsEveryOther())
            reward_at = await nursery.start(reward.run, transport, {"replay": [replay_at["episodes"]]})
            env = EnvActor(EnvConfig(tokenizer_path=str(tiny_model_dir), concurrency=4, max_staleness=0,
                                     batch_episodes=4))
            await nursery.start(env.run, transport, {"rollout": [requests.address], "reward": [reward_at["episodes"]],
                                                     "dropped": [reward_at["dropped"], replay_at["dropped"]]})
            env.set_training(True)
            with trio.fail_after(60):
                batch, _ = await Inbox(learner, Kind.BATCH, decode_batch).receive()
            seen.update(batch=batch, env=env.statistics(), reward=reward.statistics())
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(set(seen["batch"].column(Columns.EPISODE_ID).to_pylist())) == 4
    assert seen["reward"]["unscored"] >= 2 and seen["reward"]["drop_notices"] == seen["reward"]["unscored"]
    assert seen["env"]["given_back_by_reason"].get("unscored", 0) >= 2
    assert seen["env"]["started"] <= seen["env"]["admission_limit"] == 4
