"""The spill's record format: framed, checksummed records in append-only segment files.

One record::

    magic b"OBXs" | u32 length | u32 crc32(payload) | payload (length bytes)

and its payload::

    u8 kind | u64 seq | f64 wall time | u16 len(run id) | u16 len(key) | run id | key | body

A kind ``EVENT`` record holds one accepted event, serialized (its JSON ``body``, with the run id
and message key its order is kept by, 0xFFFF for "none").  A kind ``VOID`` record says that the
owner's records from ``seq`` on were taken back (the buffer shed its newest events, and their
sequence numbers will be given to new ones): a reader forgets them.

A record cut short (a crash mid-write), or one whose checksum does not match (a bad sector), is
skipped: the reader searches for the next magic and goes on from there, so that a torn record is
never glued to the next one, and a corrupt record costs only itself.  Pure: no I/O but reading
bytes already in memory.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import NamedTuple

from ._serde import SerializedEvent

__all__ = ["EVENT", "HEADER", "MAGIC", "VOID", "Record", "encode_event", "encode_void", "parse"]

MAGIC = b"OBXs"
_FRAME = struct.Struct(">4sII")
_HEAD = struct.Struct(">BQdHH")
HEADER = _FRAME.size + _HEAD.size
EVENT = 1
VOID = 2
_NONE = 0xFFFF
# A record's payload never exceeds this (an event larger than any batch is never spilled).
MAX_PAYLOAD = 1 << 30


class Record(NamedTuple):
    kind: int
    seq: int
    #: Wall-clock time (``time.time()``) it was written.
    at: float
    event: SerializedEvent | None


def _text(value: str | None) -> bytes:
    if value is None:
        return b""
    data = value.encode()
    return data if len(data) < _NONE else data[: _NONE - 1]


def _frame(payload: bytes) -> bytes:
    return _FRAME.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def encode_event(seq: int, at: float, event: SerializedEvent) -> bytes:
    """One event's record."""
    run_id, key = _text(event.run_id), _text(event.key)
    head = _HEAD.pack(
        EVENT,
        seq,
        at,
        _NONE if event.run_id is None else len(run_id),
        _NONE if event.key is None else len(key),
    )
    return _frame(b"".join((head, run_id, key, event.body)))


def encode_void(seq: int, at: float) -> bytes:
    """A record saying that this owner's records from ``seq`` on are void."""
    return _frame(_HEAD.pack(VOID, seq, at, _NONE, _NONE))


def _decode(payload: bytes) -> Record | None:
    if len(payload) < _HEAD.size:
        return None
    kind, seq, at, run_len, key_len = _HEAD.unpack_from(payload)
    pos = _HEAD.size
    run_id = key = None
    if run_len != _NONE:
        run_id = payload[pos : pos + run_len].decode(errors="replace")
        pos += run_len
    if key_len != _NONE:
        key = payload[pos : pos + key_len].decode(errors="replace")
        pos += key_len
    if kind == VOID:
        return Record(VOID, seq, at, None)
    if kind != EVENT or pos > len(payload):
        return None
    return Record(EVENT, seq, at, SerializedEvent(payload[pos:], run_id, key))


def parse(data: bytes) -> Iterator[Record | int]:
    """The records of a segment, in order; where a stretch of bytes is not a sound record
    (torn, corrupt), its offset (an int) is yielded instead, once per stretch, and reading
    goes on at the next sound record."""
    pos, end = 0, len(data)
    bad = False
    while pos < end:
        if end - pos >= _FRAME.size:
            magic, length, crc = _FRAME.unpack_from(data, pos)
            start = pos + _FRAME.size
            if magic == MAGIC and length <= MAX_PAYLOAD and start + length <= end:
                payload = data[start : start + length]
                if zlib.crc32(payload) == crc:
                    record = _decode(payload)
                    if record is not None:
                        bad = False
                        pos = start + length
                        yield record
                        continue
        if not bad:
            bad = True
            yield pos
        found = data.find(MAGIC, pos + 1)
        if found < 0:
            return
        pos = found
