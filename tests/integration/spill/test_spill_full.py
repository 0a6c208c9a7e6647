"""The spill at ``max_spill_bytes``: what the disk refuses is counted (``not_spilled_full``),
written once delivered events free room if it is still held, and at close each held event is
counted by where it is: on disk, ``spilled_at_close`` (the next outbox with the directory
delivers exactly those), or not, ``dropped_shutdown``.  A full disk long ago changes nothing
about a later close."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import orjson

from outbox import Outbox, Outcome, SerializedEvent
from outbox._spill._format import HEADER
from outbox.transports import DELIVERED

from support import parts
from support.helpers import ScriptedTransport, run_event, wait_until
from support.paths import REPO, TESTS

RUNS = [f"00000000-0000-4000-8000-{i:012d}" for i in range(4)]
# Events of about 430 bytes: 16 KiB of spill holds about 37 of them, 45 more than it takes.
SMALL = 16 * 1024
N = 45


class TakesBelow:
    """A backend that answers nothing until ``gate`` is set, then takes events numbered below
    ``limit`` and holds a request with any other (never answers)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.gate = threading.Event()
        self.delivered: list[int] = []

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        ns = [orjson.loads(e.body)["n"] for e in batch]
        while not self.gate.is_set():  # noqa: ASYNC110 - a threading.Event, set by the test
            await asyncio.sleep(0.002)
        if max(ns) >= self.limit:
            await asyncio.sleep(3600)
        self.delivered.extend(ns)
        return [DELIVERED] * len(batch)

    async def aclose(self) -> None:
        pass


def spilled(box: Outbox, key: str) -> float:
    return box.stats().spill[key]


def successor_delivers(spill_dir: str, count: int) -> list[int]:
    """What a new outbox started with ``spill_dir`` delivers of what it adopted (``n``s)."""
    transport = ScriptedTransport()
    successor = Outbox(transport, spill_dir=spill_dir, shutdown_timeout=5)
    try:
        assert transport.wait_delivered(count, 10), (count, successor.stats().spill)
    finally:
        report = successor.close(5)
    assert report.undelivered == {}, report
    return sorted(e["n"] for e in transport.delivered)


def test_queued_events_the_full_disk_refused_are_written_once_delivered_ones_free_room(tmp_path):
    """Events still queued when the disk refused them are tried again, and written once
    delivered events free room; those that left the queue for the worker meanwhile (its window
    ahead of the lanes) cannot be, and a close counts them lost.  The next outbox delivers
    exactly what the close counted ``spilled_at_close``."""
    spill = str(tmp_path / "spill")
    transport = TakesBelow(20)
    box = Outbox(
        transport,
        spill_dir=spill,
        max_spill_bytes=SMALL,
        max_events=1000,
        max_batch_events=1,
        max_concurrency=1,
        linger=0.0,
        spill_interval=0.02,
    )
    total = 200  # more than the worker takes ahead of its lane: the newest stay queued
    for n in range(total):  # five at a time, each five in a write of its own: segments of 4 KiB
        assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
        if n % 5 == 4:
            assert wait_until(lambda n=n: spilled(box, "written") + spilled(box, "not_spilled_full") > n)
    written, refused = spilled(box, "written"), spilled(box, "not_spilled_full")
    assert refused > 0, box.stats().spill
    assert written + refused == total, box.stats().spill
    # Events 0 to 19 delivered, their segments deleted: room for queued ones the disk refused.
    transport.gate.set()
    assert wait_until(lambda: len(transport.delivered) == 20)
    assert wait_until(lambda: spilled(box, "written") > written), box.stats().spill
    assert spilled(box, "not_spilled_full") == refused  # each counted once, however often tried
    report = box.close(0.3)
    on_disk = int(spilled(box, "written")) - 20  # (written in all, the close's last write included)
    assert report.delivered == 20
    assert report.undelivered == {"spilled_at_close": on_disk, "dropped_shutdown": total - 20 - on_disk}, (
        report
    )
    handed_on = successor_delivers(spill, on_disk)
    assert len(set(handed_on)) == on_disk, handed_on
    assert min(handed_on) == 20, handed_on


def test_a_close_hands_on_what_is_on_disk_and_counts_the_rest_lost(tmp_path):
    """The backend down, the disk full: of the events held, those written are handed on and
    those the disk refused are lost, each counted as what it is.  The next outbox delivers
    exactly the ones counted ``spilled_at_close``."""
    spill = str(tmp_path / "spill")
    transport = ScriptedTransport(open_gate=False)
    box = Outbox(transport, spill_dir=spill, max_spill_bytes=SMALL, max_events=100, linger=0.0)
    try:
        for n in range(N):
            assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: spilled(box, "written") + spilled(box, "not_spilled_full") == N)
        written = int(spilled(box, "written"))
        assert 0 < written < N, box.stats().spill
        report = box.close(0.3)
    finally:
        transport.gate.set()
    assert report.undelivered == {"spilled_at_close": written, "dropped_shutdown": N - written}, report
    handed_on = successor_delivers(spill, written)
    assert len(handed_on) == len(set(handed_on)) == written


def test_a_spill_that_was_once_full_still_hands_on_what_it_holds_at_close(tmp_path):
    """The spill filled once, the backend came back and took everything, then went away
    again: at close every event held is on disk, handed on, not counted lost (``not_spilled``
    is a count for the life of the outbox, not a state of the disk)."""
    spill = str(tmp_path / "spill")
    transport = ScriptedTransport(open_gate=False)
    box = Outbox(transport, spill_dir=spill, max_events=100, max_spill_bytes=SMALL, linger=0.0)
    for n in range(N):
        assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
    assert wait_until(lambda: spilled(box, "not_spilled_full") > 0), box.stats().spill
    transport.gate.set()
    assert box.flush(10), box.stats()
    assert wait_until(lambda: spilled(box, "spilled_bytes") == 0), box.stats().spill
    written = spilled(box, "written")
    transport.gate.clear()  # the backend goes away again
    for n in range(N, N + 5):
        assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
    assert wait_until(lambda: spilled(box, "written") == written + 5), box.stats().spill
    report = box.close(0.3)
    transport.gate.set()
    assert report.undelivered == {"spilled_at_close": 5}, report
    assert successor_delivers(spill, 5) == list(range(N, N + 5))


def test_events_emitted_as_the_backend_catches_up_after_a_full_spill_are_written(tmp_path):
    """Right after an outage that filled the disk, the backend has taken everything: the next
    events are written at the next tick (the settled segments are deleted before it writes),
    not refused by a disk still counted full and then never written."""
    spill = str(tmp_path / "spill")
    transport = ScriptedTransport(open_gate=False)
    box = Outbox(
        transport, spill_dir=spill, max_events=100, max_spill_bytes=SMALL, linger=0.0, spill_interval=0.1
    )
    try:
        for n in range(N):
            assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: spilled(box, "written") + spilled(box, "not_spilled_full") == N)
        refused = spilled(box, "not_spilled_full")
        assert refused > 0
        transport.gate.set()
        assert box.flush(10), box.stats()
        written = spilled(box, "written")
        transport.gate.clear()  # away again at once
        for n in range(N, N + 5):
            assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: spilled(box, "written") == written + 5), box.stats().spill
        assert spilled(box, "not_spilled_full") == refused
        assert spilled(box, "spilled_bytes") > 0
    finally:
        transport.gate.set()
        box.close(5)


def test_a_full_disk_costs_each_tick_what_it_can_write_not_the_whole_queue(tmp_path, monkeypatch):
    """With the disk full and hundreds of events queued that it refused, a tick tries again only
    as many as the room left could take: it neither copies the queue nor encodes records it
    cannot write (the sidecar would hold the buffer's lock, and the GIL, for all of them every
    interval of the outage)."""
    import outbox._spill._disk as spill_module

    transport = ScriptedTransport(open_gate=False)
    box = Outbox(
        transport,
        spill_dir=str(tmp_path / "spill"),
        max_spill_bytes=SMALL,
        max_events=5000,
        max_batch_events=1,
        max_concurrency=1,
        spill_interval=0.02,
    )
    try:
        for n in range(1000):
            assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: spilled(box, "written") + spilled(box, "not_spilled_full") == 1000)
        refused = spilled(box, "not_spilled_full")
        assert refused > 500, box.stats().spill  # still queued, tried again every tick
        spill = parts.spill(box)
        encoded, writes = [0], [0]
        encode, room = spill_module.encode_event, spill.disk.room

        def counting_encode(*args):
            encoded[0] += 1
            return encode(*args)

        def counting_room():
            writes[0] += 1
            return room()

        monkeypatch.setattr(spill_module, "encode_event", counting_encode)
        monkeypatch.setattr(spill.disk, "room", counting_room)
        assert wait_until(lambda: writes[0] >= 20)
        # Less than a record's room is left (a record here is under 500 bytes): each write
        # encodes at most as many records as that room could hold if each were the smallest.
        assert encoded[0] <= writes[0] * (500 // HEADER + 1), (encoded, writes, box.stats().spill)
        assert spilled(box, "not_spilled_full") == refused
    finally:
        transport.gate.set()
        box.close(5)


def test_an_event_that_cannot_be_serialized_queued_at_close_is_not_handed_on_as_spilled(tmp_path):
    """An event JSON cannot hold, still queued at close behind a backend that is down: the spill
    could not write it, so the next outbox can neither deliver it nor count it.  The close must
    not count it ``spilled_at_close`` (a silent loss): every event counted ``spilled_at_close``
    is delivered or counted by the next outbox."""
    spill = str(tmp_path / "spill")
    transport = ScriptedTransport(open_gate=False)
    box = Outbox(transport, spill_dir=spill, max_events=2000, max_batch_events=10, linger=0.0)
    total, bad = 500, 450  # the worker takes a few batches ahead: the bad one stays queued
    for n in range(total):
        event = run_event(run_id=RUNS[n % 4], n=n)
        if n == bad:
            event["facet"] = object()  # not JSON
        assert box.emit(event)
    assert wait_until(lambda: spilled(box, "written") >= total - 1), box.stats().spill
    report = box.close(0.3)
    transport.gate.set()
    handed_on = report.undelivered.get("spilled_at_close", 0)
    assert sum(report.undelivered.values()) == total
    successor_transport = ScriptedTransport()
    successor = Outbox(successor_transport, spill_dir=spill, shutdown_timeout=5)
    try:
        assert successor_transport.wait_delivered(total - 1, 10), successor.stats().spill
    finally:
        second = successor.close(5)
    # What the first counted as handed on is what the second delivered or counted.
    assert len(successor_transport.delivered) + sum(second.undelivered.values()) == handed_on, (
        report,
        second,
        len(successor_transport.delivered),
    )


_ADOPT_AND_HOLD = """
import os, sys, time
sys.path[:0] = {paths!r}
from outbox import Outbox
from support.helpers import ScriptedTransport, wait_until
spill, dead = {spill!r}, {dead!r}
box = Outbox(ScriptedTransport(open_gate=False), spill_dir=spill, max_spill_bytes={small},
             max_batch_events=1, max_concurrency=1, spill_interval=0.02)
# Adopted, all read back, and the worker took them for requests (the backend hangs).
def taken():
    spill_stats = box.stats().spill
    return spill_stats["recovered"] == 50 and not spill_stats["recovering"] and box.stats().in_flight
assert wait_until(taken), box.stats().spill
time.sleep(0.5)  # ticks that would wrongly let the dead owner's files go (none may)
print("written:", int(box.stats().spill["written"]), flush=True)
os.kill(os.getpid(), 9)
"""


def test_adopted_events_the_full_disk_refused_keep_their_dead_owners_files_until_on_disk(tmp_path):
    """An outbox adopts a dead owner's events with a spill far smaller than what it adopts:
    they are read in place, in the dead owner's files (moved into the adopter's directory),
    which must stay until they are delivered.  Else a SIGKILL of the adopter loses them,
    counted nowhere."""
    import subprocess
    import sys
    import textwrap

    spill = str(tmp_path / "spill")
    first = Outbox(ScriptedTransport(open_gate=False), spill_dir=spill, max_events=1000, linger=0.0)
    dead = parts.spill(first).home.owner
    total = 50  # about 21 KiB: beyond the adopter's 16 KiB, and fewer than the worker takes ahead
    for n in range(total):
        assert first.emit(run_event(run_id=RUNS[n % 4], n=n))
    report = first.close(0.3)
    assert report.undelivered == {"spilled_at_close": total}, report
    code = _ADOPT_AND_HOLD.format(
        paths=[str(REPO), str(TESTS)],
        spill=spill,
        dead=dead,
        small=SMALL,
    )
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -9, child.stderr[-3000:]
    handed_on = successor_delivers(spill, total)
    # All of them were on disk before the adopter came; the adopter died without counting anything.
    assert sorted(set(handed_on)) == list(range(total)), (child.stdout, len(set(handed_on)))


def test_events_after_a_shed_of_ones_the_full_disk_refused_are_counted(tmp_path):
    """With the disk full, queued events it refused (counted ``not_spilled_full``) are shed
    from the newest by ``drop_newest`` when a huge object shows the estimate was short (their
    numbers retired).  The next events accepted are refused by the full disk too: each is
    counted."""
    transport = ScriptedTransport(open_gate=False)
    box = Outbox(
        transport,
        spill_dir=str(tmp_path / "spill"),
        max_spill_bytes=SMALL,
        max_events=1000,
        max_bytes=256 * 1024,
        max_batch_bytes=64 * 1024,
        policy="drop_newest",
        max_batch_events=1,
        max_concurrency=1,
        linger=0.0,
        # Long, so that the next events come before the spill's next look: the shed must not
        # be lost for being out of sight by then.
        spill_interval=0.5,
    )
    try:
        # The disk filled first (about 37 events of N), so that the spill does not serialize
        # the next ones (it tries only what the room left could take): they stay objects.
        for n in range(N):
            assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: spilled(box, "written") + spilled(box, "not_spilled_full") == N)
        total = N + 100
        for n in range(N, total):
            assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: spilled(box, "written") + spilled(box, "not_spilled_full") == total)
        refused = spilled(box, "not_spilled_full")
        # Measured, it raises the estimate to max_bytes: every queued object not yet measured
        # (the refused ones) is re-priced beyond the bound and shed, the newest first.
        assert box.emit({**run_event(run_id=RUNS[0], n=total), "pad": "x" * (2 * 1024 * 1024)})
        assert wait_until(lambda: box.stats().dropped.get("dropped_full", 0) > 5), box.stats()
        again = 5  # text, at its exact size
        for n in range(total + 1, total + 1 + again):
            assert box.emit(orjson.dumps(run_event(run_id=RUNS[n % 4], n=n)))
        # (The huge one may have been counted before it was shed, or not.)
        assert wait_until(lambda: spilled(box, "not_spilled_full") >= refused + again, 5), (
            refused,
            box.stats().spill,
        )
        assert spilled(box, "not_spilled_full") <= refused + again + 1, (refused, box.stats().spill)
        report = box.close(0.3)
    finally:
        transport.gate.set()
    # ``not_spilled`` is no loss: every event still ends delivered or lost, under one reason.
    assert report.emitted == total + 1 + again, report
    assert report.delivered + report.lost == report.emitted, report


def test_a_shed_and_new_events_between_two_looks_are_counted_anew(tmp_path):
    """The same at the buffer's level, with the race made certain: the shed and the new
    events both happen between two looks of the spill.  The new events (new numbers) the disk
    refuses are counted."""
    from outbox._buffer._buffer import Buffer, Policy
    from outbox._spill import Spill

    buf = Buffer(max_events=100, max_bytes=10**7, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    spill = Spill(tmp_path, max_bytes=1200, adopt=False)  # room for two records of ~500 bytes
    spill.attach(buf)
    with buf.lock:
        for n in range(5):
            assert buf.put_locked(run_event(n=n), 0)
    spill.tick(buf, None, 0.0, force=True)
    written, refused = spill.stats()["written"], spill.stats()["not_spilled_full"]
    assert (written, refused) == (2, 3), spill.stats()
    with buf.lock:
        assert buf.shed_locked(1) > 0  # n=4 and n=3 shed: their numbers retired
        assert buf.shed_locked(1) > 0
        assert buf.put_locked(run_event(n=30), 0)
        assert buf.put_locked(run_event(n=40), 0)
    spill.tick(buf, None, 1.0, force=True)
    assert spill.stats()["written"] == written, spill.stats()
    assert spill.stats()["not_spilled_full"] == refused + 2, spill.stats()
