"""The two match sources alone: self-play's seat choice, and the league's request, answer, reissue and result."""

import contextlib
import random

import pytest
import trio
import trio.testing

from actors.env.matches import SelfPlayMatch, SelfPlayMatches, open_league_matches
from streams.channels import MemoryTransport
from streams.endpoints import Inbox, Outbox
from streams.messages import MatchAssigned, MatchRequest, MatchResult
from streams.wire import Kind


def draws(source: SelfPlayMatches, games: int) -> list[list[str]]:
    return [trio.run(source.next, ["main"]).seats for _ in range(games)]


def test_self_play_mirrors_the_policy_or_seats_it_once_against_the_opponent():
    mirror = SelfPlayMatches("main", 3, random.Random(0))
    assert all(seats == ["main"] * 3 for seats in draws(mirror, 20))
    against = SelfPlayMatches("main", 3, random.Random(0), opponent="minimax", opponent_share=1.0)
    games = draws(against, 60)
    assert all(sorted(seats) == ["main", "minimax", "minimax"] for seats in games)
    assert {seats.index("main") for seats in games} == {0, 1, 2}
    assert against.statistics()["opponent_seat_probabilities"] == pytest.approx({"0": 1 / 3, "1": 1 / 3, "2": 1 / 3})


def test_pfsp_seats_the_policy_where_it_loses_and_only_delivered_games_count():
    source = SelfPlayMatches("main", 2, random.Random(0), opponent="random", opponent_share=1.0,
                             opponent_seat="hard", opponent_seat_decay=0.9)
    rows = [{}]  # a delivered game: the learner had rows
    for _ in range(20):
        trio.run(source.finished, SelfPlayMatch("main", ["main", "random"]), (rows, [1.0, -1.0]))
        trio.run(source.finished, SelfPlayMatch("main", ["random", "main"]), (rows, [1.0, -1.0]))
    probabilities = source.seat_probabilities()
    assert probabilities["1"] > 0.9  # it always loses as seat 1
    before = dict(probabilities)
    trio.run(source.finished, SelfPlayMatch("main", ["random", "main"]), None)  # errored: no score
    trio.run(source.finished, SelfPlayMatch("main", ["random", "main"]), ([], [0.0, 1.0]))  # no rows: no score
    assert source.seat_probabilities() == before
    assert sum(s.index("main") for s in draws(source, 40)) > 30


async def fake_league(transport, requests, results, answers, seen):
    """Answers each request with ``answers(request)`` (a list of MatchAssigned, strays first); keeps what comes."""
    inbox = Inbox(requests, Kind.MATCH_REQUEST, MatchRequest.from_body)
    result_inbox = Inbox(results, Kind.MATCH_RESULT, MatchResult.from_body)
    async with trio.open_nursery() as nursery:
        async def take_results():
            while True:
                seen["results"].append(await result_inbox.receive())

        nursery.start_soon(take_results)
        while True:
            request = await inbox.receive()
            seen["requests"].append(request)
            async with transport.open_sender([request.reply_to]) as sender:
                for match in answers(request):
                    await Outbox(sender, Kind.MATCH, "league").send(match.to_body())
                await sender.drain()


@contextlib.asynccontextmanager
async def league_matches(answers, seen: dict, members: list[str]):
    """``LeagueMatches`` for 2-seat games, asking a fake league that answers with ``answers``."""
    transport = MemoryTransport()
    async with transport.open_receiver() as requests, transport.open_receiver() as results, \
            trio.open_nursery() as nursery:
        nursery.start_soon(fake_league, transport, requests, results, answers, seen)
        league = {"requests": requests.address, "results": results.address}
        async with open_league_matches(transport, league, name="env-0", members=members, num_players=2) as matches:
            yield matches
        nursery.cancel_scope.cancel()


def test_a_league_match_is_asked_answered_and_its_result_reported():
    seen = {"requests": [], "results": []}

    def answers(request):  # a stray first
        return [MatchAssigned(request.request_id + 100, 1, "main", ["main", "main"]),
                MatchAssigned(request.request_id, 7, "main", ["main", "rival-v2"])]

    async def main():
        async with league_matches(answers, seen, ["main", "rival"]) as matches:
            assert not matches.reissue_request()  # nothing asked yet
            match = await matches.next(["main"])
            assert (match.match_id, match.seats) == (7, ["main", "rival-v2"])
            await matches.finished(match, ([{}], [1.0, -1.0]))
            await matches.finished(match, None)
            while len(seen["results"]) < 2:
                await trio.testing.wait_all_tasks_blocked()
            assert matches.statistics()["stray_matches"] == 1

    trio.run(main)
    assert [r.open_members for r in seen["requests"]] == [["main"]]
    assert [(r.match_id, r.returns, r.errored) for r in seen["results"]] == [(7, [1.0, -1.0], False),
                                                                            (7, [0.0, 0.0], True)]


def test_a_league_request_is_reissued_while_unanswered_and_a_wrong_match_is_refused():
    seen = {"requests": [], "results": []}

    def answers(request):  # the first request is taken and not answered (the league died); its reissue is
        first = len(seen["requests"]) == 1  # answered with a match for a member this actor does not admit
        return [] if first else [MatchAssigned(request.request_id, 3, "stranger", ["stranger", "main"])]

    async def main():
        async with league_matches(answers, seen, ["main"]) as matches:
            async def ask():
                with pytest.raises(ValueError, match="'stranger'"):
                    await matches.next(["main"])

            async with trio.open_nursery() as asking:
                asking.start_soon(ask)
                while not seen["requests"]:
                    await trio.testing.wait_all_tasks_blocked()
                assert matches.reissue_request()
            assert matches.statistics()["reissued_match_requests"] == 1 and len(seen["requests"]) == 2

    trio.run(main)
    assert seen["requests"][0] == seen["requests"][1]  # the same request, sent again
