"""This owner's log on disk: its event and settlement records, what is live in each stream it
holds, and the files that can go.  No buffer here: the spill hands it events and settlements,
and holds the buffer's lock around :meth:`Disk.append`'s bookkeeping (``lock``)."""

from __future__ import annotations

import time
from collections import deque
from contextlib import AbstractContextManager
from typing import Any

from .._log import RateLimitedLog
from .._serde import SerializedEvent
from ._format import encode_event, encode_settle
from ._owners import Home
from ._ranges import Ranges
from ._segments import Writer
from ._streams import Streams

__all__ = ["Disk"]


def runs_of(seqs: Any) -> list[tuple[int, int]]:
    """Ascending numbers as ranges of consecutive ones."""
    out: list[tuple[int, int]] = []
    for seq in seqs:
        if out and out[-1][1] == seq:
            out[-1] = (out[-1][0], seq + 1)
        else:
            out.append((seq, seq + 1))
    return out


class Disk:
    """The log of the owner ``home`` (see the module's docstring), within ``max_bytes``."""

    def __init__(self, home: Home, max_bytes: int, log: RateLimitedLog) -> None:
        self.home, self.log = home, log
        self.streams = Streams(home.owner)
        self.own = self.streams.stream(home.owner)
        self.writer = Writer(home.path, home.owner, max_bytes, log, self.streams)
        #: Settlement records not yet on disk; ``unsettled_losses``: some say "lost".
        self.unsettled: list[bytes] = []
        self.unsettled_losses = False
        #: Events written in all; accepted events the disk refused, by why (each counted once).
        self.written = 0
        self.not_spilled: dict[str, int] = {}
        self.counted_upto = 0
        #: (the last number of a write, its wall time): the age of the oldest live event.
        self.marks: deque[tuple[int, float]] = deque()

    def append(
        self, events: list[tuple[int, SerializedEvent]], lock: AbstractContextManager[Any], drain: Any
    ) -> int:
        """Append this owner's events (``(number, event)``, ascending); returns how many of the
        first are on disk.  Those the disk refused are counted.  ``drain()`` settles what the
        buffer settled (called first when the disk has no room for them: the backend may just
        have freed some)."""
        at = time.time()
        records = [encode_event(seq, at, ser) for seq, ser in events]
        writer = self.writer
        if writer.room() < sum(map(len, records)):
            drain()
            self.make_room()
        wrote = writer.append(records)
        if wrote:
            segment = writer.last
            with lock:
                for first, end in runs_of(seq for seq, _ in events[:wrote]):
                    self.own.written(first, end)
                    if segment is not None:
                        segment.numbers.add(first, end)
            self.written += wrote
            self.marks.append((events[wrote - 1][0], at))
        if wrote < len(events):
            first = events[wrote][0]
            self.refused(first, events[-1][0] + 1, len(events) - wrote)
        return wrote

    def refused(self, first: int, end: int, n: int | None = None) -> None:
        """Events from ``first`` (``n`` of them, or every number to ``end``) were not written:
        counted once each, however often they are tried again."""
        if end <= self.counted_upto:
            return
        count = n if n is not None and first >= self.counted_upto else end - max(first, self.counted_upto)
        reason = "spill_failed" if self.writer.failing else "spill_full"
        self.not_spilled[reason] = self.not_spilled.get(reason, 0) + count
        self.counted_upto = end

    def settled(self, by: dict[tuple[str, str], Ranges]) -> None:
        """Numbers settled, by (stream, outcome): out of the live sets (the caller holds the
        buffer's lock), and to be written down."""
        for (stream, outcome), ranges in by.items():
            target = self.streams.stream(stream)
            pairs = list(ranges)
            for first, end in pairs:
                target.settle(first, end)
            for i in range(0, len(pairs), 4096):
                self.unsettled.append(encode_settle(stream, outcome, pairs[i : i + 4096]))
            self.unsettled_losses = self.unsettled_losses or outcome != "delivered"

    def write_settlements(self) -> None:
        if self.unsettled:
            del self.unsettled[: self.writer.append(self.unsettled, settles=True)]
            if not self.unsettled:
                self.unsettled_losses = False

    def make_room(self) -> None:
        """Write the settlements down, and delete the files that frees."""
        self.write_settlements()
        self.forget()

    def forget(self) -> None:
        """Delete the files none of whose events is live; when their settlements may still be
        needed, a checkpoint first, in a segment that stays."""
        streams, writer = self.streams, self.writer
        dead = streams.deletable()
        if not dead:
            return
        if streams.needs_checkpoint(dead):
            if writer.current is not None and writer.current in dead:
                writer.rotate()
            records = streams.checkpoint()
            if writer.append(records, settles=True) < len(records):
                return  # the settlements stay until a checkpoint can be written
            streams.checkpoint_file = writer.last
            dead = [seg for seg in dead if seg is not writer.last]
        if writer.current is not None and writer.current in dead:
            writer.rotate()
        writer.freed(streams.forget(dead, self.home.path))
        lowest = self.own.live.first()
        marks = self.marks
        while marks and (lowest is None or marks[0][0] < lowest):
            marks.popleft()

    def drop_all(self) -> None:
        """Delete every file (nothing is handed on)."""
        self.writer.rotate()
        self.streams.forget(list(self.streams.files), self.home.path)
        for stream in self.streams.streams.values():
            stream.live = Ranges()

    def oldest_age(self) -> float:
        marks = self.marks
        return max(0.0, time.time() - marks[0][1]) if marks else 0.0
