"""What the worker holds of an event once it has left the buffer, and the key its order is kept
by: the one definition every part of the worker uses."""

from __future__ import annotations

from typing import NamedTuple

from .._run._serde import SerializedEvent

__all__ = ["Held", "Key", "order_key"]

#: What a run's order is kept by: a run id, a message key (a job's or a dataset's events, which
#: have no run), or, for an event that has neither, its own sequence number (an int never equals
#: a str, so such an event is a key of its own).
Key = str | int


class Held(NamedTuple):
    """An event the worker holds: serialized, at its exact size."""

    #: Its place in the order of emits (the buffer's sequence number).
    seq: int
    event: SerializedEvent
    #: Bytes it counts for in the buffer's bound.
    size: int


def order_key(item: Held) -> Key:
    """The run id, else the message key, else the event's own sequence number."""
    event = item.event
    return event.run_id or event.key or item.seq
