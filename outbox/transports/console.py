"""A transport that prints each event as one JSON line."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from ._base import DELIVERED, Outcome, SerializedEvent

__all__ = ["ConsoleTransport"]


class ConsoleTransport:
    """Writes each event's JSON on its own line to ``stream`` (default: standard output).

    This is what ``Outbox.from_env()`` falls back to when nothing is configured, as
    openlineage-python does.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        stream = self._stream or sys.stdout
        stream.write("".join(event.body.decode() + "\n" for event in batch))
        stream.flush()
        return [DELIVERED] * len(batch)

    async def aclose(self) -> None:
        pass

    def __repr__(self) -> str:
        return "ConsoleTransport()"
