"""What every stream endpoint reports in `statistics()`, and the totals a run's metrics take from them.

Every endpoint of either transport reports every key (zero where it does not apply), so the totals can be
summed without knowing which kind of endpoint a number came from.
"""

from __future__ import annotations

STREAM_KEYS = (
    "sent",  # messages sent (or published)
    "received",  # messages handed to the actor
    "bytes_sent",
    "bytes_received",
    "dropped",  # messages or frames dropped here: malformed, abandoned at a disconnect, or (pub/sub) lost
    "duplicates",  # messages received again (after a reconnect) and dropped
    "gaps",  # messages missing from a sender's sequence
    "in_flight",  # sent and not yet acknowledged (sender), or handed over and not yet acknowledged (receiver)
    "send_waits",  # sends that had to wait for credit
    "wait_s",  # seconds spent waiting for credit
    "reconnects",  # links re-opened after their connection dropped
)


def new_stats() -> dict:
    return dict.fromkeys(STREAM_KEYS, 0) | {"wait_s": 0.0}


def count_sent(stats: dict, parts) -> None:
    """Count one message of ``parts`` sent (or published)."""
    stats["sent"] += 1
    stats["bytes_sent"] += sum(len(part) for part in parts)


def count_received(stats: dict, parts) -> None:
    """Count one message of ``parts`` handed to the actor."""
    stats["received"] += 1
    stats["bytes_received"] += sum(len(part) for part in parts)


def stream_totals(streams: list[dict]) -> dict:
    """The sums over many endpoints' statistics, each key prefixed ``streams_``, for a metrics row."""
    return {f"streams_{key}": sum(s.get(key, 0) for s in streams) for key in STREAM_KEYS}
