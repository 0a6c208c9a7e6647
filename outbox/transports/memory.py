"""A transport that keeps what it is sent, for tests and examples."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import orjson

from ._base import DELIVERED, Outcome, SerializedEvent

__all__ = ["MemoryTransport"]


class MemoryTransport:
    """Delivers every event into a list.

    ``events`` holds the parsed events in delivery order; ``batches`` the size of
    each batch.  Safe to read from any thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.events: list[dict[str, Any]] = []
        self.batches: list[int] = []
        self.closed = False

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        parsed = [orjson.loads(event.body) for event in batch]
        with self._lock:
            self.events.extend(parsed)
            self.batches.append(len(batch))
            self._lock.notify_all()
        return [DELIVERED] * len(batch)

    async def aclose(self) -> None:
        self.closed = True

    def wait_for(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` events arrived; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.events) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    def __repr__(self) -> str:
        return f"MemoryTransport(events={len(self.events)})"
