"""Reading the spill's stretch back (see ``_window``): this owner's records, from where the
stretch began, in order, a bounded number of bytes at a time (one record, and a 64 KiB chunk
while resynchronizing after a corrupt one), never a whole segment."""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Callable
from typing import BinaryIO

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
        self._file: BinaryIO | None = None
        self._pending: Record | None = None
        #: Offsets of corrupt stretches met: (segment path, offset).
        self.corrupt: list[tuple[str, int]] = []
        #: The last read reached the end of what is written (of the last segment).
        self.ended = False

    def start(self, seg_no: int, offset: int, seq: int) -> None:
        self.close()
        self.seg_no, self.offset, self.expected, self._pending = seg_no, offset, seq, None

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

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

    def _open(self, last_seg_no: int) -> BinaryIO | None:
        while self._file is None:
            try:
                f = open(self.path_of(self.seg_no), "rb")  # noqa: SIM115 (kept open between reads)
            except FileNotFoundError:
                if self.seg_no >= last_seg_no:
                    return None
                self.seg_no, self.offset = self.seg_no + 1, 0
                continue
            f.seek(self.offset)
            self._file = f
        return self._file

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
            f = self._open(last_seg_no)
            if f is None:
                return None
            f.seek(self.offset)
            head = f.read(_FRAME.size)
            if len(head) < _FRAME.size:
                # The end of what is written (or a torn tail, if the writer has moved on).
                if self._next_segment(last_seg_no):
                    continue
                return None
            magic, length, crc = _FRAME.unpack(head)
            record = None
            if magic == MAGIC and length <= MAX_PAYLOAD:
                payload = f.read(length)
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
            if not self._resync(f) and not self._next_segment(last_seg_no):
                return None

    def tail_left(self) -> bool:
        """Whether the segment being read has bytes beyond what was read (a torn tail)."""
        if self._file is None:
            return False
        try:
            return os.fstat(self._file.fileno()).st_size > self.offset
        except OSError:
            return False

    def _resync(self, f: BinaryIO) -> bool:
        """Move to the next magic after a corrupt record, a chunk at a time."""
        pos = self.offset + 1
        while True:
            f.seek(pos)
            chunk = f.read(_CHUNK)
            if len(chunk) < len(MAGIC):
                self.offset = pos + len(chunk)
                return False
            found = chunk.find(MAGIC)
            if found >= 0:
                self.offset = pos + found
                return True
            pos += len(chunk) - len(MAGIC) + 1
