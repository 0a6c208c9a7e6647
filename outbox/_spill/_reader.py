"""Reading segment files back, a record at a time: ``os.pread`` on a bare file descriptor (no
buffered file object whose lock a fork could copy held), one record and, while
resynchronizing after a damaged one, a 64 KiB chunk in memory at most."""

from __future__ import annotations

import contextlib
import os
import zlib

from ._format import FRAME, MAGIC, MAX_PAYLOAD, Event, Settle, decode, read_header

__all__ = ["NotOurs", "SegmentReader"]

_CHUNK = 64 * 1024
_HEAD_MAX = 4 + 4 + 0xFFFF


class NotOurs(Exception):
    """A file without our segment header: never read further, never touched."""


class SegmentReader:
    """The records of one segment, in order, from its header on.

    :meth:`next` returns a record, an ``int`` (the offset of a stretch of bytes that is not a
    sound record: torn or corrupt; reading goes on after it), or None at the end of what is
    written (:meth:`tail_left` then tells a torn tail from a clean end)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1
        self.offset = 0
        self.stream = ""

    def open(self) -> str:
        """Open the file and read its header.  Returns its stream.

        Raises:
            OSError: it cannot be opened or read.
            NotOurs: it is not a segment of ours.
        """
        if self.fd < 0:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                header = read_header(os.pread(fd, _HEAD_MAX, 0))
            except OSError:
                os.close(fd)
                raise
            if header is None:
                os.close(fd)
                raise NotOurs(self.path)
            self.fd = fd
            self.stream, self.offset = header
        return self.stream

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def next(self) -> Event | Settle | int | None:
        """The next record (see the class docstring).  Raises OSError if the disk fails."""
        fd = self.fd
        head = os.pread(fd, FRAME.size, self.offset)
        if len(head) < FRAME.size:
            return None
        magic, length, crc = FRAME.unpack(head)
        if magic == MAGIC and length <= MAX_PAYLOAD:
            payload = os.pread(fd, length, self.offset + FRAME.size)
            if len(payload) < length:
                return None
            if zlib.crc32(payload) == crc:
                record = decode(payload)
                if record is not None:
                    self.offset += FRAME.size + length
                    return record
        bad = self.offset
        self._resync()
        return bad

    def tail_left(self) -> bool:
        """Whether bytes are left beyond what was read (a torn tail, once nothing is written
        there any more)."""
        try:
            return os.fstat(self.fd).st_size > self.offset
        except OSError:
            return False

    def _resync(self) -> None:
        """Move to the next magic after a damaged record (or to the end)."""
        pos = self.offset + 1
        while True:
            chunk = os.pread(self.fd, _CHUNK, pos)
            found = chunk.find(MAGIC)
            if found >= 0:
                self.offset = pos + found
                return
            if len(chunk) < _CHUNK:
                # (Its last bytes may begin a magic whose rest is still being written.)
                self.offset = max(pos, pos + len(chunk) - (len(MAGIC) - 1))
                return
            pos += len(chunk) - len(MAGIC) + 1
