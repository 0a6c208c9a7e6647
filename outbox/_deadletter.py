"""The dead-letter file: every event the outbox settles as undeliverable for good (rejected,
poison, too large, invalid) is appended to a JSON-lines file with its reason, the backend's
answer and the time, so that nothing leaves without a trace.  ``outbox replay FILE`` sends such a
file again.

One line per event::

    {"time": "2026-12-02T10:00:00.123456+00:00", "reason": "poison",
     "answer": "POST http://marquez:5000/api/v1/lineage answered 500 ...", "event": {...}}

``event`` is the event as it was (or would have been) sent; for an event that could not be
serialized at all, ``event_repr`` holds its ``repr`` (cut to 10,000 characters) instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import orjson

from ._log import RateLimitedLog

__all__ = ["DeadLetter", "read_events"]

_REPR_LIMIT = 10_000


class DeadLetter:
    """Appends settled-for-good events to ``path`` (opened per write: rotation-friendly)."""

    def __init__(self, path: str | os.PathLike[str], log_interval: float = 30.0) -> None:
        self.path = os.fspath(path)
        self._log = RateLimitedLog(log_interval)

    def write(self, records: Iterable[tuple[str, str, bytes | None, Any]]) -> None:
        """``records``: (reason, the backend's answer or why, the event's JSON as the outbox
        serialized it or None, the event as emitted).  Never raises: a dead-letter file that
        cannot be written is logged (at a bounded rate); the events stay counted."""
        now = datetime.now(UTC).isoformat()
        lines = []
        for reason, answer, body, event in records:
            head = orjson.dumps({"time": now, "reason": reason, "answer": answer})[:-1]
            if body is not None:
                lines.append(head + b',"event":' + body + b"}\n")
            else:
                text = repr(event)[:_REPR_LIMIT]
                lines.append(head + b',"event_repr":' + orjson.dumps(text) + b"}\n")
        if not lines:
            return
        try:
            with open(self.path, "ab") as file:
                file.write(b"".join(lines))
        except OSError as exc:
            self._log.error(
                "dead-letter",
                "cannot write the dead-letter file %s: %s (%d lost)",
                self.path,
                exc,
                len(lines),
            )

    def __repr__(self) -> str:
        return f"DeadLetter({self.path!r})"


def read_events(lines: Iterable[bytes]) -> Iterable[bytes | str]:
    """The events of a dead-letter file, or of any JSON-lines file of events: for a dead-letter
    line its ``event`` (re-encoded), for any other JSON object the line itself.  Lines that hold
    no event (``event_repr`` only, blank lines) are skipped."""
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            yield line  # counted as invalid_event by the outbox, like any bad pre-serialized event
            continue
        if isinstance(value, dict) and "reason" in value and "time" in value:
            if isinstance(value.get("event"), dict):
                yield orjson.dumps(value["event"])
            continue
        yield line
