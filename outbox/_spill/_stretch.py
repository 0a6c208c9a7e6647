"""The stretch: the events on disk only, read back in order as the queue has room.

It is a queue of *runs*, each some segment files and the numbers to hand out of them, by
stream: a run of this owner's own events (written from the memory window's overflow) or of a
dead owner's (adopted, read in place).  A run hands out, in file order, each record whose number
it still holds, once; whatever it holds when its last file is read to its end was damaged (a
*gap*, which the spill counts lost).  Memory: one record, or a 64 KiB chunk while resynchronizing.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from .._buffer import Buffer, Reason
from .._log import RateLimitedLog
from .._serde import SerializedEvent, weight
from .._slices import Slicer
from ._disk import Disk, serialized
from ._format import Event, NotOurs, SegmentReader, Settle
from ._ranges import Ranges
from ._window import Window

__all__ = ["Item", "Run", "Span", "Stretch"]

#: What a run hands out: (stream, number there, the event; None: a gap).
Item = tuple[str, int, SerializedEvent | None]
#: After a read of the stretch failed, seconds before the next try.
READ_AGAIN_AFTER = 1.0
#: An overflow event that cannot be written (it cannot be serialized, or is larger than the whole
#: spill) is written as a *tombstone* in its place, a record whose body names why: read back, it is
#: counted lost under that reason, in its order, and the events after it flow.
_TOMBSTONES = {
    reason: SerializedEvent(b"!" + reason.encode(), None, None)
    for reason in (Reason.INVALID_EVENT, Reason.DROPPED_SPILL_FULL)
}
_REASONS = {tomb.body: reason for reason, tomb in _TOMBSTONES.items()}


@dataclass(slots=True, eq=False)
class Run:
    """One run: ``remaining`` events, numbered here from ``first``, to be read from ``paths``
    (``todo``: the numbers, by stream, not handed out yet)."""

    first: int
    paths: list[str]
    todo: dict[str, Ranges]
    own: bool = False
    remaining: int = field(init=False)
    index: int = 0
    reader: SegmentReader | None = None
    records: Iterator[Event | Settle | int] | None = None
    #: Stretches of bytes that were not a sound record.
    damaged: int = 0

    def __post_init__(self) -> None:
        self.remaining = sum(len(numbers) for numbers in self.todo.values())

    def extend(self, stream: str, first: int, end: int, path: str) -> None:
        """More of this owner's events, written to ``path`` (its own runs grow)."""
        self.todo.setdefault(stream, Ranges()).add(first, end)
        self.remaining += end - first
        if not self.paths or self.paths[-1] != path:
            self.paths.append(path)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = self.records = None

    def read(self, want: int, max_bytes: int) -> list[Item]:
        """Up to ``want`` events (and ``max_bytes``, at least one), in file order; once the last
        file is read to its end, what is still to hand out comes as gaps.  Raises OSError if
        the disk fails."""
        out: list[Item] = []
        nbytes = 0
        while len(out) < want and self.index < len(self.paths):
            if self.reader is None:
                reader = SegmentReader(self.paths[self.index])
                try:
                    reader.open()
                except (OSError, NotOurs):
                    self.index += 1
                    continue
                self.reader = reader
            if self.records is None:
                self.records = self.reader.records()
            stream = self.reader.stream
            numbers = self.todo.get(stream)
            for record in self.records:
                if record.__class__ is Event:
                    if numbers is not None and numbers.remove(record.seq, record.seq + 1):
                        event = record.event
                        out.append((stream, record.seq, event))
                        nbytes += weight(event)
                        if len(out) >= want or nbytes >= max_bytes:
                            return out
                elif record.__class__ is int:
                    self.damaged += 1
            self.records = None
            if self.index >= len(self.paths) - 1:
                break  # the end of what is written: more may be appended
            self.close()
            self.index += 1
        if len(out) < want:
            # Its last file read to its end: what it still holds is not there (each was
            # written whole before it was handed to this run).
            out.extend(self._gaps(want - len(out)))
        return out

    def _gaps(self, n: int) -> list[Item]:
        out: list[Item] = []
        for stream, numbers in self.todo.items():
            while (seq := numbers.first()) is not None and len(out) < n:
                numbers.remove(seq, seq + 1)
                out.append((stream, seq, None))
        return out


@dataclass(slots=True)
class Span:
    """Events read back from the stretch, in memory, numbered here from ``first``: where each
    came from (its stream, its number there), to settle it there."""

    first: int
    origins: list[tuple[str, int]]
    left: int


class Stretch:
    """The buffer's memory window (``_window``) and what it overflowed to: the runs on disk, and
    what was read back of them.  Numbers given here to events of the stretch are *foreign*: their
    records are in their run's stream, under the numbers the spans say, never written again."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.window: Window | None = None
        self.runs: deque[Run] = deque()
        self.spans: list[Span] = []
        self.foreign = Ranges()
        #: A read back failed: none again before this time (``time.monotonic``).
        self.read_again_at = 0.0
        #: The last release found the disk full or failing: none again before the next tick.
        self.stuck = False
        #: Events read back that were not there (``lost``) or whose body is not a JSON object.
        self.lost = self.invalid = 0

    def place_locked(self, buf: Buffer, runs: list[Run]) -> None:
        """Adopted runs join the stretch, numbered after everything accepted so far."""
        window = self.window
        assert window is not None
        for run in runs:
            run.first = buf.next_seq
            buf.went_beyond_locked(run.remaining)
            window.disk += run.remaining
            self.runs.append(run)
            self.foreign.add(run.first, run.first + run.remaining)
        window.activate(buf)

    def release(self, buf: Buffer, slicer: Slicer | None, disk: Disk, drain: Any) -> None:
        """Write the overflow to disk and release what was written from memory (an own run)."""
        window = self.window
        assert window is not None
        with buf.lock:
            if not window.events or buf.finalized:
                return
            start = buf.next_seq - len(window.events)
            events = list(window.events)
        done = serialized(list(enumerate(events, start)), slicer)
        wrote = disk.append([(seq, _writable(ser, disk)) for seq, _, ser in done], buf.lock, drain)
        self.stuck = wrote < len(done)
        with buf.lock:
            if buf.finalized or buf.next_seq - len(window.events) != start:
                return  # cleared meanwhile (a close that reported without the worker)
            buf.spill_full_locked(disk.full and not disk.failing)
            window.usable = not disk.failing and not disk.full
            if not wrote or disk.last is None:
                return
            window.release(wrote)
            self.foreign.add(start, start + wrote)
            last = self.runs[-1] if self.runs else None
            if last is not None and last.own and last.first + last.remaining == start:
                last.extend(self.owner, start, start + wrote, disk.last.path)
            else:
                self.runs.append(
                    Run(start, [disk.last.path], {self.owner: Ranges([(start, start + wrote)])}, True)
                )
            buf.notify_locked()  # room in the overflow for blocked emitters

    def refill(self, buf: Buffer, log: RateLimitedLog) -> None:
        """Read the stretch back into the queue as its window has room; with the stretch empty,
        move the overflow to the queue; end the overflow once both are empty."""
        window = self.window
        assert window is not None
        with buf.lock:
            if buf.finalized:
                return
            if not window.disk:
                window.to_queue(buf)
                window.settle(buf)
                return
            room, room_bytes = window.room(buf)
            disk = window.disk
        if room <= 0 or room_bytes <= 0 or time.monotonic() < self.read_again_at:
            return
        run = self.runs[0]
        try:
            items = run.read(min(room, run.remaining), room_bytes)
        except OSError as exc:
            log.warning("spill-read", "spill: reading back failed: %s", exc)
            items = []
        if not items:
            self.read_again_at = time.monotonic() + READ_AGAIN_AFTER
            return
        with buf.lock:
            if buf.finalized or window.disk != disk:
                return
            self.remember(buf.next_seq - buf.beyond, items)  # (from the stretch's first number)
            run.remaining -= len(items)
            if not run.remaining:
                self.runs.popleft()
                run.close()
            bad = self._rejoin_locked(buf, items)
            window.disk -= len(items)
            window.settle(buf)
        if bad:
            log.warning("spill-unreadable", "spill: %d event(s) could not be read back; counted lost", bad)

    def _rejoin_locked(self, buf: Buffer, items: list[Item]) -> int:
        """Events read back join the queue's tail, in order; one that cannot be read, or whose
        body is not a JSON object, is counted lost in its place (its number retired).  Returns
        how many were."""
        events: list[SerializedEvent] = []
        bad = 0
        for _, _, event in items:
            if event is not None and _is_json_object(event.body):
                events.append(event)
                continue
            if events:
                buf.rejoin_locked(events, [weight(e) for e in events])
                events = []
            if event is None:
                self.lost += 1
                reason = Reason.SPILL_LOST
            else:
                reason = _REASONS.get(event.body, Reason.INVALID_EVENT)
                self.invalid += reason == Reason.INVALID_EVENT
            buf.retire_beyond_locked(1, reason)
            buf.count_locked(reason)
            bad += 1
        if events:
            buf.rejoin_locked(events, [weight(e) for e in events])
        return bad

    def remember(self, first: int, items: list[Item]) -> None:
        """``items`` read back are numbered here from ``first``: where each came from."""
        self.spans.append(Span(first, [(stream, seq) for stream, seq, _ in items], len(items)))

    def origins(self, first: int, end: int) -> list[tuple[str, int]]:
        """Where the events numbered ``[first, end)`` here came from (spans forgotten once all
        their events are settled)."""
        spans = self.spans
        out: list[tuple[str, int]] = []
        i = max(0, bisect_right([span.first for span in spans], first) - 1)
        while i < len(spans) and spans[i].first < end:
            span = spans[i]
            lo, hi = max(first, span.first), min(end, span.first + len(span.origins))
            if lo < hi:
                out.extend(span.origins[lo - span.first : hi - span.first])
                span.left -= hi - lo
            i += 1
        self.spans = [span for span in spans if span.left > 0]
        self.foreign.remove(first, end)
        return out

    def adopted(self) -> int:
        """Events of dead owners not read back yet."""
        return sum(run.remaining for run in list(self.runs) if not run.own)

    def close(self) -> None:
        for run in self.runs:
            run.close()


def _writable(ser: SerializedEvent | None, disk: Disk) -> SerializedEvent:
    """What is written for an overflow event: itself, or its tombstone."""
    if ser is None:
        return _TOMBSTONES[Reason.INVALID_EVENT]
    return ser if disk.holds(ser) else _TOMBSTONES[Reason.DROPPED_SPILL_FULL]


def _is_json_object(body: bytes) -> bool:
    if body[:1] != b"{":
        return False
    try:
        return isinstance(orjson.loads(body), dict)
    except orjson.JSONDecodeError:
        return False
