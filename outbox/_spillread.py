"""Reading the spill's stretch back (see ``_window``): this owner's records, from where the
stretch began, in order, a bounded number of bytes at a time (one record, and a 64 KiB chunk
while resynchronizing after a corrupt one), never a whole segment."""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Callable

from ._serde import SerializedEvent, weight
from ._spillfmt import _FRAME, EVENT, MAGIC, MAX_PAYLOAD, Record, _decode

__all__ = ["StretchReader"]

_CHUNK = 64 * 1024


class StretchReader:
    """Records of segments ``path_of(n)``, ``n`` from ``start``'s, read in order by sequence
    number from ``expected`` on.  Records older than that (written twice after a failed write,
    or by a cover) are skipped; a gap (a torn or corrupt record) is handed back as ``None``, so
    that the caller counts it and the sequence numbers stay in step."""

    def __init__(self, path_of: Callable[[int], str]) -> None:
        self.path_of = path_of
        self.seg_no = 0
        self.offset = 0
        self.expected = 0
        # The segment being read, as a bare file descriptor read with os.pread: no buffered
        # file object, whose lock a fork could copy held (the sidecar mid-read), and which
        # the child's after-fork hook, closing this reader, would then wait on for ever.
        self._fd = -1
        self._pending: Record | None = None
        #: Offsets of corrupt stretches met: (segment path, offset).
        self.corrupt: list[tuple[str, int]] = []
        #: The last read reached the end of what is written (of the last segment).
        self.ended = False

    def start(self, seg_no: int, offset: int, seq: int) -> None:
        self.close()
        self.seg_no, self.offset, self.expected, self._pending = seg_no, offset, seq, None

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def read(self, max_events: int, max_bytes: int, last_seg_no: int) -> list[SerializedEvent | None]:
        """Up to ``max_events`` events (and ``max_bytes``, but at least one) of the stretch, in
        order; ``None`` for one that cannot be read.  Raises OSError if the disk fails."""
        out: list[SerializedEvent | None] = []
        nbytes = 0
        while len(out) < max_events:
            record = self._pending or self._next(last_seg_no)
            self._pending = None
            self.ended = record is None
            if record is None:
                break
            if record.kind != EVENT or record.seq < self.expected or record.event is None:
                continue
            while record.seq > self.expected and len(out) < max_events:
                out.append(None)
                self.expected += 1
            size = weight(record.event)
            if record.seq > self.expected or (out and nbytes + size > max_bytes):
                self._pending = record
                break
            out.append(record.event)
            nbytes += size
            self.expected += 1
        return out

    def skip(self, n: int) -> None:
        """``n`` events expected next are not on disk: go on after them."""
        self.expected += n

    def _open(self, last_seg_no: int) -> int:
        """The segment's file descriptor, or -1 past the last segment."""
        while self._fd < 0:
            try:
                self._fd = os.open(self.path_of(self.seg_no), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                if self.seg_no >= last_seg_no:
                    return -1
                self.seg_no, self.offset = self.seg_no + 1, 0
        return self._fd

    def _next_segment(self, last_seg_no: int) -> bool:
        if self.seg_no >= last_seg_no:
            return False
        if self.tail_left():
            self.corrupt.append((self.path_of(self.seg_no), self.offset))  # a torn tail
        self.close()
        self.seg_no, self.offset = self.seg_no + 1, 0
        return True

    def _next(self, last_seg_no: int) -> Record | None:
        while True:
            fd = self._open(last_seg_no)
            if fd < 0:
                return None
            head = os.pread(fd, _FRAME.size, self.offset)
            if len(head) < _FRAME.size:
                # The end of what is written (or a torn tail, if the writer has moved on).
                if self._next_segment(last_seg_no):
                    continue
                return None
            magic, length, crc = _FRAME.unpack(head)
            record = None
            if magic == MAGIC and length <= MAX_PAYLOAD:
                payload = os.pread(fd, length, self.offset + _FRAME.size)
                if len(payload) < length:
                    if self._next_segment(last_seg_no):
                        continue
                    return None
                if zlib.crc32(payload) == crc:
                    record = _decode(payload)
            if record is not None:
                self.offset += _FRAME.size + length
                return record
            self.corrupt.append((self.path_of(self.seg_no), self.offset))
            if not self._resync(fd) and not self._next_segment(last_seg_no):
                return None

    def tail_left(self) -> bool:
        """Whether the segment being read has bytes beyond what was read (a torn tail)."""
        if self._fd < 0:
            return False
        try:
            return os.fstat(self._fd).st_size > self.offset
        except OSError:
            return False

    def _resync(self, fd: int) -> bool:
        """Move to the next magic after a corrupt record, a chunk at a time."""
        pos = self.offset + 1
        while True:
            chunk = os.pread(fd, _CHUNK, pos)
            if len(chunk) < len(MAGIC):
                self.offset = pos + len(chunk)
                return False
            found = chunk.find(MAGIC)
            if found >= 0:
                self.offset = pos + found
                return True
            pos += len(chunk) - len(MAGIC) + 1
