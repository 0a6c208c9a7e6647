"""A damaged record is counted once: a dead owner's by its replay, and reading its files back
again (a run whose events did not fit the memory window at start) does not count it a second
time, neither while its events are being read nor after; an own run's once, even when its
segment is appended to after a read stopped inside the damage."""

from __future__ import annotations

import time
from collections import Counter

import orjson

from outbox._buffer._buffer import Buffer, Policy
from outbox._buffer._numbering import DELIVERED
from outbox._run._serde import serialize
from outbox._spill import Spill
from outbox._spill._format import SegmentReader, encode_event, file_header
from outbox._spill._streams import Run

from support.helpers import run_event

RUN = "00000000-0000-4000-8000-000000000001"


def text(n: int) -> bytes:
    return orjson.dumps({**run_event(run_id=RUN, n=n), "pad": "x" * 400})


def buffer(max_bytes: int) -> Buffer:
    return Buffer(max_events=10_000, max_bytes=max_bytes, policy=Policy.DROP_NEWEST, block_timeout=0.0)


def test_a_damaged_record_read_twice_is_counted_once(tmp_path):
    # A dead owner: 200 events on disk, none settled.
    first = buffer(10**7)
    spill = Spill(tmp_path, adopt=False)
    spill.attach(first)
    for n in range(200):
        data = text(n)
        assert first.put(data, len(data))
    assert spill.close(first) == 200
    (segment,) = sorted(tmp_path.glob("*/*.seg"))
    reader = SegmentReader(str(segment))
    reader.open()
    records = reader.records()
    for _ in range(10):
        next(records)
    at = reader.offset  # the 11th record: its checksum fails
    reader.close()
    data = bytearray(segment.read_bytes())
    data[at + 40] ^= 0xFF
    segment.write_bytes(bytes(data))

    # A successor whose memory window holds a fraction of them: its replay keeps none, and its
    # run reads the files again, in pieces, as the window has room.
    second = buffer(40_000)
    successor = Spill(tmp_path)
    successor.attach(second)
    held = second.holdings
    assert successor.stats()["stretch_events"] == 199  # (the damaged one is not live)
    assert successor.stats()["corrupt_records"] == 1  # the replay's count
    seen: list[int] = []
    while successor.stats()["stretch_events"] or held.queue:
        successor.tick(second, None, time.monotonic(), force=True)
        with second.lock:
            taken = held.take_locked(10_000, 10**9)
            if taken:
                held.note_each_locked([seq for seq, _, _ in taken], DELIVERED)
                second.settle_locked(len(taken), sum(size for _, _, size in taken), float("inf"))
        seen += [orjson.loads(event.body)["n"] for _, event, _ in taken]
        assert successor.stats()["corrupt_records"] == 1  # while the run reads its files again
        assert len(seen) <= 199
    assert seen == [n for n in range(200) if n != 10]
    assert successor.stats()["corrupt_records"] == 1  # and once they are read
    successor.close(second)


def test_a_damaged_record_at_the_end_of_a_segment_still_being_appended_to_is_counted_once(tmp_path):
    """An own run reads its segment to the end of what is written, the last record damaged (its
    checksum fails); then more is appended and read.  The reader stopped a few bytes short of
    the end inside the damaged stretch (a magic may begin there): going on from there is the
    same stretch, not a second one."""
    path = tmp_path / "own.seg"
    damaged = bytearray(encode_event(1, 0.0, serialize(text(1))))
    damaged[-2] ^= 0xFF
    path.write_bytes(file_header("me") + encode_event(0, 0.0, serialize(text(0))) + bytes(damaged))
    run = Run(0, [], {}, own=True, damage=Counter())
    run.extend("me", 0, 2, str(path))
    events, _ = run.read(10, 10**9)
    assert [orjson.loads(e.body)["n"] if e is not None else None for e in events] == [0, None]
    assert run.damage["corrupt_records"] == 1
    with open(path, "ab") as f:  # the owner goes on writing
        f.write(encode_event(2, 0.0, serialize(text(2))))
    run.extend("me", 2, 3, str(path))
    events, _ = run.read(10, 10**9)
    assert [orjson.loads(e.body)["n"] for e in events] == [2]
    assert run.damage["corrupt_records"] == 1
    run.close()
