"""The spill attacked as a hostile operator would: each test is one bug found, the smallest
reproduction of it, with real outboxes, real files, a real ``outbox sink`` (no mocks).  The
in-process one (a checkpoint) drives the spill's own parts on real files and reads the directory
as a successor would at that instant: what a SIGKILL there would hand on (page cache: a dead
process loses nothing written)."""

from __future__ import annotations

import os
import shutil
import struct
import threading
import time

import orjson
import pytest
from test_spill_log import RUNS, dead_owner, ns, owner_dirs, refused_url

from outbox import Outbox
from outbox._observability._log import RateLimitedLog
from outbox._run._serde import SerializedEvent
from outbox._spill._disk import Disk
from outbox._spill._format import FRAME, MAGIC, encode_event, file_header
from outbox._spill._order import segment_paths
from outbox._spill._owners import Home
from outbox._spill._ranges import Ranges
from outbox._spill._streams import Streams
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import HttpTransport

from support import parts
from support.disk import fill, free
from support.helpers import run_event, wait_until


def padded(n: int, pad: int = 500) -> dict:
    event = run_event(run_id=RUNS[n % 4], n=n)
    event["job"]["facets"] = {"pad": {"_producer": "p", "_schemaURL": "s", "v": "x" * pad}}
    return event


# -- 1. a flipped bit in a record's length field: every later record of the file, silently --------


def test_a_record_whose_length_field_is_damaged_costs_that_record_only(tmp_path):
    """One bit flipped in the length field of the 11th of 60 records.  The reader takes the
    record as running past the end of the file (a torn tail) and stops there: the 49 sound
    records after it are neither delivered nor counted, the close says complete, and the file
    is deleted.  (Operations: "the damaged records only, counted by kind".)"""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 60)
    (home,) = owner_dirs(spill)
    (segment,) = home.glob("*.seg")
    data = bytearray(segment.read_bytes())
    starts = [i for i in range(len(data)) if data.startswith(MAGIC, i)]
    assert len(starts) == 60
    _, length, _ = FRAME.unpack_from(data, starts[10])
    struct.pack_into(">I", data, starts[10] + 4, length | 1 << 24)  # one bit: 16 MiB more
    segment.write_bytes(bytes(data))
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        report = box.close(20)
        stats = box.stats().spill
        delivered = ns(sink)
    damaged = stats["corrupt_records"] + stats["torn_records"]
    counted = sum(report.undelivered.values())
    # Every sound record delivered; what is not, counted.
    assert len(set(delivered)) + max(damaged, counted) >= 60, (sorted(delivered), stats, report)


# -- 2. a spill_dir replaced by a file: spilled_at_close for events on no disk -------------------


def test_a_spill_dir_replaced_under_a_running_outbox_reports_nothing_on_disk_that_is_not(tmp_path):
    """The directory is removed and a file put in its place: the outbox cannot make its
    directory again ("vanished and cannot be made again"), yet goes on appending to the
    segment it still has open (unlinked), counts those events live, and its close reports all
    80 ``spilled_at_close`` ("handed on: the next outbox delivers exactly those") where no
    file of it exists.  (Operations: "Nothing is reported spilled_at_close that is not on disk".)"""
    spill = tmp_path / "spill"
    box = Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(spill), shutdown_timeout=1)
    for n in range(50):
        assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
    assert wait_until(lambda: box.stats().spill["written"] == 50)
    shutil.rmtree(spill)
    spill.write_text("an operator's file where the directory was")
    for n in range(50, 80):
        assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
    time.sleep(0.5)
    report = box.close()
    assert spill.is_file()  # nothing of the outbox is on any disk
    assert report.undelivered.get("spilled_at_close", 0) == 0, report


# -- 3. a full disk: delivered events handed on again by a clean close ----------------------------


def test_a_clean_close_on_a_full_disk_hands_on_only_what_it_counts_spilled_at_close(tmpfs):
    """200 events on disk, then the disk fills (someone else's file).  The backend takes some
    of them (the settlements saying so cannot be written: ENOSPC), then fails again; the close
    counts the rest ``spilled_at_close``.  The next outbox (room again) delivers the rest *and*
    every event the first had delivered: duplicates with no crash, and more than
    ``spilled_at_close``."""
    spill = tmpfs / "spill"
    behaviour = SinkBehaviour(fail_status=503)
    with Sink(behaviour=behaviour) as sink:
        box = Outbox(
            HttpTransport(sink.url),
            spill_dir=str(spill),
            max_batch_events=10,
            max_concurrency=1,
            backoff_base=0.05,
            backoff_cap=0.2,
            shutdown_timeout=1,
        )
        for n in range(200):
            assert box.emit(padded(n))
        assert wait_until(lambda: box.stats().spill["written"] == 200)
        fill(tmpfs)
        for n in range(200, 220):  # the disk refuses them: the writer knows it is failing
            assert box.emit(padded(n))
        assert wait_until(lambda: box.stats().spill["not_spilled_failed"] > 0, 5), box.stats().spill
        behaviour.fail_status = None
        assert sink.wait_for(30, 20)
        behaviour.fail_status = 503
        time.sleep(0.5)
        first = set(ns(sink))
        handed_on = box.close().undelivered["spilled_at_close"]
        free(tmpfs)
        sink.clear()
        behaviour.fail_status = None
        assert Outbox(HttpTransport(sink.url), spill_dir=str(spill)).close(20).complete
        second = ns(sink)
    assert first
    assert not set(second) & first, f"{len(set(second) & first)} delivered again, no crash"
    assert len(second) == handed_on, (len(second), handed_on)


def test_a_successor_starts_on_a_disk_a_dead_owner_left_full_and_delivers_its_events(tmpfs):
    """A process died with 100 events on disk, and the disk then filled.  Its successor could
    not write its own lock: ``Outbox()`` raised (ENOSPC), and the application could not start
    until someone freed space.  A dead owner's reserve (the room it kept for its settlements) is
    of no use once it is dead (its successor settles in its own files): the successor frees it,
    starts, and delivers every event."""
    spill = tmpfs / "spill"
    dead_owner(spill, 0, 100)
    (dead,) = owner_dirs(spill)
    assert (dead / "reserve").exists()
    fill(tmpfs)
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        assert box.close(20).complete
        delivered = ns(sink)
    assert sorted(set(delivered)) == list(range(100))


def test_on_a_disk_full_of_dead_owners_with_no_reserve_left_each_successor_adopts_them(tmpfs):
    """A process died with 100 events on disk and no reserve left (it spent it on settlements
    when the disk filled), the disk full: its successor could not write its lock, started in
    memory, and could never take the dead owner in (a rename into a directory it did not have).
    Freeing other files did not help when the spill's own files filled the disk (a
    ``max_spill_bytes`` above the disk's room): the events stayed on disk for good.  Now the
    successor takes the dead owner's directory over as its own (a rename: no room needed) and
    adopts it; and so does the next one, when that successor dies before delivering (a crash
    loop on a full disk); the last delivers all 100."""
    spill = tmpfs / "spill"
    dead_owner(spill, 0, 100)
    (dead,) = owner_dirs(spill)
    (dead / "reserve").unlink()
    fill(tmpfs)
    for generation in range(2):  # each one adopts the last one's files, and dies with them
        box = Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(spill), shutdown_timeout=0.5)
        assert box.stats().spill["owners_adopted"] == 1, (generation, box.stats().spill)
        box.close()
        assert owner_dirs(spill) != [dead]
        (dead,) = owner_dirs(spill)
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        report = box.close(20)
        assert report.complete, report
        delivered = ns(sink)
    assert sorted(set(delivered)) == list(range(100))


def test_on_a_full_disk_with_no_reserve_to_free_an_outbox_starts_in_memory_then_spills(tmpfs, caplog):
    """A disk full of someone else's files, no dead owner's reserve to free: the outbox cannot
    make its directory.  It raised ConfigError: the application could not start, for want of a
    disk it needs only in an outage.  Now it starts in memory (as when its directory vanishes),
    says so once (the error and the fix), counts ``failed_enospc``, delivers, and makes its
    directory, and spills, once the disk has room."""
    spill = tmpfs / "spill"
    fill(tmpfs)
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), spill_interval=0.05)
        try:
            assert "failed (No space left on device): the disk is full: free space" in caplog.text
            assert box.stats().spill["failed_enospc"] == 1
            for n in range(20):
                assert box.emit(run_event(run_id=RUNS[0], n=n))
            assert sink.wait_for(20, 20)
            assert not [p for p in spill.iterdir() if not p.name.startswith("filler")]  # nothing made
            free(tmpfs)
            n = 20
            deadline = time.monotonic() + 30  # (the directory is tried again 5 s after a failure)
            while not box.stats().spill["written"] and time.monotonic() < deadline:
                assert box.emit(run_event(run_id=RUNS[0], n=n))
                n += 1
                time.sleep(0.05)
            assert box.stats().spill["written"], box.stats().spill
            assert len(owner_dirs(spill)) == 1
            # (the counts of the files it had none of are carried on: a counter never goes back)
            assert box.stats().spill["failed_enospc"] >= 1, box.stats().spill
        finally:
            assert box.close(20).complete
    assert sorted(set(ns(sink))) == list(range(n))


def test_an_outbox_that_never_had_a_disk_does_not_say_a_successor_delivers_its_events_again(tmpfs, caplog):
    """An outbox on a full disk delivers in memory and closes: none of its events was ever on
    disk.  Its close said "20 event(s) were delivered, but that could not be written down ...:
    the next outbox started with it delivers them again": false, and an alarm for nothing.  A
    settlement left unwritten is counted only for events a successor would find on disk."""
    spill = tmpfs / "spill"
    fill(tmpfs)
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), spill_interval=0.05)
        for n in range(20):
            assert box.emit(run_event(run_id=RUNS[0], n=n))
        assert sink.wait_for(20, 20)
        assert box.close(20).complete
    assert box.stats().spill["written"] == 0
    assert "could not be written down" not in caplog.text


def test_an_adopted_owner_keeps_no_reserve(tmp_path):
    """A dead owner's reserve is deleted when it is adopted: its settlements are the adopter's to
    write, in its own files and room.  It was kept, 64 KiB per adopted owner, for as long as any
    of its events was live: a chain of crashes piled them up on the disk they were to help."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 20)
    (dead,) = owner_dirs(spill)
    assert (dead / "reserve").exists()
    box = Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(spill), shutdown_timeout=1)
    try:
        assert box.stats().spill["owners_adopted"] == 1
        assert not list(spill.glob("*/*/reserve")), list(spill.glob("*/*/reserve"))
    finally:
        box.close()


# -- 4. a close that cannot write its losses deletes dead owners' files it says it leaves ---------


def test_a_close_that_cannot_write_its_losses_leaves_the_dead_owners_it_had_not_taken_in(tmpfs):
    """A full disk, the backend down, drop_oldest evicting (losses whose settlements cannot be
    written), the memory window's overflow holding events.  A dead owner with 20 events shows
    up; the close adopts it (a rename: no room needed) but cannot take it in (the overflow
    holds events), and reports ``spill_left == {"events": 20}``: left for the next outbox.  But
    its losses' settlements are unwritten, so it deletes "its files" (``drop_all``), and with
    them the dead owner's: 20 events neither delivered nor counted by anyone."""
    spill = tmpfs / "spill"
    parked = tmpfs / "parked"  # (same filesystem: moved in later by a rename)
    dead_owner(parked, 5000, 20)
    (dead,) = parked.iterdir()
    box = Outbox(
        HttpTransport(refused_url(), timeout=0.5),
        spill_dir=str(spill),
        max_events=400,
        max_batch_events=10,  # (the worker takes at most 128 in flight: the queue keeps some)
        policy="drop_oldest",
        shutdown_timeout=1,
    )
    for n in range(200):
        assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
    assert wait_until(lambda: box.stats().spill["written"] == 200)
    fill(tmpfs)
    n = 200
    deadline = time.monotonic() + 10
    while not box.stats().spill.get("failed_enospc") and time.monotonic() < deadline:
        box.emit(run_event(run_id=RUNS[n % 4], n=n))  # until a write fails: then none for 5 s
        n += 1
        time.sleep(0.005)
    assert box.stats().spill.get("failed_enospc"), box.stats().spill
    for k in range(n, n + 500):  # drop_oldest evicts: losses whose settlements wait
        box.emit(run_event(run_id=RUNS[k % 4], n=k))
    assert box.stats().dropped.get("dropped_full"), box.stats()
    assert box.stats().spill["overflow_events"] > 0
    dead.rename(spill / dead.name)
    report = box.close()
    assert report.spill_left == {"events": 20, "owners": 0}, report
    free(tmpfs)
    with Sink() as sink:
        assert Outbox(HttpTransport(sink.url), spill_dir=str(spill)).close(20).complete
        delivered = ns(sink)
    assert sorted(n for n in delivered if n >= 5000) == list(range(5000, 5020)), sorted(delivered)


# -- 5. a checkpoint that forgets a stream with no live events -----------------------------------


def test_a_checkpoint_restates_the_settlements_of_every_stream_whose_events_stay_on_disk(tmp_path):
    """An outbox holding an adopted owner's live events, whose own events 5-24 (in a segment
    that is the checkpoint's) are counted lost; the settlement saying so is in the next
    segment.  ``make_room`` deletes that segment after a new checkpoint, which restates only
    the streams with live events (the adopted one): until the next tick deletes the segment of
    events 5-24, a SIGKILL hands them on, counted lost here and delivered by the successor
    (and for as long as the disk fails, or at close if the adopted events are still live)."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 5)
    (dead,) = owner_dirs(spill)
    home = Home(str(spill))
    disk = Disk(home, 64 * 1024, RateLimitedLog(30))  # segments of 8 KiB
    adopted = os.path.join(home.path, dead.name)
    os.rename(dead, adopted)  # as _adopt does
    live = disk.streams.replay(segment_paths(adopted), print)
    assert {name: list(numbers) for name, numbers in live.items()} == {dead.name: [(0, 5)]}
    lock, me = threading.Lock(), home.owner

    def events(first: int, end: int) -> list[tuple[int, SerializedEvent]]:
        return [
            (i, SerializedEvent(b'{"n": %d, "p": "%s"}' % (i, b"x" * 500), RUNS[0], None))
            for i in range(first, end)
        ]

    # Own events 0-4 lost, an adopted one delivered: their file goes, a checkpoint first.
    disk.append(events(0, 5), lock, lambda: None)
    disk.settled({(me, "dropped_full"): Ranges([(0, 5)]), (dead.name, "delivered"): Ranges([(0, 1)])})
    disk.make_room()
    # Own events 5-24 fill the checkpoint's segment past 8 KiB (it rotates), then are lost.
    disk.append(events(5, 25), lock, lambda: None)
    disk.settled({(me, "dropped_full"): Ranges([(5, 25)])})
    disk.make_room()  # (one tick)
    # What a successor hands on if this process is SIGKILLed now.
    handed = Streams().replay(segment_paths(home.path), lambda *args: None)
    assert not handed.get(me), f"counted lost, handed on: {handed.get(me)}"
    home.release()


def test_a_file_whose_settlements_no_checkpoint_needs_goes(tmp_path):
    """Own events 0-4 are on disk and live; 5-9 were never written (the disk refused them) and are
    counted lost, in a segment of its own that settles nothing on disk.  The checkpoint that file
    would need restates nothing (no settled number has a record on disk), so the file goes.  It
    was: an empty checkpoint written nowhere, and that very file kept as the checkpoint's while
    anything was live."""
    home = Home(str(tmp_path / "spill"))
    disk = Disk(home, 64 * 1024, RateLimitedLog(30))
    me, lock = home.owner, threading.Lock()
    disk.append([(i, SerializedEvent(b'{"n": %d}' % i, RUNS[0], None)) for i in range(5)], lock, lambda: None)
    disk.rotate()
    disk.settled({(me, "dropped_full"): Ranges([(5, 10)])})
    disk.write_settlements()
    settles_only = disk.last
    assert settles_only is not None
    assert not settles_only.numbers
    disk.make_room()
    assert not os.path.exists(settles_only.path)
    assert disk.streams.checkpoint_file is None
    handed = Streams().replay(segment_paths(home.path), lambda *args: None)
    assert list(handed[me]) == [(0, 5)]
    home.release()


# -- 6. an event larger than the spill: everything after it dropped_spill_full --------------------


def test_one_event_the_spill_cannot_hold_does_not_make_it_refuse_every_later_one(tmp_path):
    """During an outage, one event larger than max_spill_bytes (less the settlements' room)
    reaches the head of the memory window's overflow.  It was: ``release`` wrote nothing past it
    (the records of a stream in number order), the overflow filled, and every later event was
    refused ``dropped_spill_full`` (290 of 340) while the directory held 25 KB of its 256 KiB.
    Now a tombstone takes its place on disk: every later event is written, and whoever reads it
    back counts that one event ``dropped_spill_full``, in its order."""
    spill = tmp_path / "spill"
    box = Outbox(
        HttpTransport(refused_url(), timeout=0.5),
        spill_dir=str(spill),
        max_events=100,
        max_spill_bytes=256 * 1024,
        shutdown_timeout=1,
        policy="drop_newest",
    )
    for n in range(60):
        assert box.emit(run_event(run_id=RUNS[0], n=n))
    assert wait_until(lambda: box.stats().spill["written"] == 60)
    assert box.emit(padded(60, 300_000))
    for n in range(61, 400):
        if n % 10 == 0:  # (paced by the spill: the 100 in memory never fill, however busy the machine)
            assert wait_until(lambda n=n: box.stats().spill["written"] >= n - 40), box.stats().spill
        assert box.emit(run_event(run_id=RUNS[0], n=n))
    assert wait_until(lambda: box.stats().spill["written"] == 400), box.stats().spill
    stats = box.stats()
    assert stats.dropped == {}, stats.dropped
    assert stats.spill["spilled_bytes"] < 256 * 1024
    assert box.close().undelivered == {"spilled_at_close": 400}
    with Sink() as sink:
        successor = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        report = successor.close(20)
        delivered = ns(sink)
    assert delivered == [*range(60), *range(61, 400)]
    assert report.undelivered == {"dropped_spill_full": 1}, report


# -- 7. a segment of another owner's name: delivered and counted lost -----------------------------


def test_a_segment_naming_another_owner_is_never_both_delivered_and_counted_lost(tmp_path):
    """Two dead owners; in the first's directory, a segment whose (valid) header names the
    second, holding numbers the second never wrote.  The successor delivers those 5 events
    (from the first's run) and counts the same 5 ``spill_lost`` (the second's run is handed the
    union of every replay's live numbers of that stream, ``Ranges(stream.live)``, and finds
    them missing)."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 10)
    dead_owner(spill, 100, 10)
    first, second = owner_dirs(spill)
    forged = b"".join(
        encode_event(
            1000 + i, 0.0, SerializedEvent(orjson.dumps(run_event(run_id=RUNS[0], n=9000 + i)), RUNS[0], None)
        )
        for i in range(5)
    )
    (first / "00000099.seg").write_bytes(file_header(second.name) + forged)
    with Sink() as sink:
        report = Outbox(HttpTransport(sink.url), spill_dir=str(spill)).close(20)
        delivered = ns(sink)
    both = [n for n in delivered if n >= 9000]
    assert not (both and report.undelivered.get("spill_lost")), (both, report.undelivered)


# -- 8. an outbox started on a full disk: its directory made only when it has an event to write ----


def test_an_outbox_started_on_a_full_disk_makes_its_directory_once_there_is_room_with_the_backend_down(
    tmpfs,
):
    """The disk full at start (no reserve to free): the outbox starts in memory.  The backend is
    down; 10 events are emitted, the sender takes them (in flight, refused by the disk: counted
    ``not_spilled_failed``).  The disk is then freed.  The directory was made again only by a
    write (``_append``), and no event was left to write: 12 s on (RETRY_AFTER is 5 s), no
    directory.  Now the tick tries it again: it is made, and the events emitted after it are
    written.  The 10 taken while there was none are not written after the fact: the close
    counts them ``dropped_shutdown`` (docs/operations.md)."""
    spill = tmpfs / "spill"
    fill(tmpfs)
    box = Outbox(
        HttpTransport(refused_url(), timeout=0.5),
        spill_dir=str(spill),
        shutdown_timeout=1,
        spill_interval=0.05,
        backoff_base=0.05,
        backoff_cap=0.2,
    )
    try:
        assert box.stats().spill["failed_enospc"] == 1
        for n in range(10):
            assert box.emit(run_event(run_id=RUNS[0], n=n))
        time.sleep(0.5)
        free(tmpfs)
        assert wait_until(lambda: owner_dirs(spill), 12), box.stats().spill  # (made within RETRY_AFTER)
        for n in range(10, 20):
            assert box.emit(run_event(run_id=RUNS[0], n=n))
        assert wait_until(lambda: box.stats().spill["written"] == 10, 5), box.stats().spill
    finally:
        report = box.close()
    assert report.undelivered == {"dropped_shutdown": 10, "spilled_at_close": 10}, report


def test_an_outbox_started_on_a_full_disk_reports_the_dead_owners_it_could_not_take_over(
    tmpfs, caplog, monkeypatch
):
    """An outbox in memory on a full disk (no dead owner then, to make its directory with), and
    then a dead owner's 50 events show up, its reserve already used: the close finds it with no
    directory to rename it into.  The rename failed ENOENT, which ``_adopt`` read as "another
    process adopted it first": the close reported ``spill_left == {"events": 0, "owners": 0}``
    and said nothing of the 50 events it left on the disk.  (It also warned that the 10 events
    it delivered "could not be written down" and that "the next outbox ... delivers them
    again": they were never on disk.)"""
    spill = tmpfs / "spill"
    parked = tmpfs / "parked"  # (same filesystem: moved in later by a rename)
    dead_owner(parked, 0, 50)
    (dead,) = owner_dirs(parked)
    os.unlink(dead / "reserve")
    fill(tmpfs)
    monkeypatch.setattr("outbox._spill._disk.RETRY_AFTER", 600.0)  # (its directory not tried again)
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), shutdown_timeout=3)
        for n in range(100, 110):
            assert box.emit(run_event(run_id=RUNS[0], n=n))
        assert sink.wait_for(10, 10)
        dead = dead.rename(spill / dead.name)
        report = box.close(3)
    assert owner_dirs(spill) == [dead]  # (left on the disk, whole)
    assert segment_paths(str(dead))
    assert report.spill_left["owners"] == 1, report
    assert "could not be written down" not in caplog.text


def test_on_a_full_disk_the_reserve_is_spent_on_settlements_never_on_events(tmpfs):
    """A full disk: the owner's events on disk are lost (evicted under drop_oldest), and each
    loss must be written before the next events are sent, or a successor delivers an event
    counted lost here after that run's later events (the chaos test on a small disk saw it).
    The reserve is there for it, released when a settlement finds the disk full.  But the next
    write of events (the disk no longer failing) took that room, and the losses after it could
    not be written.  Now no event is written until the reserve can be made again: its room is
    the settlements'."""
    home = Home(str(tmpfs / "spill"))
    disk = Disk(home, 1024**3, RateLimitedLog(30))
    me, lock = home.owner, threading.Lock()
    assert disk.reserve == disk.settle_room

    def events(first: int, end: int) -> list[tuple[int, SerializedEvent]]:
        return [
            (i, SerializedEvent(b'{"n": %d, "p": "%s"}' % (i, b"x" * 900), RUNS[0], None))
            for i in range(first, end)
        ]

    assert disk.append(events(0, 100), lock, lambda: None) == 100
    fill(tmpfs)
    first = disk.append(events(100, 200), lock, lambda: None)  # (the last page's room, then ENOSPC)
    assert first < 100
    assert disk.failing
    for n in range(100):  # each loss written before the next events are offered
        disk.settled({(me, "dropped_full"): Ranges([(n, n + 1)])})
        disk.write_settlements()
        assert not disk.unsettled, f"the loss of event {n} is not on disk"
        disk.append(events(200 + 10 * n, 210 + 10 * n), lock, lambda: None)
    assert disk.reserve < disk.settle_room  # (events wait for a whole one)
    assert disk.written == 100 + first, disk.written  # (none since the disk filled)
    assert disk.not_spilled == {"spill_failed": 1100 - first}, disk.not_spilled


def test_an_owner_made_on_a_full_disk_keeps_a_reserve_and_its_deliveries_are_not_sent_again(tmpfs):
    """The chaos test on a small disk (seed 9802, 3 runs in 15): an owner made on a full disk by
    freeing a dead owner's 64 KiB reserve had a little less than that left, asked for a whole
    reserve, got none, and wrote none of its settlements; it delivered most of what it adopted,
    its successor adopted all of it again, and (the disk still full) counted lost at its close
    what had been delivered.  Now it keeps what it can get (halving down to a page) for its
    settlements: its successor delivers only what it had not."""
    from outbox.transports import Outcome

    from support.helpers import ScriptedTransport

    spill = tmpfs / "spill"
    dead_owner(spill, 0, 500)
    fill(tmpfs)

    def decide(event: dict) -> Outcome:  # (the backend goes down after the first 400)
        return Outcome.delivered() if event["n"] < 400 else Outcome.retry("backend_down")

    transport = ScriptedTransport(decide)  # (a settlement record a batch: pages of them)
    x = Outbox(transport, spill_dir=str(spill), max_batch_events=1, close_at_exit=False)
    disk = parts.spill(x).disk  # type: ignore[union-attr]
    assert 0 < disk.reserve < disk.settle_room  # (before: 0)
    fill(tmpfs)  # (what room was left, taken by someone else: as in the chaos test)
    assert wait_until(lambda: len(transport.delivered) == 400)
    report = x.close(0.5)
    assert report.undelivered == {"spilled_at_close": 100}, report
    free(tmpfs)
    with Sink() as sink:
        assert Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False).close(20).complete
        assert sorted(ns(sink)) == list(range(400, 500))  # (before: 0-499, the first 400 again)


@pytest.mark.parametrize("max_spill_bytes", [16 * 1024, 1024**3])
def test_a_reserve_is_kept_whatever_max_spill_bytes_and_made_again_if_removed(tmpfs, max_spill_bytes):
    """helper-40: below 32 KiB of max_spill_bytes the reserve (an eighth of it) was under the
    page the halving stopped at: none was ever made, and after one full disk no event was
    written again, the disk freed.  And a reserve an operator removed was never made again:
    the next full disk took none of the settlements."""
    home = Home(str(tmpfs / "spill"))
    disk = Disk(home, max_spill_bytes, RateLimitedLog(30))
    lock = threading.Lock()
    assert disk.reserve == disk.settle_room
    events = [
        (i, SerializedEvent(b'{"n": %d, "p": "%s"}' % (i, b"x" * 300), RUNS[0], None)) for i in range(400)
    ]
    assert disk.append(events[:5], lock, lambda: None) == 5
    fill(tmpfs)
    disk.append(events[5:200], lock, lambda: None)
    assert disk.refusing
    free(tmpfs)
    disk.retry_at = 0.0  # (the disk is tried again: RETRY_AFTER passed)
    disk.make_room()
    assert disk.reserve == disk.settle_room
    assert disk.append(events[200:210], lock, lambda: None) == 10  # (before, at 16 KiB: 0)
    os.unlink(os.path.join(home.path, "reserve"))  # an operator's rm
    assert disk.append(events[210:220], lock, lambda: None) == 10  # (a write looks at it)
    disk.make_room()
    assert os.path.getsize(os.path.join(home.path, "reserve")) == disk.settle_room


def test_an_emfile_listing_a_directory_taken_over_on_a_full_disk_leaves_it_named(tmpfs, monkeypatch):
    """helper-40: a successor that took a dead owner's directory over on a full disk listed its
    files leniently: one EMFILE there, and it replayed nothing, closed complete, and left the
    100 events on disk (delivered later by the next outbox, after newer ones of their runs).
    Now the take-over lets go (the directory, of its name, is a dead owner's again) and the
    outbox starts in memory: its close names the owner it left."""
    import errno

    from outbox._spill import _order

    spill = tmpfs / "spill"
    dead_owner(spill, 0, 100)
    (dead,) = owner_dirs(spill)
    (dead / "reserve").unlink()  # (none to free: the directory is taken over)
    fill(tmpfs)
    strict_listing = _order.segment_paths

    def once(directory: str, *args: object) -> list[str]:
        monkeypatch.setattr(_order, "segment_paths", strict_listing)
        raise OSError(errno.EMFILE, "Too many open files", directory)

    monkeypatch.setattr(_order, "segment_paths", once)
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False)
        for n in range(1000, 1010):
            assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: len(sink.events) >= 10)
        report = box.close(2)
        assert not report.complete, report  # (before: complete, the 100 events on disk)
        assert report.spill_left == {"events": 0, "owners": 1}
        free(tmpfs)
        assert Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False).close(20).complete
        assert sorted(ns(sink)) == [*range(100), *range(1000, 1010)]


# -- an operator's rm -rf looping under the spill directory -------------------------------------


def test_an_rm_loop_under_the_spill_directory_never_fails_a_start_nor_loses_a_batch(tmp_path):
    """helper-36: with everything in the spill directory removed in a loop (a careless cleanup
    job), 19-37% of ``Outbox()`` raised: the owner's directory, removed the instant it was made,
    made ``os.stat`` raise FileNotFoundError (or the making a ConfigError).  A running outbox
    whose new directory went the same way raised out of the spill's write of a batch it had just
    taken, and that batch was never sent (close with the backend up: 10 of 30 delivered).  Now a
    start makes its directory again (a few times), a directory removed as it is made is noticed
    at the first write, and the spill's write never raises."""
    import subprocess
    import sys

    spill = tmp_path / "spill"
    spill.mkdir()
    loop = "import os, shutil, sys\nwhile True:\n    for n in os.listdir(sys.argv[1]):\n"
    loop += "        shutil.rmtree(os.path.join(sys.argv[1], n), ignore_errors=True)\n"
    remover = subprocess.Popen([sys.executable, "-c", loop, str(spill)])
    behaviour = SinkBehaviour(fail_status=503)
    try:
        with Sink(behaviour=behaviour) as sink:
            box = Outbox(HttpTransport(sink.url, timeout=0.5), spill_dir=str(spill), spill_interval=0.01)
            for n in range(300):
                box.emit(run_event(run_id=RUNS[n % 4], n=n))
                time.sleep(0.002)
            behaviour.fail_status = None
            report = box.close(20)
            assert (report.delivered, dict(report.undelivered)) == (300, {})
            for n in range(300, 360):  # starts, each racing the loop
                box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False)
                box.emit(run_event(n=n))
                assert box.close(10).delivered == 1, n
            delivered = ns(sink)
    finally:
        remover.kill()
        remover.wait()
    assert set(delivered) == set(range(360))


# -- settlements beyond max_spill_bytes ------------------------------------------------------------


def test_a_full_spill_still_writes_every_settlement_so_a_successor_never_undoes_a_loss(tmp_path):
    """helper-36 (and the chaos test's seed 1018): T, a successor with a 48 KiB spill, adopts
    4,000 events while its own events, which the backend answers 'retry', fill its spill; its
    settlements, held to max_spill_bytes too, stopped fitting, and it went on sending.  Killed,
    it left 16 settlement records unwritten: U delivered 64 of the events T had counted lost, 63
    after T had delivered a later event of their run, and sent 473 that T had delivered again.
    Settlements are not held to max_spill_bytes now (the disk alone refuses them)."""
    import json
    import signal

    from outbox.transports import Outcome

    from support.helpers import ScriptedTransport

    count, spill, alone = 4000, tmp_path / "spill", tmp_path / "alone"
    box = Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(alone), max_events=count + 10)
    for n in range(count):
        box.emit(run_event(run_id=RUNS[n % 4], n=n))
    assert wait_until(lambda: box.stats().spill["written"] == count, 30)
    assert box.close(1).undelivered == {"spilled_at_close": count}
    alone.rename(spill)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child: T)
        try:
            answered: list[tuple[int, bool]] = []  # (n, counted lost), in the order answered

            def decide(event: dict) -> Outcome:
                if event["n"] >= 100_000:  # T's own events: never taken, they fill its spill
                    return Outcome.retry("backend_down")
                answered.append((event["n"], event["n"] % 8 == 1))
                if len(answered) >= 3000:
                    transport.gate.clear()  # (no answer after this batch: none in flight but it)
                return (
                    Outcome.rejected("rejected_by_backend", "t")
                    if event["n"] % 8 == 1
                    else Outcome.delivered()
                )

            transport = ScriptedTransport(decide, delay=0.1)
            t = Outbox(
                transport,
                spill_dir=str(spill),
                spill_interval=0.02,
                max_spill_bytes=48 * 1024,
                max_events=200,
                max_batch_events=50,
                policy="drop_newest",
            )

            def own() -> None:
                for k in range(100_000, 200_000):
                    event = run_event(run_id=RUNS[k % 4], n=k)
                    event["run"]["facets"]["pad"] = {"_producer": "x", "_schemaURL": "x", "p": "x" * 1024}
                    t.emit(event)
                    time.sleep(0.002)

            threading.Thread(target=own, daemon=True).start()
            wait_until(lambda: len(answered) >= 3000, 60)
            time.sleep(1.0)  # (its settlements written, if they can be)
            os.write(write, json.dumps(answered).encode())
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(3)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 20):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    answered = json.loads(data)
    assert len(answered) >= 3000
    with Sink() as sink:
        assert Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False).close(60).complete
        got = {n for n in ns(sink) if n < count}
    lost = {n for n, was_lost in answered if was_lost}
    delivered = {n for n, was_lost in answered if not was_lost}
    assert sorted(got & lost) == []  # counted lost by T, delivered by U: never both
    assert sorted(got & delivered) == []  # none was in flight but the last batch, never answered
    assert got | lost | delivered == set(range(count))


# -- an owner's lock file removed or replaced ------------------------------------------------------


def test_a_dead_owner_whose_lock_file_was_removed_is_still_adopted(tmp_path):
    """helper-36: an operator deleting a dead owner's 'stale' lock file (or its owner killed
    after it was removed) left its events for ever: no lock, no probe, never adopted, never
    counted, every later close complete.  A directory of ours with no lock file is gone if no
    one holds the directory's own lock and it holds segments of its name."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 20)
    (home,) = owner_dirs(spill)
    (home / "lock").unlink()
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False)
        report = box.close(20)
        delivered = ns(sink)
    assert report.complete
    assert sorted(delivered) == list(range(20))
    assert box.stats().spill["owners_adopted"] == 1


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_live_owners_lock_file_removed_or_replaced_leaves_its_events_its_own(tmp_path, how):
    """helper-36: the lock file of a live owner replaced by an identical copy (a restore, rsync,
    cp -a) let another process adopt it while it lived: 90 events counted spill_lost by the
    owner and delivered by the adopter, 10 delivered twice.  Removed, the owner took it for its
    directory removed and deleted its intact files, counting 140 spill_lost.  The owner's lock is
    now its directory's own flock (no file operation in it takes that away), and the owner makes
    its lock file again."""
    spill = tmp_path / how
    behaviour = SinkBehaviour(fail_status=503)
    with Sink(behaviour=behaviour) as sink:
        owner = Outbox(
            HttpTransport(sink.url, timeout=0.5),
            spill_dir=str(spill),
            spill_interval=0.02,
            close_at_exit=False,
        )
        for n in range(20):
            owner.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: owner.stats().spill["written"] == 20, 20)
        (home,) = owner_dirs(spill)
        text = (home / "lock").read_bytes()
        (home / "lock").unlink()
        if how == "replaced":
            (home / "lock").write_bytes(text)
        with Sink() as other:  # another process's outbox, its backend up
            successor = Outbox(HttpTransport(other.url), spill_dir=str(spill), close_at_exit=False)
            assert successor.close(10).complete
            assert other.events == []  # the live owner's events are not its to take
            assert successor.stats().spill["owners_adopted"] == 0
        for n in range(20, 30):
            owner.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: owner.stats().spill["written"] == 30, 20)
        assert (home / "lock").read_bytes() == text  # made again by its owner
        behaviour.fail_status = None
        report = owner.close(20)
        delivered = ns(sink)
    assert (report.delivered, dict(report.undelivered)) == (30, {})
    assert sorted(delivered) == list(range(30))


def test_what_is_named_like_a_segment_but_is_no_file_is_left_alone(tmp_path):
    """helper-36: a FIFO, or a link to /dev/zero, named like a segment in a dead owner's
    directory was taken for an empty segment (its size 0: a file its maker died writing) and
    deleted.  Only a regular file is one of ours; the rest is foreign, counted, left."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 5)
    (home,) = owner_dirs(spill)
    assert [path.name for path in home.glob("*.seg")] == ["00000001.seg"]
    os.mkfifo(home / "00000000.seg")  # (read in place before it, max_events=4: it must not wait)
    os.mkfifo(home / "00000098.seg")
    os.symlink("/dev/zero", home / "00000099.seg")
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), max_events=4, close_at_exit=False)
        report = box.close(20)
        delivered = ns(sink)
    assert report.complete
    assert sorted(delivered) == list(range(5))
    assert box.stats().spill["foreign_files"] == 3
    left = {path.name for path in spill.rglob("*.seg")}
    assert left == {"00000000.seg", "00000098.seg", "00000099.seg"}


def test_starts_racing_scans_never_fail(tmp_path):
    """helper-38: a scan (every outbox's, at start, at close and every 5 s) locked a starting
    owner's .tmp-ID between its mkdir and its own lock: 0.3-2% of 3,000 starts beside two
    scanning processes failed with ConfigError.  A .tmp-ID is probed only once it is old."""
    import subprocess
    import sys

    from outbox._spill._owners import Home

    scan = (
        "import os, sys\\nfrom outbox._spill._owners import dead_owners\\n"
        "while True:\\n    [os.close(fd) for _, fd in dead_owners(sys.argv[1], 'x')]\\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    scanners = [subprocess.Popen([sys.executable, "-c", scan, str(tmp_path)], env=env) for _ in range(2)]
    try:
        for _ in range(600):
            home = Home(str(tmp_path))  # raises ConfigError if it fails
            home.release()
            shutil.rmtree(home.path)
    finally:
        for scanner in scanners:
            scanner.kill()
            scanner.wait()


@pytest.mark.parametrize("lock", ["removed", "emptied", "a directory", "a FIFO"])
def test_a_dead_owner_whose_lock_file_is_gone_or_damaged_is_adopted(tmp_path, lock):
    """helper-38: a lock file emptied, or replaced by a directory or a FIFO, stranded a dead owner
    for good (its successor closed complete, 0 of 20 delivered).  An owner of this release marks
    its directory as locking itself: its lock file is then only a mark of ours."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 20)
    (home,) = owner_dirs(spill)
    (home / "lock").unlink()
    if lock == "emptied":
        (home / "lock").write_bytes(b"")
    elif lock == "a directory":
        (home / "lock").mkdir()
    elif lock == "a FIFO":
        os.mkfifo(home / "lock")
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False)
        assert box.close(20).complete
        delivered = ns(sink)
    assert sorted(delivered) == list(range(20))


def test_a_live_owner_of_an_earlier_release_whose_lock_file_is_removed_is_not_adopted(tmp_path):
    """helper-38: an earlier release's owner locks its lock file only; that file removed (a tmp
    cleaner), this release took the owner for dead and delivered its 200 events while it lived
    (200 twice).  Without the locks-directory mark a directory with no lock file is not ours to
    take: it is what an earlier release made."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 20)
    (home,) = owner_dirs(spill)
    (home / "locks-directory").unlink()  # (what an earlier release's owner made: no mark)
    (home / "lock").unlink()
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False)
        assert box.close(10).complete
        assert sink.events == []
    assert box.stats().spill["owners_adopted"] == 0
    assert len(list(home.glob("*.seg"))) == 1  # left where it is
