"""The spill's files, byte for byte, and reading them back.

A segment is a header naming its *stream* (the owner that wrote it), then framed records::

    b"OBXL" | u8 version (1) | u8 flags | u16 len(stream) | stream
    b"OBXs" | u32 len(payload) | u32 crc32(payload) | payload
    EVENT   u8 1 | u64 seq | f64 wall time | u16 len(run id) | u16 len(key) | run id | key | JSON
    SETTLE  u8 3 | u8 outcome | u16 len(stream) | u32 n | stream | n x (u64 first, u64 end)

Flag bit 0, ``VOUCHED``: every event body in the file is our serializer's JSON object (a reader
parses only other files' bodies, and never sends one that is not a JSON object).  A run id or key
0xFFFF long is none.  A settlement says the numbers ``[first, end)`` of a stream (any: an adopter
settles what it adopted) are settled, delivered or lost (informational); a *checkpoint*, outcome
0, restates what is settled of a stream.  A *tombstone* (``TOMBSTONES``) is an event that could
not be written, its body ``!`` and the reason it is counted lost under, in its order, when read.
A record cut short or whose checksum fails is skipped: the reader goes on from the next magic,
never gluing a torn record to the next (a frame running past the end of the file is a torn tail
only if no magic follows it).
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import zlib
from collections.abc import Iterator
from typing import NamedTuple

from .._run._serde import SerializedEvent

__all__ = [
    "HEADER",
    "TOMBSTONES",
    "VOUCHED",
    "Event",
    "NotOurs",
    "SegmentReader",
    "Settle",
    "encode_event",
    "encode_settle",
    "file_header",
    "record_size",
]

_FILE, _FILE_MAGIC = struct.Struct(">4sBBH"), b"OBXL"
MAGIC, FRAME = b"OBXs", struct.Struct(">4sII")
_EVENT, _SETTLE, _RANGE = struct.Struct(">BQdHH"), struct.Struct(">BBHI"), struct.Struct(">QQ")
#: The smallest event record: what a record costs beyond its JSON.
HEADER = FRAME.size + _EVENT.size
_NONE = 0xFFFF
_CHUNK = 256 * 1024
# Bound once: _decode runs for every record read (NamedTuples built without their __new__).
_EVENT_SIZE, _unpack_event, _new = _EVENT.size, _EVENT.unpack_from, tuple.__new__
#: A record's payload never exceeds this (an event larger than any batch is never spilled).
MAX_PAYLOAD = 1 << 30
#: What a settlement says became of its events (code 0: a checkpoint, or an outcome unknown).
OUTCOMES: tuple[str, ...] = ("settled", "delivered", "dropped_full", "dropped_spill_full", "dropped_shutdown")
OUTCOMES += ("rejected_by_backend", "poison", "too_large", "invalid_event", "worker_stopped", "spill_lost")
_CODES = {name: code for code, name in enumerate(OUTCOMES)}
#: The header's flag: every event body in the file is the serializer's (see the docstring).
VOUCHED = 1
#: What is written in place of an event that cannot be (see the docstring), by why.
TOMBSTONES = {
    why: SerializedEvent(b"!" + why.encode(), None, None) for why in ("invalid_event", "dropped_spill_full")
}


class Event(NamedTuple):
    seq: int
    at: float  #: wall-clock time (``time.time()``) it was written
    event: SerializedEvent


class Settle(NamedTuple):
    stream: str
    outcome: str
    ranges: list[tuple[int, int]]


def file_header(stream: str, flags: int = 0) -> bytes:
    data = stream.encode()
    return _FILE.pack(_FILE_MAGIC, 1, flags, len(data)) + data


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


def encode_event(seq: int, at: float, event: SerializedEvent) -> bytes:
    """An event's record (its body copied once: the checksum runs over the parts)."""
    run_id, key, body = event.run_id, event.key, event.body
    run = b"" if run_id is None else run_id.encode()[: _NONE - 1]
    keyed = b"" if key is None else key.encode()[: _NONE - 1]
    lengths = (_NONE if run_id is None else len(run), _NONE if key is None else len(keyed))
    head = _EVENT.pack(1, seq, at, *lengths) + run + keyed
    frame = FRAME.pack(MAGIC, len(head) + len(body), zlib.crc32(body, zlib.crc32(head)))
    return b"".join((frame, head, body))


def record_size(event: SerializedEvent) -> int:
    """The bytes of ``event``'s record (at most: run id and key as UTF-8, not cut)."""
    run_id, key = event.run_id, event.key
    texts = (0 if run_id is None else len(run_id.encode())) + (0 if key is None else len(key.encode()))
    return HEADER + len(event.body) + texts


def encode_settle(stream: str, outcome: str, ranges: list[tuple[int, int]]) -> bytes:
    name = stream.encode()
    head = _SETTLE.pack(3, _CODES.get(outcome, 0), len(name), len(ranges))
    payload = b"".join((head, name, *(_RANGE.pack(a, b) for a, b in ranges)))
    return FRAME.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


_NO_BODY = SerializedEvent(b"", None, None)


def _decode(data: bytes, start: int, end: int, bodies: bool) -> Event | Settle | None:
    """The record a sound payload (``data[start:end]``) holds (None: a kind or layout we do not
    know); without ``bodies``, an event's number and time only."""
    kind = data[start]
    if kind == 1 and end - start >= _EVENT_SIZE:
        _, seq, at, run_len, key_len = _unpack_event(data, start)
        if not bodies:
            return _new(Event, (seq, at, _NO_BODY))
        pos = start + _EVENT_SIZE
        run_id = key = None
        if run_len != _NONE:
            run_id, pos = str(data[pos : pos + run_len], "utf-8", "replace"), pos + run_len
        if key_len != _NONE:
            key, pos = str(data[pos : pos + key_len], "utf-8", "replace"), pos + key_len
        if pos > end:
            return None
        return _new(Event, (seq, at, _new(SerializedEvent, (data[pos:end], run_id, key))))
    if kind == 3 and end - start >= _SETTLE.size:
        _, code, name_len, n = _SETTLE.unpack_from(data, start)
        pos = start + _SETTLE.size + name_len
        if pos + n * _RANGE.size != end:
            return None
        try:
            stream = data[start + _SETTLE.size : pos].decode()
        except UnicodeDecodeError:
            return None
        outcome = OUTCOMES[code] if code < len(OUTCOMES) else "settled"
        return Settle(stream, outcome, [r for r in _RANGE.iter_unpack(data[pos:end]) if r[0] < r[1]])
    return None


class NotOurs(Exception):
    """A file without our segment header: never read further, never touched."""


class SegmentReader:
    """The records of one segment, read with ``os.pread`` on a bare fd (no buffered file object
    whose lock a fork could copy held): a ``_CHUNK``, or one larger record, in memory at most.

    :meth:`records` yields each record from ``offset`` on (without ``bodies``, events without
    their JSON), and the offset (an ``int``) of each stretch that is not a sound record, torn or
    corrupt, read past, up to the end of what is written (:meth:`tail_left` then tells a torn
    tail from a clean end); called again, it goes on from there."""

    def __init__(self, path: str, bodies: bool = True) -> None:
        self.path, self.fd, self.offset, self.stream, self.bodies = path, -1, 0, "", bodies
        self.vouched = False
        #: The offset of the last record :meth:`records` yielded (to read it again from there).
        self.start = 0
        #: The last call stopped at the end of what is written inside a damaged stretch it
        #: yielded: the next goes on with that stretch, not yielding it again.
        self.in_damage = False

    def open(self) -> str:
        """Open the file and read its header; returns its stream.  Raises OSError (it cannot be
        opened or read) or NotOurs (not a segment of ours)."""
        # (Non-blocking: a FIFO named like a segment is not ours, and opening it must not wait.)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            self.close()
            raise NotOurs(self.path)
        data = os.pread(self.fd, _FILE.size + _NONE, 0)
        header = read_header(data)
        if header is None:
            self.close()
            raise NotOurs(self.path)
        self.stream, self.offset = header
        self.vouched = bool(_FILE.unpack_from(data)[2] & VOUCHED)
        return self.stream

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def records(self) -> Iterator[Event | Settle | int]:
        """The records (see the class docstring).  Raises OSError if the disk fails."""
        fd, bodies, size, magic_, most = self.fd, self.bodies, FRAME.size, MAGIC, MAX_PAYLOAD
        unpack, crc32, view, pread, decode = FRAME.unpack_from, zlib.crc32, memoryview, os.pread, _decode
        chunk, at, mv = b"", 0, view(b"")  # the bytes read ahead, from file offset ``at``
        offset = self.offset
        while True:
            pos = offset - at
            if pos + size > len(chunk):  # (offset never goes back: pos >= 0)
                chunk, at, pos = pread(fd, _CHUNK, offset), offset, 0
                mv = view(chunk)
                if len(chunk) < size:
                    return
            magic, length, crc = unpack(chunk, pos)
            # A frame that runs past the end of the file: cut short (the end of what is written),
            # unless a record follows it (then its length field was damaged).
            cut = False
            if magic == magic_ and length <= most:
                start = pos + size
                end = start + length
                if end > len(chunk):
                    cut = offset + size + length > os.fstat(fd).st_size
                    if not cut:  # (never read more than the file holds)
                        chunk, at = pread(fd, max(size + length, _CHUNK), offset), offset
                        mv, start, end = view(chunk), size, size + length
                        cut = end > len(chunk)
                if not cut and crc32(mv[start:end]) == crc:
                    record = decode(chunk, start, end, bodies)
                    if record is not None:
                        self.start, offset = offset, offset + size + length
                        self.offset, self.in_damage = offset, False
                        yield record
                        continue
            pos, again, self.in_damage = offset + 1, self.in_damage, False
            while True:  # on to the next magic (or the end)
                ahead = pread(fd, _CHUNK, pos)
                found = ahead.find(MAGIC)
                if found >= 0:
                    self.offset = pos + found
                    break
                if len(ahead) < _CHUNK:
                    if cut:
                        return  # nothing follows: a torn tail (``tail_left``)
                    # (The last bytes may begin a magic whose rest is still being written.)
                    self.offset = max(pos, pos + len(ahead) - len(MAGIC) + 1)
                    self.in_damage = True  # (a next call, once more is written, goes on with it)
                    break
                pos += len(ahead) - len(MAGIC) + 1
            if not again:  # (counted when the last call came upon it)
                yield offset
            offset = self.offset

    def tail_left(self) -> bool:
        """Whether bytes are left beyond what was read (a torn tail, once nothing more comes)."""
        try:
            return os.fstat(self.fd).st_size > self.offset
        except OSError:
            return False
