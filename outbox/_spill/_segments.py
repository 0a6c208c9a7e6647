"""This owner's segments: appended to within ``max_spill_bytes``, a write cut short taken back,
a failing disk counted and tried again later.  Records are appended whole or not at all, as far
as anyone reading the files can tell: a write the disk cuts short (ENOSPC, EFBIG, EIO) is cut
back to its last whole record (or, if that fails, the segment is closed with the torn bytes at
its end, which readers skip), and the caller learns exactly which records are on disk."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from itertools import accumulate

from .._log import RateLimitedLog
from ._format import file_header
from ._streams import SegFile, Streams

__all__ = ["RETRY_AFTER", "SEGMENT_BYTES", "Writer"]

#: A segment is closed (and a new one begun) past this size.
SEGMENT_BYTES = 4 * 1024 * 1024
#: Seconds before writing again after the disk failed.
RETRY_AFTER = 5.0
#: Bytes of ``max_spill_bytes`` that only settlements may use (or an eighth of a smaller one):
#: a full spill still takes the records that say its events were settled.
SETTLE_ROOM = 64 * 1024
_INF = float("inf")

_FIXES = {
    errno.ENOSPC: "the disk is full: free space, or lower max_spill_bytes",
    errno.EDQUOT: "the disk quota is exceeded: raise it, or lower max_spill_bytes",
    errno.EFBIG: "a file size limit was hit (ulimit -f): raise it",
    errno.EACCES: "permission denied: make the directory writable by this process",
    errno.EPERM: "permission denied: make the directory writable by this process",
    errno.EROFS: "the filesystem is read-only: point spill_dir at a writable one",
    errno.EIO: "an I/O error: check the disk",
}


class Writer:
    """The segments of stream ``stream`` in ``directory`` (``NNNNNNNN.seg``), within
    ``max_bytes`` (the bytes of this owner's own segments).  Failed writes are counted by errno
    in ``failures`` and warned about (with the path and the fix) once per ``log``'s interval."""

    def __init__(self, directory: str, stream: str, max_bytes: int, log: RateLimitedLog, streams: Streams):
        self.directory, self.stream, self.max_bytes, self.log = directory, stream, max_bytes, log
        self.streams = streams
        # Small enough that settled segments free room well within the bound.
        self.segment_bytes = min(SEGMENT_BYTES, max(4096, max_bytes // 8))
        self.settle_room = min(SETTLE_ROOM, max_bytes // 8)
        self.current: SegFile | None = None
        self.fd = -1
        self.number = 0
        self.retry_at = -_INF
        #: Bytes of this owner's own segments.
        self.disk_bytes = 0
        #: Failed writes, by errno name (ENOSPC, EACCES, ...).
        self.failures: dict[str, int] = {}
        #: The last append found ``max_bytes`` reached.
        self.full = False
        #: Where the last append began: (segment number, offset), and in which segment.
        self.start = (0, 0)
        self.last: SegFile | None = None

    @property
    def failing(self) -> bool:
        """Whether the disk failed less than ``RETRY_AFTER`` ago."""
        return time.monotonic() < self.retry_at

    def room(self) -> int:
        """Bytes the next append may write of events: none while the disk is failing."""
        return 0 if self.failing else max(0, self.max_bytes - self.disk_bytes - self.settle_room)

    def path_of(self, number: int) -> str:
        return os.path.join(self.directory, f"{number:08d}.seg")

    def append(self, records: list[bytes], *, settles: bool = False) -> int:
        """Append ``records`` in order (``settles``: settlements, which may use the room kept
        for them).  Returns how many of the first ones are on disk, whole; the rest were not
        written (full: ``full`` is set; failing: counted and warned about)."""
        if not records or self.failing:
            return 0
        room = self.max_bytes - self.disk_bytes - (0 if settles else self.settle_room)
        ends = list(accumulate(len(record) for record in records))
        fit = next((i for i, end in enumerate(ends) if end > room), len(records))
        self.full = fit < len(records)
        if self.full:
            self.log.warning(
                "spill-full",
                "spill: %s holds max_spill_bytes (%d bytes); events are not written to disk until "
                "delivered ones free room (raise max_spill_bytes for longer outages)",
                self.directory,
                self.max_bytes,
            )
        if not fit:
            return 0
        data = memoryview(b"".join(records[:fit]))
        wrote = 0
        try:
            segment = self.last = self._segment()
            self.start = (self.number, segment.size)
            while wrote < len(data):
                wrote += os.write(self.fd, data[wrote:])
        except OSError as exc:
            whole = next((i for i, end in enumerate(ends[:fit]) if end > wrote), fit)
            self._cut(wrote, ends[whole - 1] if whole else 0)
            if whole and settles and self.last is not None:
                self.last.settles = True
            self._failed(exc)
            return whole
        segment.size += wrote
        self.disk_bytes += wrote
        if settles:
            segment.settles = True
        if segment.size >= self.segment_bytes:
            self.rotate()
        return fit

    def _cut(self, wrote: int, keep: int) -> None:
        """A write cut short after ``wrote`` bytes: back to the ``keep`` bytes that are whole
        records (or, if the disk will not, the segment is closed with a torn tail)."""
        segment = self.current
        if segment is None or self.fd < 0:
            return
        try:
            if wrote > keep:
                os.ftruncate(self.fd, segment.size + keep)
        except OSError:
            keep = wrote  # the torn bytes stay: readers skip them; nothing is appended after
            segment.size += keep
            self.disk_bytes += keep
            self.rotate()
            return
        segment.size += keep
        self.disk_bytes += keep

    def _segment(self) -> SegFile:
        if self.current is None:
            self.number += 1
            path = self.path_of(self.number)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            header = file_header(self.stream)
            try:
                written = os.write(fd, header)
                if written != len(header):
                    raise OSError(errno.ENOSPC, "the header was cut short")
            except OSError:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
            segment = SegFile(path, self.stream, size=len(header))
            self.disk_bytes += len(header)
            self.fd, self.current = fd, segment
            self.streams.files.append(segment)
        return self.current

    def rotate(self) -> None:
        """Close the current segment: the next append begins a new one."""
        if self.current is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
            self.current = None

    def freed(self, nbytes: int) -> None:
        self.disk_bytes -= nbytes

    def _failed(self, exc: OSError) -> None:
        self.retry_at = time.monotonic() + RETRY_AFTER
        self.failed(exc)

    def failed(self, exc: OSError) -> None:
        """A write to the directory failed: counted by errno, warned about with the fix."""
        name = errno.errorcode.get(exc.errno or 0, "EOTHER")
        self.failures[name] = self.failures.get(name, 0) + 1
        self.log.warning(
            "spill-failed",
            "spill: writing to %s failed (%s): %s; the outbox goes on in memory and tries the disk "
            "again in %g s",
            self.directory,
            exc.strerror or exc,
            _FIXES.get(exc.errno or 0, "check the directory"),
            RETRY_AFTER,
        )
