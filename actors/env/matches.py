"""Where an env actor's training matches come from: one source, chosen when the actor starts.

``SelfPlayMatches`` (no league): the policy in every seat (mirror self-play), or, in a share
``opponent_share`` of games, the policy in one seat against a fixed opponent in the others. That seat is drawn
uniformly, or by a PFSP weighting (``actors.league.matchmaking``: hard, variance, linear_capped) over the
policy's decayed score in each seat against the opponent: more games where it is weaker.

``LeagueMatches`` (``peers`` holds ``league``): the env actor asks the LeagueActor for a match naming the
members it may admit (admission is kept per member), plays it with each seat's generation requests sent to the
rollout group of the seat's member, and reports every seat's returns back. Only the seats of the match's
learner are trained on; the others (other members, snapshots, fixed opponents) play. A match request the
league took and did not answer before it died goes out again (``reissue_request``); an answer to a request
this actor no longer waits on is dropped as a stray.

Both give a match with ``learner`` and ``seats``, and are told how it ended (``finished``).
"""

from __future__ import annotations

import contextlib
import itertools
import random
from dataclasses import dataclass
from typing import AsyncIterator, Protocol

import trio

from actors.env.lanes import Played  # an episode's trained rows and returns; None: it errored
from actors.league.matchmaking import Payoff, draw, pairwise_scores, pfsp_probabilities
from streams.endpoints import Inbox, Outbox
from streams.messages import MatchAssigned, MatchRequest, MatchResult
from streams.wire import FRAME_LIMITS, Kind


class Match(Protocol):
    learner: str  # the member trained on: its seats' rows are delivered
    seats: list[str]  # each seat's player: a member, a snapshot or a fixed opponent


class MatchSource(Protocol):
    async def next(self, admitted: list[str]) -> Match: ...

    async def finished(self, match: Match, played: Played) -> None: ...

    def reissue_request(self) -> bool: ...

    def statistics(self) -> dict: ...


def seated(player: str, seat: int, opponent: str, num_players: int) -> list[str]:
    """``player`` in ``seat``, ``opponent`` in every other seat."""
    return [player if s == seat else opponent for s in range(num_players)]


def uniform_seats(num_players: int) -> dict[str, float]:
    return {str(seat): 1.0 / num_players for seat in range(num_players)}


@dataclass
class SelfPlayMatch:
    learner: str
    seats: list[str]


class SelfPlayMatches:
    """This policy's own training matches (see the module); ``rng`` is the env actor's, shared."""

    def __init__(self, policy_id: str, num_players: int, rng: random.Random, *, opponent: str = "random",
                 opponent_share: float = 0.0, opponent_seat: str = "uniform", opponent_seat_decay: float = 0.995):
        self.policy_id, self.num_players, self._rng = policy_id, num_players, rng
        self.opponent, self.opponent_share, self.opponent_seat = opponent, opponent_share, opponent_seat
        self._seat_scores = Payoff(opponent_seat_decay)  # "<seat>" against the opponent, training games

    async def next(self, admitted: list[str]) -> SelfPlayMatch:
        """Mirror self-play, or (a share ``opponent_share`` of games) the policy in one seat against the opponent."""
        if self._rng.random() >= self.opponent_share:
            return SelfPlayMatch(self.policy_id, [self.policy_id] * self.num_players)
        seat = int(draw(self.seat_probabilities(), self._rng))
        return SelfPlayMatch(self.policy_id, seated(self.policy_id, seat, self.opponent, self.num_players))

    async def finished(self, match: SelfPlayMatch, played: Played) -> None:
        """A delivered game of the policy in one seat against the opponent: its score there (as the league
        scores a match), for ``opponent_seat``."""
        if played is None or not played[0] or self.opponent not in match.seats:
            return
        seat = str(match.seats.index(self.policy_id))
        for opponent, score in pairwise_scores(match.seats, played[1], self.policy_id):
            self._seat_scores.add(seat, opponent, score)

    def seat_probabilities(self) -> dict[str, float]:
        """Seat (as a string) -> probability that the policy sits there in a game against the opponent."""
        if self.opponent_seat == "uniform":
            return uniform_seats(self.num_players)
        scores = {str(s): self._seat_scores.win_rate(str(s), self.opponent) for s in range(self.num_players)}
        return pfsp_probabilities(scores, self.opponent_seat)

    def reissue_request(self) -> bool:
        return False

    def statistics(self) -> dict:
        return {"stray_matches": 0, "reissued_match_requests": 0,
                "opponent_seat_probabilities": self.seat_probabilities()}


@contextlib.asynccontextmanager
async def open_league_matches(transport, league: dict, *, name: str, members: list[str],
                              num_players: int) -> AsyncIterator[LeagueMatches]:
    """``LeagueMatches`` asking the league at ``league`` (its ``requests`` and ``results`` addresses), answered
    on a receiver of its own; a reissued request is sent from its nursery, until exit."""
    async with (
        transport.open_receiver(capacity=4, max_message_bytes=FRAME_LIMITS[Kind.MATCH]) as assigned,
        transport.open_sender([league["requests"]], capacity=4) as requests,
        transport.open_sender([league["results"]], capacity=256) as results,
        trio.open_nursery() as nursery,
    ):
        yield LeagueMatches(Inbox(assigned, Kind.MATCH, MatchAssigned.from_body), assigned.address,
                            Outbox(requests, Kind.MATCH_REQUEST, name), Outbox(results, Kind.MATCH_RESULT, name),
                            nursery, members=members, num_players=num_players)
        nursery.cancel_scope.cancel()


class LeagueMatches:
    """Training matches asked of the LeagueActor, one request at a time (see the module)."""

    def __init__(self, assigned: Inbox, reply_to: str, requests: Outbox, results: Outbox, nursery, *,
                 members: list[str], num_players: int):
        self._assigned, self._reply_to, self._requests, self._results = assigned, reply_to, requests, results
        self._nursery, self.members, self.num_players = nursery, list(members), num_players
        self._request_ids = itertools.count()
        self._waiting_on: bytes | None = None  # the request sent and not yet answered
        self.counts = {"stray_matches": 0, "reissued_match_requests": 0}

    async def next(self, admitted: list[str]) -> MatchAssigned:
        """The league's next match for one of the ``admitted`` members."""
        request_id = next(self._request_ids)
        self._waiting_on = MatchRequest(request_id, self._reply_to, admitted).to_body()
        await self._requests.send(self._waiting_on)
        while (match := await self._assigned.receive()).request_id != request_id:
            self.counts["stray_matches"] += 1
        self._waiting_on = None
        if match.learner not in self.members or len(match.seats) != self.num_players:
            raise ValueError(f"the league assigned match {match.match_id} for {match.learner!r} with "
                             f"{len(match.seats)} seats; this actor admits {sorted(self.members)} in "
                             f"{self.num_players}-seat games")
        return match

    async def finished(self, match: MatchAssigned, played: Played) -> None:
        """Every seat's return to the league (zeros and ``errored`` for a game that did not finish)."""
        returns = played[1] if played is not None else [0.0] * len(match.seats)
        result = MatchResult(match.match_id, match.learner, match.seats, returns, errored=played is None)
        await self._results.send(result.to_body())

    def reissue_request(self) -> bool:
        """Send again the request this actor waits on, if any (the league restarted, and the request may have
        died with it unanswered); a second answer is dropped as a stray. True if one goes out."""
        if self._waiting_on is None:
            return False
        self._nursery.start_soon(self._requests.send, self._waiting_on)
        self.counts["reissued_match_requests"] += 1
        return True

    def statistics(self) -> dict:
        return {**self.counts, "opponent_seat_probabilities": uniform_seats(self.num_players)}
