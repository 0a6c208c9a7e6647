"""What the worker holds of an event once it has left the buffer, and the key its order is kept
by (``order_key(item.event, item.seq)``: the one definition, :func:`outbox._run._serde.order_key`)."""

from __future__ import annotations

from typing import NamedTuple

from .._run._serde import Key, SerializedEvent, order_key

__all__ = ["Held", "Key", "order_key"]


class Held(NamedTuple):
    """An event the worker holds: serialized, at its exact size."""

    #: Its place in the order of emits (the buffer's sequence number).
    seq: int
    event: SerializedEvent
    #: Bytes it counts for in the buffer's bound.
    size: int
