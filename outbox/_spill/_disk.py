"""This owner's log on disk: its segments within ``max_spill_bytes``, its settlements, its reserve.
A write the disk cuts short closes its segment and says which records are on disk, whole.  No
buffer here: the spill hands it events, settlements and the lock to hold around its bookkeeping.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Collection
from contextlib import AbstractContextManager
from itertools import accumulate
from typing import Any

from .._observability._log import RateLimitedLog, never_silent
from .._run._serde import SerializedEvent
from ._format import VOUCHED, encode_event, encode_settle, file_header, record_size
from ._names import make_own
from ._owners import RESERVE, Home, prune_all
from ._ranges import Ranges
from ._streams import SegFile, Streams

__all__ = ["RETRY_AFTER", "SEGMENT_BYTES", "SETTLE_ROOM", "Disk"]

#: A segment is closed (and a new one begun) past this size (or an eighth of max_spill_bytes).
SEGMENT_BYTES = 4 * 1024 * 1024
#: Seconds before writing again after the disk failed.
RETRY_AFTER = 5.0
#: Bytes of max_spill_bytes only settlements may use (or an eighth of a smaller one), and kept
#: allocated in ``RESERVE`` until a settlement finds the disk full: a full spill, or a full disk,
#: still takes the records that say its events were settled.
SETTLE_ROOM = 64 * 1024
#: The smallest reserve worth keeping (a hundred settlement records or so).
_PAGE = 4096
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
_FIXES = {
    errno.ENOSPC: "the disk is full: free space, or lower max_spill_bytes",
    errno.EDQUOT: "the disk quota is exceeded: raise it, or lower max_spill_bytes",
    errno.EFBIG: "a file size limit was hit (ulimit -f): raise it",
    errno.EACCES: "permission denied: make the directory writable by this process",
    errno.EPERM: "permission denied: make the directory writable by this process",
    errno.EROFS: "the filesystem is read-only: point spill_dir at a writable one",
    errno.EIO: "an I/O error: check the disk",
}


class Disk:
    """The log of the owner ``home``: its segments (``NNNNNNNN.seg`` in its directory) within
    ``max_bytes``, what they hold (``streams``), and its failed writes (by errno: ``failures``)."""

    def __init__(self, home: Home, max_bytes: int, log: RateLimitedLog) -> None:
        self.home, self.max_bytes, self.log = home, max_bytes, log
        self.streams = Streams(home.owner)
        self.own = self.streams.stream(home.owner)
        # Small enough that settled segments free room well within the bound.
        self.segment_bytes = min(SEGMENT_BYTES, max(4096, max_bytes // 8))
        self.settle_room = min(SETTLE_ROOM, max_bytes // 8)
        #: The largest record the spill could ever hold (in an empty segment of its own).
        self.most = max_bytes - self.settle_room - len(file_header(home.owner))
        #: The segment appended to (``fd``), and the one the last write wrote to.
        self.current: SegFile | None = None
        self.last: SegFile | None = None
        # (numbered after the segments of a dead owner whose directory this one took over)
        self.fd, self.number, self.retry_at = -1, _last_number(home), -float("inf")
        self.failures: Counter[str] = Counter()
        #: The last write found max_bytes reached; RESERVE is allocated; the disk was full.
        self.full = self.full_disk = False
        #: Bytes ``RESERVE`` holds (0: none); only a whole ``settle_room`` lets events be
        #: written again on a full disk (a part of one keeps what is left for settlements).
        self.reserve = 0
        #: Settlement records not yet on disk: (record, its events, whether it says "lost").
        self.unsettled: list[tuple[bytes, int, bool]] = []
        #: Events written in all; accepted events the disk refused, by why (each counted once).
        self.written = self.counted_upto = 0
        self.not_spilled: Counter[str] = Counter()
        #: (the last number of a write, its wall time): the age of the oldest live event.
        self.marks: deque[tuple[int, float]] = deque()
        self.keep_reserve()

    def carry_counts(self, before: Disk) -> None:
        """Go on counting from what ``before`` (this owner's last files, vanished) counted."""
        self.written, self.counted_upto = before.written, before.counted_upto
        self.failures.update(before.failures)
        self.not_spilled.update(before.not_spilled)
        self.streams.damage.update(before.streams.damage)

    @property
    def failing(self) -> bool:
        """Whether the disk failed less than ``RETRY_AFTER`` ago."""
        return time.monotonic() < self.retry_at

    @property
    def refusing(self) -> bool:
        """Whether events are not written: the disk is failing, or full with the reserve spent
        (what room the disk has is the settlements', until the reserve can be made again)."""
        return self.failing or (self.full_disk and self.reserve < self.settle_room)

    def holds(self, event: SerializedEvent) -> bool:
        """Whether the spill could ever hold ``event``'s record (an empty one of the stream)."""
        return record_size(event) <= self.most

    def room(self) -> int:
        """Bytes the next append may write of events: none while the disk refuses them."""
        return 0 if self.refusing else max(0, self.max_bytes - self.size - self.settle_room)

    @property
    def size(self) -> int:
        """Bytes of this owner's segments (what ``max_bytes`` bounds)."""
        return sum(seg.size for seg in self.streams.files if seg.stream == self.home.owner)

    def append(
        self, events: list[tuple[int, SerializedEvent]], lock: AbstractContextManager[Any], drain: Any
    ) -> int:
        """Append this owner's events (``(number, event)``, ascending); returns how many of the
        first are on disk, the rest counted refused.  ``drain()`` (the buffer's settlements taken
        in) and the files they free go first when the disk has no room for them."""
        at = time.time()
        records = [encode_event(seq, at, ser) for seq, ser in events]
        self.look_at_reserve()
        if self.room() < sum(map(len, records)):
            drain()
            self.make_room()
        wrote, segment = self.write(records), self.last
        if wrote and segment is not None:
            runs = Ranges((seq, seq + 1) for seq, _ in events[:wrote])
            with lock:
                for first, end in runs:
                    self.own.written(first, end)
                    segment.numbers.add(first, end)
            self.written += wrote
            self.marks.append((events[wrote - 1][0], at))
        if wrote < len(events):
            self.refused(events[wrote][0], events[-1][0] + 1, len(events) - wrote)
        return wrote

    def refused(self, first: int, end: int, n: int | None = None) -> None:
        """Events from ``first`` (``n`` of them, or every number to ``end``) were not written:
        counted once each, however often they are tried again."""
        if end > self.counted_upto:
            count = n if n is not None and first >= self.counted_upto else end - max(first, self.counted_upto)
            self.not_spilled["spill_failed" if self.refusing else "spill_full"] += count
            self.counted_upto = end

    def settled(self, by: dict[tuple[str, str], Ranges]) -> None:
        """Numbers settled, by (stream, outcome): out of the live sets (the caller holds the
        buffer's lock), and to be written down."""
        for (stream, outcome), ranges in by.items():
            held, pairs = self.streams.stream(stream), list(ranges)
            for i in range(0, len(pairs), 4096):
                part = pairs[i : i + 4096]
                live = 0  # (what a successor would replay: events never written are not)
                for first, end in part:
                    live += held.live.count(first, end)
                    held.settle(first, end)
                self.unsettled.append((encode_settle(stream, outcome, part), live, outcome != "delivered"))

    def unsettled_events(self, losses: bool) -> int:
        """Events on disk settled here (lost, or delivered) whose settlement is not on disk yet."""
        return sum(n for _, n, lost in self.unsettled if lost == losses)

    def tell_unsettled_deliveries(self) -> None:
        """At the close: say once if delivered events' settlements could not be written."""
        if again := self.unsettled_events(losses=False):
            never_silent(
                logging.WARNING,
                "spill: %d event(s) were delivered, but that could not be written down in %s (%s): "
                "the next outbox started with it delivers them again",
                again,
                self.home.root,
                ", ".join(sorted(self.failures)) or "the disk fails",
            )

    def write_settlements(self) -> None:
        if self.unsettled:
            del self.unsettled[: self.write([record for record, _, _ in self.unsettled], settles=True)]

    def write(self, records: list[bytes], settles: bool = False) -> int:
        """Append ``records``; returns how many of the first are on disk, whole.  Settlements
        (``settles``) are not held to ``max_bytes`` (see ``_write``), and may use the reserve
        once the disk is full."""
        fit = self._write(records, settles)
        if settles and fit < len(records) and self.reserve and self.full_disk:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.home.path, RESERVE))
            self.reserve, self.retry_at = 0, -float("inf")
            fit += self._write(records[fit:], settles)
        return fit

    def _write(self, records: list[bytes], settles: bool) -> int:
        if not records or (self.failing if settles else self.refusing):
            return 0
        ends = list(accumulate(map(len, records)))
        # Settlements are not held to max_bytes (the disk alone refuses them): a settlement not
        # written lets a successor deliver what this owner counted lost, or send again what it
        # delivered.  They fill settle_room first; past it (this owner's own events kept live in
        # its files, an adopted backlog settled beside them) they go on, tens of bytes a batch,
        # in files that go at the next checkpoint.
        fit = len(records) if settles else bisect_right(ends, self.max_bytes - self.size - self.settle_room)
        if not settles:
            self.full = fit < len(records)
        if self.full and not settles:
            self.log.warning(
                "spill-full",
                "spill: %s holds max_spill_bytes (%d bytes); events are not written to disk until delivered "
                "ones free room (raise max_spill_bytes for longer outages)",
                self.home.root,
                self.max_bytes,
            )
        if not fit:
            return 0
        data, wrote = memoryview(b"".join(records[:fit])), 0
        try:
            segment = self.last = self._segment()
            while wrote < len(data):
                wrote += os.write(self.fd, data[wrote:])
        except OSError as exc:
            self.failed(exc)
            if self.current is None:  # (no segment could be begun)
                return 0
            # Cut short: the whole records are on disk, and nothing is appended after a torn one.
            self.rotate()
            fit = bisect_right(ends, wrote)
        segment.size += wrote
        segment.settles = segment.settles or (settles and fit > 0)
        if segment.size >= self.segment_bytes:
            self.rotate()
        return fit

    def _segment(self) -> SegFile:
        if self.current is None:
            fd = -1
            while fd < 0:  # (a name no file has: never another's, in a directory taken over)
                self.number += 1
                path = os.path.join(self.home.path, f"{self.number:08d}.seg")
                with contextlib.suppress(FileExistsError):
                    fd = os.open(path, _NEW, 0o644)
            header = file_header(self.home.owner, VOUCHED)  # (events come from ``serialized``)
            try:
                if os.write(fd, header) != len(header):
                    raise OSError(errno.ENOSPC, "the header was cut short")
            except OSError:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
            self.fd, self.current = fd, SegFile(path, self.home.owner, len(header))
            self.streams.files.append(self.current)
        return self.current

    def rotate(self) -> None:
        """Close the current segment: the next write begins a new one."""
        if self.current is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd, self.current = -1, None

    def failed(self, exc: OSError) -> None:
        """A write failed: counted by errno, warned about with the fix, tried again later."""
        self.retry_at = time.monotonic() + RETRY_AFTER
        self.full_disk = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        self.failures[errno.errorcode.get(exc.errno or 0, "EOTHER")] += 1
        self.log.warning(
            "spill-failed",
            "spill: writing to %s failed (%s): %s; the outbox goes on in memory and tries the disk "
            "again in %g s",
            self.home.root,
            exc.strerror or exc,
            _FIXES.get(exc.errno or 0, "check the directory"),
            RETRY_AFTER,
        )

    def keep_reserve(self) -> None:
        """Allocate ``RESERVE`` if it is not whole (the disk has room for it again):
        ``settle_room``, or as much of it as the disk has, halving down to a page.  An owner made
        on a full disk by freeing a dead owner's reserve has a little less than one left; with
        none, its settlements would go unwritten, and a successor deliver again, or count lost,
        what it delivered.  A part of one is the settlements' only: events wait for a whole one.
        What stands at its name and is not a file of its own (a link, a FIFO) is replaced."""
        if self.failing or self.reserve >= self.settle_room:
            return
        path = os.path.join(self.home.path, RESERVE)
        try:
            fd = make_own(path)
        except OSError:
            return
        try:
            size, least = self.settle_room, min(_PAGE, self.settle_room)
            while size > self.reserve and size >= least:
                try:
                    os.posix_fallocate(fd, 0, size)
                    self.reserve = size
                except OSError:
                    os.ftruncate(fd, self.reserve)  # (what a failed allocation kept)
                    size //= 2
        except OSError:
            pass
        finally:
            os.close(fd)
        if not self.reserve:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def look_at_reserve(self) -> None:
        """At a write: a reserve an operator removed (or cut) is made again at the next
        :meth:`keep_reserve`.  Looked at when writing only, as the lock file is: an ``rm -rf``
        of an idle owner's directory is not undone under it."""
        if self.reserve:
            try:
                found = os.lstat(os.path.join(self.home.path, RESERVE))
            except OSError:
                self.reserve = 0
                return
            # (a link or another's file in its place frees nothing: made again)
            ours = stat.S_ISREG(found.st_mode) and found.st_nlink <= 1
            self.reserve = min(self.reserve, found.st_size) if ours else 0

    def make_room(self) -> None:
        """Write the settlements down, delete the files that frees, allocate the reserve again."""
        self.write_settlements()
        self.forget()
        if not self.unsettled:
            self.keep_reserve()

    def forget(self) -> None:
        """Delete the files none of whose events is live; when their settlements may still be
        needed, a checkpoint first, in a segment that stays."""
        streams = self.streams
        dead = streams.deletable()
        if not dead:
            return
        if self.current in dead:
            self.rotate()  # (a checkpoint goes to a segment that stays)
        # (No records: no settled number has an event record on disk, nothing to restate.)
        if streams.needs_checkpoint(dead) and (records := streams.checkpoint()):
            if self.write(records, settles=True) < len(records):
                return  # the settlements stay until a checkpoint can be written
            streams.checkpoint_file = self.last
        streams.forget(dead, [self.home.path])
        lowest = self.own.live.first()
        while self.marks and (lowest is None or self.marks[0][0] < lowest):
            self.marks.popleft()

    def drop_all(self, spare: Collection[str] = (), keep: Collection[str] = ()) -> None:
        """Delete every file but the paths ``spare`` (nothing else is handed on), and the
        directories left empty but ``keep`` (this owner's own, unless it goes too)."""
        self.rotate()
        kept = {seg.stream for seg in self.streams.files if seg.path in spare}
        keep = keep or [self.home.path]
        self.streams.forget([seg for seg in self.streams.files if seg.path not in spare], keep)
        prune_all(self.home.path, keep)  # (files or not; its adopted owners' too)
        for name, stream in self.streams.streams.items():
            if name not in kept:
                stream.live = Ranges()

    def oldest_age(self) -> float:
        return max(0.0, time.time() - self.marks[0][1]) if self.marks else 0.0


def _last_number(home: Home) -> int:
    """The number of the last segment in ``home``'s directory (of a dead owner's, taken over)."""
    names = [os.path.basename(path)[:-4] for path in home.taken[1]] if home.taken else []
    return max((int(name) for name in names if name.isdigit()), default=0)
