"""The spill's files on disk: one owner's segments (appended to, bounded, deleted once settled,
a failing disk counted and warned about), and what ``outbox check`` reads of a directory.
See ``_spill`` for the whole, ``_spillfmt`` for the records."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections import deque
from typing import Any

from ._log import RateLimitedLog
from ._spillfmt import HEADER, parse

__all__ = [
    "RETRY_AFTER",
    "SEGMENT_BYTES",
    "Segments",
    "Unwritten",
    "inspect_dir",
    "owner_segments",
    "read_checkpoint",
]

#: A segment is closed (and a new one begun) past this size.
SEGMENT_BYTES = 4 * 1024 * 1024
#: Seconds before writing again after the disk failed.
RETRY_AFTER = 5.0
# Bytes of max_spill_bytes only void records may take: 64 of them (a void is one header), or
# an eighth of a smaller max_spill_bytes.
VOID_ROOM = 64 * HEADER
_INF = float("inf")

_DISK_ERRORS = {
    errno.ENOSPC: "the disk is full: free space, or lower max_spill_bytes",
    errno.EDQUOT: "the disk quota is exceeded: raise it, or lower max_spill_bytes",
    errno.EFBIG: "a file size limit was hit (ulimit -f): raise it",
    errno.EACCES: "permission denied: make the directory writable by this process",
    errno.EPERM: "permission denied: make the directory writable by this process",
    errno.EROFS: "the filesystem is read-only: point spill_dir at a writable one",
    errno.EIO: "an I/O error: check the disk",
}


def _fix(exc: OSError) -> str:
    return _DISK_ERRORS.get(exc.errno or 0, "check the directory")


class _Segment:
    __slots__ = ("max_seq", "path", "size")

    def __init__(self, path: str) -> None:
        self.path, self.size, self.max_seq = path, 0, -1


class Segments:
    """The segments of one owner (``OWNER-NNNNNNNN.seg`` in ``directory``), within ``max_bytes``.

    Records that cannot be written are counted in ``not_spilled`` by reason: ``spill_full``
    (``max_bytes`` reached) and ``spill_failed`` (the disk failed; warned about with the path
    and the fix, and tried again after ``RETRY_AFTER``).
    """

    def __init__(self, directory: str, owner: str, max_bytes: int, log: RateLimitedLog) -> None:
        self.directory, self.owner, self.max_bytes, self.log = directory, owner, max_bytes, log
        # Small enough that settled segments free room well within the bound.
        self._segment_bytes = min(SEGMENT_BYTES, max(4096, max_bytes // 8))
        self.void_room = min(VOID_ROOM, max_bytes // 8)
        self._segments: deque[_Segment] = deque()
        self._current: _Segment | None = None
        self.fd = -1
        self._seg_no = 0
        self._retry_at = -_INF
        self.disk_bytes = 0
        self.written = 0
        self.not_spilled: dict[str, int] = {}
        #: Failed writes by errno name (ENOSPC, EACCES, EROFS, EIO, ...).
        self.failures: dict[str, int] = {}
        #: Where the last write began: (segment number, offset).
        self.start = (0, 0)
        #: Whether the last write found ``max_bytes`` reached.
        self.full = False
        #: (highest seq of a write, its wall time): the age of the oldest unsettled one.
        self.marks: deque[tuple[int, float]] = deque()

    def __len__(self) -> int:
        return len(self._segments) + (self._current is not None)

    def append(self, entries: list[tuple[int, bytes]], at: float, count: bool = True) -> int:
        """Append records, ``(seq, record)`` in order (seq -1: a void record), within
        ``max_spill_bytes``: what does not fit is counted ``spill_full`` and not written
        (``count`` False: not counted, the caller keeps them).  Returns how many of the
        first records were written; ``start`` is where (segment number, offset)."""
        if not entries:
            return 0
        if time.monotonic() < self._retry_at:
            if count:
                self.count("spill_failed", sum(seq >= 0 for seq, _ in entries))
            return 0
        room = self.max_bytes - self.disk_bytes
        fit = size = 0
        for seq, record in entries:
            # Events leave VOID_ROOM: a void record, which takes back records of events counted
            # lost, fits where events no longer do (else a successor would deliver those).
            if size + len(record) > (room if seq < 0 else room - self.void_room):
                break
            size += len(record)
            fit += 1
        self.full = fit < len(entries)
        if self.full:
            if count:
                self.count("spill_full", sum(seq >= 0 for seq, _ in entries[fit:]))
            self.log.warning(
                "spill-full",
                "spill: %s holds max_spill_bytes (%d bytes); events are not written to disk "
                "until delivered ones free room (raise max_spill_bytes for longer outages)",
                self.directory,
                self.max_bytes,
            )
            entries = entries[:fit]
        n = sum(seq >= 0 for seq, _ in entries)
        if not entries:
            return 0
        try:
            segment = self._segment()
            self.start = (self._seg_no, segment.size)
            view = memoryview(b"".join(record for _, record in entries))
            while view:
                wrote = os.write(self.fd, view)
                segment.size += wrote
                self.disk_bytes += wrote
                view = view[wrote:]
        except OSError as exc:
            self._failed(exc, n if count else 0)
            return 0
        last_seq = max(seq for seq, _ in entries)
        segment.max_seq = max(segment.max_seq, last_seq)
        self.written += n
        if n:
            self.marks.append((last_seq, at))
        if segment.size >= self._segment_bytes:
            self._close_segment()
        return len(entries)

    def _segment(self) -> _Segment:
        if self._current is None:
            self._seg_no += 1
            segment = _Segment(self.path_of(self._seg_no))
            self.fd = os.open(segment.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            self._current = segment
        return self._current

    def _close_segment(self) -> None:
        if self._current is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
            self._segments.append(self._current)
            self._current = None

    def room(self) -> int:
        """Bytes the next append may write of events: none while the disk is failing."""
        return 0 if self.failing else max(0, self.max_bytes - self.disk_bytes - self.void_room)

    @property
    def failing(self) -> bool:
        """Whether the disk failed less than ``RETRY_AFTER`` ago."""
        return time.monotonic() < self._retry_at

    @property
    def last_segment(self) -> int:
        return self._seg_no

    def path_of(self, number: int) -> str:
        return os.path.join(self.directory, f"{self.owner}-{number:08d}.seg")

    def _failed(self, exc: OSError, n: int) -> None:
        self.count("spill_failed", n)
        self._retry_at = time.monotonic() + RETRY_AFTER
        self._close_segment()  # a torn tail stays at its end; the next write begins a new one
        self.failed(exc)

    def failed(self, exc: OSError) -> None:
        """A write to the directory failed (a segment's, or the checkpoint's): counted by
        errno, and warned about with the path and the fix (the writer tries again after
        ``RETRY_AFTER``)."""
        name = errno.errorcode.get(exc.errno or 0, "EOTHER")
        self.failures[name] = self.failures.get(name, 0) + 1
        self.log.warning(
            "spill-failed",
            "spill: writing to %s failed (%s): %s; the outbox goes on in memory and tries the disk "
            "again in %g s",
            self.directory,
            exc.strerror or exc,
            _fix(exc),
            RETRY_AFTER,
        )

    def count(self, reason: str, n: int) -> None:
        if n:
            self.not_spilled[reason] = self.not_spilled.get(reason, 0) + n

    def forget_below(self, lowest: int) -> None:
        """Delete the segments whose events are all below ``lowest`` (settled)."""
        while self.marks and self.marks[0][0] < lowest:
            self.marks.popleft()
        while self._segments and self._segments[0].max_seq < lowest:
            self._delete(self._segments.popleft())
        current = self._current
        if current is not None and 0 <= current.max_seq < lowest:
            # All settled (the backend keeps up): begin afresh rather than let it grow.
            self._close_segment()
            self._delete(self._segments.pop())

    def close(self, delete: bool) -> None:
        """Close the current segment; ``delete``: all of them are settled, remove them."""
        self._close_segment()
        if delete:
            for segment in self._segments:
                self._delete(segment)
            self._segments.clear()

    def _delete(self, segment: _Segment) -> None:
        with contextlib.suppress(OSError):
            os.unlink(segment.path)
        self.disk_bytes -= segment.size


class Unwritten:
    """What of the accepted events the disk did not take (full, failing): each counted once in
    ``Segments.not_spilled`` however often it is tried again, and the *holes*, ranges
    ``[first, end)`` of events that left the queue for a transport before the disk took them
    (no later write can take them): not on disk until settled, then forgotten."""

    def __init__(self, disk: Segments) -> None:
        self.disk = disk
        self.counted_upto = 0  # events before this were counted (if they were not written)
        self.holes: deque[list[int]] = deque()  # oldest first

    def count(self, records: list[tuple[int, bytes]]) -> None:
        """``records`` (``(seq, record)``, seq -1 a void) were not written: count the events
        not counted yet."""
        counted = self.counted_upto
        n = sum(seq >= counted for seq, _ in records)
        if n:
            self.disk.count("spill_failed" if self.disk.failing else "spill_full", n)
        if records:
            self.counted_upto = max(counted, records[-1][0] + 1)

    def count_range(self, first: int, end: int) -> None:
        """The events ``first`` to ``end`` were not written (not even tried)."""
        n = end - max(first, self.counted_upto)
        if n > 0:
            self.disk.count("spill_failed" if self.disk.failing else "spill_full", n)
            self.counted_upto = end

    def hole(self, first: int, end: int) -> None:
        holes = self.holes
        if holes and holes[-1][1] == first:
            holes[-1][1] = end
        else:
            holes.append([first, end])

    def void(self, seq: int) -> None:
        """The events from ``seq`` on were shed (settled) and their numbers are given again."""
        self.counted_upto = min(self.counted_upto, seq)
        holes = self.holes
        while holes and holes[-1][0] >= seq:
            holes.pop()
        if holes and holes[-1][1] > seq:
            holes[-1][1] = seq

    def settled(self, lowest: int | float) -> None:
        """Every event below ``lowest`` is settled: forget the holes below it."""
        holes = self.holes
        while holes and holes[0][1] <= lowest:
            holes.popleft()

    def missing(self, written_upto: int, head: int, end: int, lowest: int) -> int:
        """How many of the events held (the oldest ``lowest``, the queue from ``head`` to
        ``end``) are not on disk, at most: those queued from the write position
        (``written_upto``) on, and those in the holes."""
        return max(0, end - max(written_upto, head)) + self.in_holes(lowest, end)

    def in_holes(self, lowest: int, end: int) -> int:
        """How many events from ``lowest`` to ``end`` are in holes (settled ones included:
        the count errs towards loss, never towards a hand-on that did not happen)."""
        return sum(max(0, min(stop, end) - max(first, lowest)) for first, stop in self.holes)


def owner_segments(directory: str, owner: str) -> list[str]:
    """The paths of ``owner``'s segments in ``directory``, oldest first."""
    prefix = f"{owner}-"
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    segs = [n for n in names if n.startswith(prefix) and n.endswith(".seg")]
    return [os.path.join(directory, n) for n in sorted(segs)]


def read_checkpoint(path: str) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def inspect_dir(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The state of a spill directory, for ``outbox check``: whether it is writable, its
    owners (alive or not), segments, bytes, and the time of its oldest record."""
    path = os.fspath(directory)
    state: dict[str, Any] = {"path": path, "exists": os.path.isdir(path)}
    if not state["exists"]:
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        state["writable"] = os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)
        return state
    state["writable"] = os.access(path, os.W_OK | os.X_OK)
    names = sorted(os.listdir(path))
    segments = [n for n in names if n.endswith(".seg")]
    owners = [n[:-5] for n in names if n.endswith(".lock") and not n.startswith(".")]
    alive = 0
    for owner in owners:
        try:
            fd = os.open(os.path.join(path, f"{owner}.lock"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            alive += 1
        finally:
            os.close(fd)
    oldest: float | None = None
    size = 0
    for name in segments:
        full = os.path.join(path, name)
        with contextlib.suppress(OSError):
            size += os.path.getsize(full)
            with open(full, "rb") as f:
                head = f.read(64 * 1024)
            for record in parse(head):
                if not isinstance(record, int):
                    oldest = record.at if oldest is None else min(oldest, record.at)
                    break
    state.update(
        owners_alive=alive,
        owners_gone=len(owners) - alive,
        segments=len(segments),
        bytes=size,
        oldest_event_age=None if oldest is None else max(0.0, time.time() - oldest),
    )
    return state
