"""Events counted lost (``dropped_full``, ``dropped_spill_full``) whose records are on disk above
the checkpoint: the next outbox over the same ``spill_dir`` must not deliver them as well
(counted lost *and* delivered).  Found by a hostile review; the last is a known gap, an
expected failure until the spill can record a settled range (see docs/operations.md)."""

from __future__ import annotations

import orjson
import pytest

import outbox._spilldisk
from outbox._buffer import Buffer, Policy
from outbox._spill import Spill

from support.helpers import run_event

RUN = "00000000-0000-4000-8000-000000000001"


def big(n: int, pad: int) -> dict[str, object]:
    return {**run_event(run_id=RUN, n=n), "pad": "x" * pad}


def text(n: int) -> bytes:
    return orjson.dumps(run_event(run_id=RUN, n=n))


def adopt(directory: object) -> list[int]:
    """What a real successor adopts from ``directory`` (the ``n`` of each event, in order)."""
    successor = Buffer(max_events=1000, max_bytes=10**8, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    adopter = Spill(directory, adopt=True)  # type: ignore[arg-type]
    try:
        adopter.attach(successor)
        return [orjson.loads(event.body)["n"] for event in successor.queue]
    finally:
        adopter.close(successor)


def _shed_on_write(directory: object, max_bytes: int) -> tuple[Buffer, Spill]:
    """A write that serializes five objects accepted at a short estimate, writes them, and
    learns their size: drop_newest sheds the newest of them, just written."""
    buf = Buffer(max_events=100, max_bytes=8000, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    spill = Spill(directory, max_bytes=max_bytes, adopt=False)  # type: ignore[arg-type]
    assert buf.put(run_event(run_id=RUN, n=0), 0)
    spill.write(buf, None)  # measured: the estimate is what a small event weighs
    for n in range(1, 6):
        assert buf.put(big(n, 3000), 0)
    spill.write(buf, None)
    return buf, spill


def test_events_leave_room_for_a_void_so_the_successor_adopts_no_shed_event(tmp_path):
    """max_spill_bytes is what the six records take: events no longer take the last VOID_ROOM
    bytes, so the void record of the write that sheds the newest (their records just written)
    fits, with the backend down and nothing freed before the close.  The close counts the kept
    events on disk and the shed ones dropped_full; the successor adopts the kept ones only."""
    probe, probe_spill = _shed_on_write(tmp_path / "probe", 10**9)
    exact = probe_spill.disk.disk_bytes  # the six records, byte for byte (same events)
    probe_spill.close(probe)

    buf, spill = _shed_on_write(tmp_path / "spill", exact)
    assert 0 < buf.dropped.get("dropped_full", 0) < 5, buf.dropped
    kept = [orjson.loads(event.body)["n"] for event in buf.queue]
    on_disk = spill.close(buf)  # counted spilled_at_close by the outbox, the rest lost
    assert spill._void is None  # written
    adopted = adopt(tmp_path / "spill")
    # Before: [0, 1, 2, 3, 4, 5] adopted, with 3, 4 and 5 counted dropped_full too.
    assert adopted == kept[: len(adopted)], (adopted, kept, buf.dropped)
    assert len(adopted) == on_disk > 0


def test_a_void_the_disk_refuses_to_the_last_hands_nothing_on(tmp_path, monkeypatch):
    """The same with no room left for voids either (VOID_ROOM spent): the void stays unwritten
    through the close, so the files hold records of events counted lost.  The close hands on
    none of them (every held event is counted lost), and leaves nothing to adopt."""
    monkeypatch.setattr(outbox._spilldisk, "VOID_ROOM", 0)
    probe, probe_spill = _shed_on_write(tmp_path / "probe", 10**9)
    exact = probe_spill.disk.disk_bytes
    probe_spill.close(probe)

    buf, spill = _shed_on_write(tmp_path / "spill", exact)
    assert spill.stats()["written"] == 6
    assert 0 < buf.dropped.get("dropped_full", 0) < 5, buf.dropped
    assert spill.close(buf) == 0  # its last write's void is refused: the six records fill it
    assert spill._void is not None
    # Before: [0, 1, 2, 3, 4, 5] adopted, of which the shed ones were counted dropped_full.
    assert adopt(tmp_path / "spill") == []


@pytest.mark.xfail(
    strict=True,
    reason="known gap: drop_oldest evicts queued events already on disk while an older event "
    "is in flight; the checkpoint (the oldest unsettled) stays below them, no record says they "
    "settled, and the successor delivers events counted dropped_full",
)
def test_drop_oldest_evicting_written_events_behind_one_in_flight_hands_them_on(tmp_path):
    """A real Buffer and Spill, no window: six events written, two taken (in flight, the backend
    does not answer), two more emitted: drop_oldest evicts 2 and 3 (dropped_full).  The close
    counts the six held on disk; the successor must adopt those six, not the evicted two too."""
    buf = Buffer(max_events=6, max_bytes=10**7, policy=Policy.DROP_OLDEST, block_timeout=0.0)
    spill = Spill(tmp_path, adopt=False)
    for n in range(6):
        assert buf.put(text(n), len(text(n)))
    spill.write(buf, None)
    with buf.lock:
        assert [seq for seq, _, _ in buf.take_locked(2, 10**7)] == [0, 1]
    for n in (6, 7):
        assert buf.put(text(n), len(text(n)))
    assert buf.dropped == {"dropped_full": 2}
    on_disk = spill.close(buf)
    assert on_disk == 6
    adopted = adopt(tmp_path)
    # Observed: [0, 1, 2, 3, 4, 5, 6, 7]: 2 and 3 counted dropped_full and handed on.
    assert sorted(adopted) == [0, 1, 4, 5, 6, 7], adopted
