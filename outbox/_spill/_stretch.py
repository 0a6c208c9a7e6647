"""The stretch: the events on disk only, read back in order as the queue has room.

It is a queue of *runs*, each some segment files and the numbers to hand out of them, by
stream: a run of this owner's own events (written from the memory window's overflow) or of a
dead owner's (adopted, read in place).  A run hands out, in file order, each record whose number
it still holds, once; whatever it holds when its last file is read to its end was damaged (a
*gap*, which the spill counts lost).  Memory: one record, or a 64 KiB chunk while resynchronizing.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

from .._serde import SerializedEvent, weight
from ._format import Event
from ._ranges import Ranges
from ._reader import NotOurs, SegmentReader

__all__ = ["Item", "Run", "Span", "Stretch"]

#: What a run hands out: (stream, number there, the event; None: a gap).
Item = tuple[str, int, SerializedEvent | None]


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
            self.reader = None

    def read(self, want: int, max_bytes: int) -> list[Item]:
        """Up to ``want`` events (and ``max_bytes``, at least one), in file order; once the last
        file is read to its end, what is still to hand out comes as gaps.  Raises OSError if
        the disk fails."""
        out: list[Item] = []
        nbytes = 0
        while len(out) < want and (not out or nbytes < max_bytes):
            record = self._next()
            if record is None:
                # Its last file read to its end: what it still holds is not there (each was
                # written whole before it was handed to this run).
                out.extend(self._gaps(want - len(out)))
                break
            stream, event = record
            out.append((stream, event.seq, event.event))
            nbytes += weight(event.event)
        return out

    def _gaps(self, n: int) -> list[Item]:
        out: list[Item] = []
        for stream, numbers in self.todo.items():
            while numbers and len(out) < n:
                seq = numbers.first()
                assert seq is not None
                numbers.remove(seq, seq + 1)
                out.append((stream, seq, None))
        return out

    def _next(self) -> tuple[str, Event] | None:
        while self.index < len(self.paths):
            if self.reader is None:
                reader = SegmentReader(self.paths[self.index])
                try:
                    reader.open()
                except (OSError, NotOurs):
                    self.index += 1
                    continue
                self.reader = reader
            record = self.reader.next()
            if record is None:
                if self.index >= len(self.paths) - 1:
                    return None  # the end of what is written: more may be appended
                self.close()
                self.index += 1
                continue
            if isinstance(record, int):
                self.damaged += 1
            elif isinstance(record, Event):
                numbers = self.todo.get(self.reader.stream)
                if numbers is not None and record.seq in numbers:
                    numbers.remove(record.seq, record.seq + 1)
                    return self.reader.stream, record
        return None


@dataclass(slots=True)
class Span:
    """Events read back from the stretch, in memory, numbered here from ``first``: where each
    came from (its stream, its number there), to settle it there."""

    first: int
    origins: list[tuple[str, int]]
    left: int


class Stretch:
    """The runs of one spill, and what was read back of them (see the module's docstring).

    Numbers given here to events of the stretch are *foreign*: their records are in their
    run's stream under the numbers the spans say, and they are never written again."""

    def __init__(self) -> None:
        self.runs: deque[Run] = deque()
        self.spans: list[Span] = []
        self.foreign = Ranges()

    def add(self, run: Run) -> None:
        self.runs.append(run)
        self.foreign.add(run.first, run.first + run.remaining)

    def own_tail(self, first: int) -> Run | None:
        """The last run if it is this owner's own and ends right before ``first``."""
        last = self.runs[-1] if self.runs else None
        if last is not None and last.own and last.first + last.remaining == first:
            return last
        return None

    def read(self, want: int, max_bytes: int) -> tuple[Run, list[Item]]:
        """Read the first run back (see :meth:`Run.read`)."""
        run = self.runs[0]
        return run, run.read(min(want, run.remaining), max_bytes)

    def taken(self, run: Run, first: int, items: list[Item]) -> None:
        """``items`` of ``run`` joined the queue (or were counted lost) numbered from ``first``."""
        self.spans.append(Span(first, [(stream, seq) for stream, seq, _ in items], len(items)))
        run.remaining -= len(items)
        if not run.remaining:
            self.runs.popleft()
            run.close()

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

    def held(self) -> int:
        """Events of the stretch (read back or not) not settled yet."""
        return len(self.foreign)

    def close(self) -> None:
        for run in self.runs:
            run.close()
