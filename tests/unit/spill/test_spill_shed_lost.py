"""Events counted lost (``dropped_full``) whose records are on disk: the next outbox over the
same ``spill_dir`` must not deliver them as well (counted lost *and* delivered).  Each is
settled in the log, in the room ``max_spill_bytes`` keeps for settlements; if even that cannot
be written, the close hands nothing on."""

from __future__ import annotations

from pathlib import Path

import orjson

import outbox._spill._disk
from outbox._buffer._buffer import Buffer, Policy
from outbox._spill import Spill
from outbox._spill._format import Settle, encode_settle

from support.helpers import run_event
from support.spill_log import records, waiting

RUN = "00000000-0000-4000-8000-000000000001"


def big(n: int, pad: int) -> dict[str, object]:
    return {**run_event(run_id=RUN, n=n), "pad": "x" * pad}


def text(n: int) -> bytes:
    return orjson.dumps(run_event(run_id=RUN, n=n))


def handed_on(directory: object) -> list[int]:
    """What a successor would hand on from ``directory`` (the ``n`` of each event, in order)."""
    return [orjson.loads(event.body)["n"] for _, _, event in waiting(directory)]  # type: ignore[arg-type]


def _shed_on_write(directory: object, max_bytes: int) -> tuple[Buffer, Spill]:
    """A write that serializes five objects accepted at a short estimate, writes them, and
    learns their size: drop_newest sheds the newest of them, just written."""
    buf = Buffer(max_events=100, max_bytes=16000, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    spill = Spill(directory, max_bytes=max_bytes, adopt=False)  # type: ignore[arg-type]
    spill.attach(buf)
    assert buf.put(run_event(run_id=RUN, n=0), 0)
    spill.tick(buf, None, 0.0, force=True)  # measured: the estimate is what a small event weighs
    for n in range(1, 6):
        assert buf.put(big(n, 3000), 0)
    spill.tick(buf, None, 1.0, force=True)
    return buf, spill


def _event_bytes(directory: object) -> int:
    """What the six records of ``_shed_on_write`` take on disk, the file's header included
    (the settlements it wrote left out)."""
    probe, spill = _shed_on_write(directory, 10**9)
    (path,) = Path(str(directory)).rglob("*.seg")
    data = path.read_bytes()
    settles = [r for r in records(data) if isinstance(r, Settle)]
    spill.close(probe)
    return len(data) - sum(len(encode_settle(r.stream, r.outcome, r.ranges)) for r in settles)


def test_a_shed_of_events_on_disk_is_settled_in_the_room_kept_for_settlements(tmp_path):
    """max_spill_bytes is what the six records take plus the eighth kept for settlements: the
    settlement of the events the write shed fits, with the backend down and nothing freed
    before the close.  The close counts the kept events on disk and the shed ones dropped_full;
    the successor hands on the kept ones only."""
    events = _event_bytes(tmp_path / "probe")
    buf, spill = _shed_on_write(tmp_path / "spill", -(-events * 8 // 7) + 64)
    assert spill.stats()["written"] == 6
    shed = buf.dropped.get("dropped_full", 0)
    assert 0 < shed < 5, buf.dropped
    kept = [orjson.loads(event.body)["n"] for event in buf.holdings.queue]
    on_disk = spill.close(buf)  # counted spilled_at_close by the outbox, the rest lost
    assert not spill.disk.unsettled  # written
    # Before the log: [0, 1, 2, 3, 4, 5] handed on, the shed ones counted dropped_full too.
    assert handed_on(tmp_path / "spill") == kept
    assert on_disk == len(kept) == 6 - shed


def test_a_settlement_the_disk_refuses_to_the_last_hands_nothing_on(tmp_path, monkeypatch):
    """The same on a disk that refuses every settlement record (a full disk whose last bytes the
    six records took: made here by refusing them, as a tmpfs fills by pages, never at a byte
    chosen; max_spill_bytes does not refuse settlements).  The settlement stays unwritten through
    the close, so the files hold records of events counted lost.  The close hands on none of them
    (every held event is counted lost), and leaves nothing to adopt."""
    write = outbox._spill._disk.Disk._write
    monkeypatch.setattr(
        outbox._spill._disk.Disk,
        "_write",
        lambda disk, records, settles: 0 if settles else write(disk, records, settles),
    )
    events = _event_bytes(tmp_path / "probe")
    buf, spill = _shed_on_write(tmp_path / "spill", events * 2)
    assert spill.stats()["written"] == 6
    assert 0 < buf.dropped.get("dropped_full", 0) < 5, buf.dropped
    assert spill.close(buf) == 0  # the settlement is refused: the six records fill the disk
    assert spill.disk.unsettled
    assert handed_on(tmp_path / "spill") == []


def test_drop_oldest_evicting_written_events_behind_one_in_flight_settles_them(tmp_path):
    """A real Buffer and Spill: three events written, two taken (in flight, the backend does not
    answer), three more overflow the window and fill the buffer (6); the next emit makes
    drop_oldest evict event 2, on disk (dropped_full), and the one after finds nothing to evict
    (refused: dropped_full).  The close counts the six held on disk; the successor hands on those
    six, not the evicted one too."""
    buf = Buffer(max_events=6, max_bytes=10**7, policy=Policy.DROP_OLDEST, block_timeout=0.0)
    spill = Spill(tmp_path, adopt=False)
    spill.attach(buf)
    for n in range(3):
        assert buf.put(text(n), len(text(n)))
    spill.tick(buf, None, 0.0, force=True)
    with buf.lock:
        assert [seq for seq, _, _ in buf.holdings.take_locked(2, 10**7)] == [0, 1]
    for n in range(3, 7):
        assert buf.put(text(n), len(text(n)))
    assert not buf.put(text(7), len(text(7)))
    assert buf.dropped == {"dropped_full": 2}, buf.dropped
    on_disk = spill.close(buf)
    assert on_disk == 6
    # Before the log: 2 was counted dropped_full and handed on as well.
    assert sorted(handed_on(tmp_path)) == [0, 1, 3, 4, 5, 6]
