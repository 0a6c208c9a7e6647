"""The spill's files, byte for byte: pure encoding and decoding, no I/O.

A segment file begins with a header naming the *stream* it belongs to (the owner that wrote
it)::

    b"OBXL" | u8 version (1) | u8 0 | u16 len(stream) | stream

then holds framed, checksummed records, appended::

    b"OBXs" | u32 len(payload) | u32 crc32(payload) | payload

A payload is an *event* or a *settlement*::

    EVENT   u8 1 | u64 seq | f64 wall time | u16 len(run id) | u16 len(key) | run id | key | JSON
    SETTLE  u8 3 | u8 outcome | u16 len(stream) | u32 n | stream | n x (u64 first, u64 end)

An event record holds one accepted event of the file's stream under its sequence number (run
id and message key 0xFFFF long: none).  A settlement says that the numbers ``[first, end)`` of
a stream (any stream: an adopter settles the events it adopted) are settled, delivered or lost
(the outcome, informational); a *checkpoint* is a settlement with outcome 0 restating all that
is known settled of a stream, so that files holding older settlements can go.  Numbers are never
reused, so a settlement is a fact for ever, and replay is a union.

A record cut short (a crash mid-write) or whose checksum fails is skipped: the reader looks for
the next magic and goes on from there, so a torn record is never glued to the next one.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import NamedTuple

from .._serde import SerializedEvent

__all__ = [
    "FRAME",
    "HEADER",
    "MAGIC",
    "MAX_PAYLOAD",
    "Event",
    "Settle",
    "decode",
    "encode_event",
    "encode_settle",
    "file_header",
    "outcome_code",
    "parse",
    "read_header",
]

FILE_MAGIC = b"OBXL"
VERSION = 1
_FILE = struct.Struct(">4sBBH")
MAGIC = b"OBXs"
FRAME = struct.Struct(">4sII")
_EVENT = struct.Struct(">BQdHH")
_SETTLE = struct.Struct(">BBHI")
_RANGE = struct.Struct(">QQ")
#: The smallest event record: what a record costs beyond its JSON.
HEADER = FRAME.size + _EVENT.size
EVENT = 1
SETTLE = 3
_NONE = 0xFFFF
#: A record's payload never exceeds this (an event larger than any batch is never spilled).
MAX_PAYLOAD = 1 << 30
#: What a settlement says became of its events (code 0: a checkpoint, or an outcome unknown).
OUTCOMES = (
    "settled",
    "delivered",
    "dropped_full",
    "dropped_spill_full",
    "dropped_shutdown",
    "rejected_by_backend",
    "poison",
    "too_large",
    "invalid_event",
    "worker_stopped",
    "spill_lost",
    "dropped_reentrant",
)
_CODES = {name: code for code, name in enumerate(OUTCOMES)}


class Event(NamedTuple):
    seq: int
    #: Wall-clock time (``time.time()``) it was written.
    at: float
    event: SerializedEvent


class Settle(NamedTuple):
    stream: str
    outcome: str
    ranges: list[tuple[int, int]]


def outcome_code(outcome: str) -> int:
    return _CODES.get(outcome, 0)


def file_header(stream: str) -> bytes:
    data = stream.encode()
    return _FILE.pack(FILE_MAGIC, VERSION, 0, len(data)) + data


def read_header(data: bytes) -> tuple[str, int] | None:
    """(stream, header size) of a segment's first bytes, or None if they are not ours."""
    if len(data) < _FILE.size:
        return None
    magic, version, _, length = _FILE.unpack_from(data)
    if magic != FILE_MAGIC or version != VERSION or len(data) < _FILE.size + length:
        return None
    try:
        stream = data[_FILE.size : _FILE.size + length].decode()
    except UnicodeDecodeError:
        return None
    return stream, _FILE.size + length


def _text(value: str | None) -> bytes:
    if value is None:
        return b""
    data = value.encode()
    return data if len(data) < _NONE else data[: _NONE - 1]


def _frame(payload: bytes) -> bytes:
    return FRAME.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def encode_event(seq: int, at: float, event: SerializedEvent) -> bytes:
    run_id, key = _text(event.run_id), _text(event.key)
    head = _EVENT.pack(
        EVENT,
        seq,
        at,
        _NONE if event.run_id is None else len(run_id),
        _NONE if event.key is None else len(key),
    )
    return _frame(b"".join((head, run_id, key, event.body)))


def encode_settle(stream: str, outcome: str, ranges: list[tuple[int, int]]) -> bytes:
    name = stream.encode()
    head = _SETTLE.pack(SETTLE, outcome_code(outcome), len(name), len(ranges))
    return _frame(b"".join((head, name, *(_RANGE.pack(a, b) for a, b in ranges))))


def decode(payload: bytes) -> Event | Settle | None:
    """The record a sound payload holds (None: a kind or layout we do not know)."""
    if not payload:
        return None
    kind = payload[0]
    if kind == EVENT and len(payload) >= _EVENT.size:
        _, seq, at, run_len, key_len = _EVENT.unpack_from(payload)
        pos = _EVENT.size
        run_id = key = None
        if run_len != _NONE:
            run_id = payload[pos : pos + run_len].decode(errors="replace")
            pos += run_len
        if key_len != _NONE:
            key = payload[pos : pos + key_len].decode(errors="replace")
            pos += key_len
        if pos > len(payload):
            return None
        return Event(seq, at, SerializedEvent(payload[pos:], run_id, key))
    if kind == SETTLE and len(payload) >= _SETTLE.size:
        _, code, name_len, n = _SETTLE.unpack_from(payload)
        pos = _SETTLE.size + name_len
        if pos + n * _RANGE.size != len(payload):
            return None
        try:
            stream = payload[_SETTLE.size : pos].decode()
        except UnicodeDecodeError:
            return None
        ranges = [_RANGE.unpack_from(payload, pos + i * _RANGE.size) for i in range(n)]
        outcome = OUTCOMES[code] if code < len(OUTCOMES) else OUTCOMES[0]
        return Settle(stream, outcome, [(a, b) for a, b in ranges if a < b])
    return None


def parse(data: bytes, start: int = 0) -> Iterator[Event | Settle | int]:
    """The records in ``data`` from ``start`` (past the file header), in order; where a stretch
    of bytes is not a sound record (torn, corrupt), its offset is yielded instead, once per
    stretch, and reading goes on at the next sound record."""
    pos, end = start, len(data)
    bad = False
    while pos < end:
        if end - pos >= FRAME.size:
            magic, length, crc = FRAME.unpack_from(data, pos)
            begin = pos + FRAME.size
            if magic == MAGIC and length <= MAX_PAYLOAD and begin + length <= end:
                payload = data[begin : begin + length]
                if zlib.crc32(payload) == crc:
                    record = decode(payload)
                    if record is not None:
                        bad = False
                        pos = begin + length
                        yield record
                        continue
        if not bad:
            bad = True
            yield pos
        found = data.find(MAGIC, pos + 1)
        if found < 0:
            return
        pos = found
