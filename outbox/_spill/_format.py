"""The spill's files, byte for byte, and reading them back.

A segment file begins with a header naming the *stream* it belongs to (the owner that wrote it)::

    b"OBXL" | u8 version (1) | u8 0 | u16 len(stream) | stream

then holds framed, checksummed records, appended::

    b"OBXs" | u32 len(payload) | u32 crc32(payload) | payload

A payload is an *event* or a *settlement*::

    EVENT   u8 1 | u64 seq | f64 wall time | u16 len(run id) | u16 len(key) | run id | key | JSON
    SETTLE  u8 3 | u8 outcome | u16 len(stream) | u32 n | stream | n x (u64 first, u64 end)

An event record holds one accepted event of the file's stream under its sequence number (a run
id or message key 0xFFFF long: none).  A settlement says that the numbers ``[first, end)`` of a
stream (any stream: an adopter settles the events it adopted) are settled, delivered or lost
(the outcome, informational); a *checkpoint* is a settlement with outcome 0 restating what is
settled of a stream.  Numbers are never reused, so a settlement is a fact for ever, and replay is
a union.  A record cut short (a crash mid-write) or whose checksum fails is skipped: the reader
looks for the next magic and goes on from there, never gluing a torn record to the next one.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from typing import NamedTuple

from .._serde import SerializedEvent

__all__ = [
    "HEADER",
    "Event",
    "NotOurs",
    "SegmentReader",
    "Settle",
    "encode_event",
    "encode_settle",
    "file_header",
]

_FILE, _FILE_MAGIC = struct.Struct(">4sBBH"), b"OBXL"
MAGIC, FRAME = b"OBXs", struct.Struct(">4sII")
_EVENT, _SETTLE, _RANGE = struct.Struct(">BQdHH"), struct.Struct(">BBHI"), struct.Struct(">QQ")
#: The smallest event record: what a record costs beyond its JSON.
HEADER = FRAME.size + _EVENT.size
_NONE = 0xFFFF
#: A record's payload never exceeds this (an event larger than any batch is never spilled).
MAX_PAYLOAD = 1 << 30
#: What a settlement says became of its events (code 0: a checkpoint, or an outcome unknown).
OUTCOMES: tuple[str, ...] = ("settled", "delivered", "dropped_full", "dropped_spill_full", "dropped_shutdown")
OUTCOMES += ("rejected_by_backend", "poison", "too_large", "invalid_event", "worker_stopped", "spill_lost")
_CODES = {name: code for code, name in enumerate(OUTCOMES)}


class Event(NamedTuple):
    seq: int
    at: float  #: wall-clock time (``time.time()``) it was written
    event: SerializedEvent


class Settle(NamedTuple):
    stream: str
    outcome: str
    ranges: list[tuple[int, int]]


def file_header(stream: str) -> bytes:
    data = stream.encode()
    return _FILE.pack(_FILE_MAGIC, 1, 0, len(data)) + data


def read_header(data: bytes) -> tuple[str, int] | None:
    """(stream, header size) of a segment's first bytes, or None if they are not ours."""
    if len(data) < _FILE.size:
        return None
    magic, version, _, length = _FILE.unpack_from(data)
    end = _FILE.size + length
    if magic != _FILE_MAGIC or version != 1 or len(data) < end:
        return None
    try:
        return data[_FILE.size : end].decode(), end
    except UnicodeDecodeError:
        return None


def _frame(payload: bytes) -> bytes:
    return FRAME.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def encode_event(seq: int, at: float, event: SerializedEvent) -> bytes:
    run_id, key = [b"" if v is None else v.encode()[: _NONE - 1] for v in (event.run_id, event.key)]
    sizes = [_NONE if v is None else len(b) for v, b in ((event.run_id, run_id), (event.key, key))]
    return _frame(b"".join((_EVENT.pack(1, seq, at, *sizes), run_id, key, event.body)))


def encode_settle(stream: str, outcome: str, ranges: list[tuple[int, int]]) -> bytes:
    name = stream.encode()
    head = _SETTLE.pack(3, _CODES.get(outcome, 0), len(name), len(ranges))
    return _frame(b"".join((head, name, *(_RANGE.pack(a, b) for a, b in ranges))))


def _decode(payload: bytes) -> Event | Settle | None:
    """The record a sound payload holds (None: a kind or layout we do not know)."""
    if payload[:1] == b"\x01" and len(payload) >= _EVENT.size:
        _, seq, at, *sizes = _EVENT.unpack_from(payload)
        pos, texts = _EVENT.size, []
        for size in sizes:
            texts.append(None if size == _NONE else payload[pos : pos + size].decode(errors="replace"))
            pos += 0 if size == _NONE else size
        return Event(seq, at, SerializedEvent(payload[pos:], *texts)) if pos <= len(payload) else None
    if payload[:1] == b"\x03" and len(payload) >= _SETTLE.size:
        _, code, name_len, n = _SETTLE.unpack_from(payload)
        pos = _SETTLE.size + name_len
        if pos + n * _RANGE.size != len(payload):
            return None
        try:
            stream = payload[_SETTLE.size : pos].decode()
        except UnicodeDecodeError:
            return None
        ranges = [_RANGE.unpack_from(payload, pos + i * _RANGE.size) for i in range(n)]
        return Settle(
            stream, OUTCOMES[code] if code < len(OUTCOMES) else "settled", [r for r in ranges if r[0] < r[1]]
        )
    return None


class NotOurs(Exception):
    """A file without our segment header: never read further, never touched."""


class SegmentReader:
    """The records of one segment, in order, read with ``os.pread`` on a bare file descriptor
    (no buffered file object whose lock a fork could copy held): one record, or a 64 KiB chunk
    while resynchronizing after a damaged one, in memory at most.

    :meth:`next` returns a record, an ``int`` (the offset of a stretch of bytes that is not a
    sound record: torn or corrupt; reading goes on after it), or None at the end of what is
    written (:meth:`tail_left` then tells a torn tail from a clean end)."""

    def __init__(self, path: str) -> None:
        self.path, self.fd, self.offset, self.stream = path, -1, 0, ""

    def open(self) -> str:
        """Open the file and read its header; returns its stream.

        Raises:
            OSError: it cannot be opened or read.
            NotOurs: it is not a segment of ours.
        """
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        header = read_header(os.pread(self.fd, _FILE.size + _NONE, 0))
        if header is None:
            self.close()
            raise NotOurs(self.path)
        self.stream, self.offset = header
        return self.stream

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def next(self) -> Event | Settle | int | None:
        """The next record (see the class docstring).  Raises OSError if the disk fails."""
        head = os.pread(self.fd, FRAME.size, self.offset)
        if len(head) < FRAME.size:
            return None
        magic, length, crc = FRAME.unpack(head)
        if magic == MAGIC and length <= MAX_PAYLOAD:
            payload = os.pread(self.fd, length, self.offset + FRAME.size)
            if len(payload) < length:
                return None
            record = _decode(payload) if zlib.crc32(payload) == crc else None
            if record is not None:
                self.offset += FRAME.size + length
                return record
        bad, pos = self.offset, self.offset + 1
        while True:  # on to the next magic (or the end)
            chunk = os.pread(self.fd, 65536, pos)
            found = chunk.find(MAGIC)
            if found >= 0 or len(chunk) < 65536:
                # (The last bytes may begin a magic whose rest is still being written.)
                self.offset = pos + found if found >= 0 else max(pos, pos + len(chunk) - len(MAGIC) + 1)
                return bad
            pos += len(chunk) - len(MAGIC) + 1

    def tail_left(self) -> bool:
        """Whether bytes are left beyond what was read (a torn tail, once nothing more comes)."""
        try:
            return os.fstat(self.fd).st_size > self.offset
        except OSError:
            return False
