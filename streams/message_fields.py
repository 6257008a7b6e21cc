"""What every control message's decoder checks: its fields (present, of their types, within its shape) and the
stream addresses it names. Shared by `messages` and `generation_messages`."""

from __future__ import annotations

from streams.wire import FrameError, Shape, unpack

_KINDS = {int: (int,), float: (int, float), str: (str,), bytes: (bytes,), bool: (bool,), list: (list,)}


def _fields(body, names: tuple[str, ...], what: str, types: tuple[type, ...], shape: Shape) -> dict:
    """The message's fields, unpacked within ``shape``; FrameError naming a field that is missing or (``types``: one
    per name) mistyped."""
    fields = unpack(body, shape)
    if not isinstance(fields, dict) or any(name not in fields for name in names):
        missing = [n for n in names if not isinstance(fields, dict) or n not in fields]
        raise FrameError(f"{what} message lacks {', '.join(missing)}")
    for name, kind in zip(names, types):
        value = fields[name]
        if not isinstance(value, _KINDS[kind]) or (kind is not bool and isinstance(value, bool)):
            raise FrameError(f"{what} message field {name} is a {type(value).__name__}, expected {kind.__name__}")
    return fields


def _address(value: str, what: str) -> str:
    """A stream address of any transport; whether a receiver may connect to it is its transport's question
    (`ZmqTransport.check_peer_address`)."""
    if not value.startswith(("tcp://", "ipc://", "mem://")):
        raise FrameError(f"{what} names {value[:80]!r}, not a stream address")
    return value
