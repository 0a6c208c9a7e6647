"""The spill as a log, tried as a hostile operator would: several dead owners at once, an owner
that died while adopting, damaged and foreign files, a directory removed under a running
outbox, a successor far smaller than what it adopts.  Real outboxes, real files, a real
``outbox sink``; children killed with SIGKILL where a crash is the point."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path

import orjson
import pytest

from outbox import Outbox
from outbox._run._serde import SerializedEvent
from outbox._spill import inspect_dir
from outbox._spill._format import SegmentReader, encode_event, file_header
from outbox._spill._owners import LOCK_TEXT
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import HttpTransport

from support import parts
from support.helpers import refused_port, run_event, wait_until
from support.spill_children import read_line, start_child, tell
from support.spill_log import waiting

RUNS = [f"00000000-0000-4000-8000-{i:012d}" for i in range(4)]


def refused_url() -> str:
    """A loopback port nobody listens on, held for the rest of this process (``refused_port``)."""
    return f"http://127.0.0.1:{refused_port()}"


def dead_owner(spill: Path, first: int, count: int) -> None:
    """An owner gone with ``count`` events (``n`` from ``first``) left in ``spill``: an outbox
    that closed with the backend down in a directory of its own (so that it adopts no other
    one), then moved in."""
    alone = spill.parent / f"alone-{first}"
    box = Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(alone), shutdown_timeout=1)
    for n in range(first, first + count):
        assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
    assert wait_until(lambda: box.stats().spill["written"] == count), box.stats().spill
    assert box.close().undelivered == {"spilled_at_close": count}
    spill.mkdir(exist_ok=True)
    for owner in alone.iterdir():
        owner.rename(spill / owner.name)
    alone.rmdir()


def let_go(owner: Path) -> None:
    """Wait until the closed owner's directory is no longer locked: a close whose deadline has
    passed returns its report while its worker still lets go of the directory."""

    def free(path: Path) -> bool:
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)  # (and the lock with it)

    assert wait_until(lambda: free(owner) and free(owner / "lock"))  # (both: a scan probes both)


def ns(sink: Sink) -> list[int]:
    return [event["n"] for event in sink.events]


def owner_dirs(spill: Path) -> list[Path]:
    return sorted(path for path in spill.iterdir() if path.is_dir() and not path.name.startswith("."))


# -- every dead owner, and a close that tells the truth ---------------------------------------


def test_every_dead_owner_is_adopted_at_start_and_a_drain_and_exit_job_delivers_them_all(tmp_path):
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 100)
    dead_owner(spill, 1000, 100)
    alone = tmp_path / "alone"
    killed = start_child(
        {"url": refused_url(), "dir": str(alone), "mode": "batch", "count": 100, "first": 2000, "runs": RUNS}
    )
    read_line(killed, "spilled ")
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate()
    (owner,) = alone.iterdir()
    owner.rename(spill / owner.name)
    assert inspect_dir(spill)["owners_gone"] == 3
    with Sink() as sink:
        env = {"OPENLINEAGE_URL": sink.url, "OUTBOX_SPILL_DIR": str(spill)}
        job = Outbox.from_env(env)  # a job that only drains: nothing emitted
        report = job.close(30)
        assert report.complete, report
        assert report.emitted == 300
        assert sorted(ns(sink)) == [*range(100), *range(1000, 1100), *range(2000, 2100)]  # once each
        assert job.stats().spill["owners_adopted"] == 3
    assert os.listdir(spill) == []


def test_owners_that_die_while_an_outbox_runs_are_adopted_at_its_close(tmp_path):
    spill = tmp_path / "spill"
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        assert box.emit(run_event(n=5000))
        dead_owner(spill, 0, 50)  # gone after this outbox started: found by its close
        dead_owner(spill, 100, 50)
        report = box.close(20)
        assert report.complete, report
        assert sorted(ns(sink)) == [*range(50), *range(100, 150), 5000]
    assert os.listdir(spill) == []


def test_a_close_that_runs_out_of_time_names_what_it_leaves(tmp_path):
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 40)
    box = Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(spill), shutdown_timeout=1)
    assert box.emit(run_event(n=100))
    report = box.close()
    assert not report.complete
    # Its own event and the 40 adopted ones are all this outbox's to count: on disk, handed on.
    assert report.undelivered == {"spilled_at_close": 41}, report
    assert report.emitted == 41
    for owner in owner_dirs(spill):  # (its worker lets go of its directory after the report)
        let_go(owner)
    with Sink() as sink:
        assert Outbox(HttpTransport(sink.url), spill_dir=str(spill)).close(20).complete
        assert sorted(ns(sink)) == [*range(40), 100]


def handmade_owners(spill: Path, count: int) -> None:
    """``count`` dead owners, each one event (``n`` its index) in a segment of its own, made
    byte by byte (thousands of outboxes would take minutes)."""
    from outbox._run._serde import serialize

    spill.mkdir(exist_ok=True)
    for n in range(count):
        owner = spill / f"{time.time_ns() - 10**12 + n:016x}-{n:x}-{n:08x}"
        owner.mkdir()
        (owner / "lock").write_bytes(LOCK_TEXT)
        (owner / "locks-directory").write_bytes(b"")
        event = serialize(run_event(run_id=f"00000000-0000-4000-8000-{n:012d}", n=n))
        (owner / "00000001.seg").write_bytes(file_header(owner.name) + encode_event(0, time.time(), event))


#: A child that runs with at most ``limit`` file descriptors: a drain-and-exit job, then (with
#: ``spare`` >= 0) a close of an outbox that has every descriptor but ``spare`` taken when owners die.
_SMALL_LIMIT_CHILD = """
import json, os, resource, sys, time
from outbox import Outbox
from outbox.transports import HttpTransport
url, spill, limit, spare = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
if spare < 0:
    report = Outbox.from_env({"OPENLINEAGE_URL": url, "OUTBOX_SPILL_DIR": spill}).close(60)
else:
    box = Outbox(HttpTransport(url), spill_dir=spill)
    os.rename(spill + "-later", spill + "/later")  # (owners that die while it runs, moved in)
    for name in os.listdir(spill + "/later"):
        os.rename(spill + "/later/" + name, spill + "/" + name)
    os.rmdir(spill + "/later")
    taken = []
    try:
        while True:
            taken.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for _ in range(spare):
        os.close(taken.pop())
    report = box.close(5)
    for fd in taken:
        os.close(fd)
print(json.dumps({"complete": report.complete, "emitted": report.emitted, "left": dict(report.spill_left)}))
"""


def _small_limit_child(url: str, spill: Path, limit: int, spare: int = -1) -> dict:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _SMALL_LIMIT_CHILD, url, str(spill), str(limit), str(spare)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_thousands_of_dead_owners_are_all_adopted_by_a_process_allowed_few_descriptors(tmp_path):
    """helper-38: 4,000 dead owners, a 1,024 descriptor limit.  The scan held every dead owner's
    lock at once; past the limit an owner it could not open looked alive: 2,027 of 4,000
    delivered and the close said complete.  Owners are taken one at a time now."""
    spill = tmp_path / "spill"
    handmade_owners(spill, 1500)
    with Sink() as sink:
        answer = _small_limit_child(sink.url, spill, 256)
        assert answer["complete"], answer
        assert sorted(ns(sink)) == list(range(1500))
    assert os.listdir(spill) == []


@pytest.mark.parametrize("spare", [0, 1])
def test_a_close_that_could_not_look_at_dead_owners_does_not_say_complete(tmp_path, spare):
    """Owners die while an outbox runs; at its close the process has no descriptor to spare
    (the application's own files): the owners it could not look at (or the directory, if it
    could not list it) are named, not taken for alive, and a later outbox delivers them."""
    spill = tmp_path / "spill"
    handmade_owners(tmp_path / "spill-later", 3)
    with Sink() as sink:
        answer = _small_limit_child(sink.url, spill, 256, spare)
        assert not answer["complete"], answer
        assert answer["left"] == {"events": 0, "owners": 3 if spare else 1}, answer
        assert ns(sink) == []
        assert Outbox(HttpTransport(sink.url), spill_dir=str(spill)).close(20).complete
        assert sorted(ns(sink)) == [0, 1, 2]


def test_two_live_owners_never_adopt_each_other(tmp_path):
    spill = tmp_path / "spill"
    down = refused_url()
    first = Outbox(HttpTransport(down, timeout=0.5), spill_dir=str(spill), shutdown_timeout=1)
    second = Outbox(HttpTransport(down, timeout=0.5), spill_dir=str(spill), shutdown_timeout=1)
    for n in range(20):
        assert first.emit(run_event(n=n))
        assert second.emit(run_event(n=100 + n))
    for box in (first, second):
        parts.spill(box).begin_close()  # a scan at the next tick  # type: ignore[union-attr]
        assert wait_until(lambda box=box: not parts.spill(box).has_pending())  # type: ignore[union-attr]
    assert first.stats().spill["owners_adopted"] == second.stats().spill["owners_adopted"] == 0
    assert inspect_dir(spill)["owners_alive"] == 2
    assert first.close().undelivered == {"spilled_at_close": 20}
    # Once the first is gone, the second's close adopts it (and hands both on).
    assert second.close().undelivered == {"spilled_at_close": 40}
    assert second.stats().spill["owners_adopted"] == 1


# -- a hand-over that survives a crash at any point -------------------------------------------


def test_an_owner_that_died_while_adopting_hands_on_what_it_had_not_settled(tmp_path):
    """A child adopts a dead owner's 200 events (its directory moved into the child's), delivers
    some, then the backend fails and the child is killed.  The next outbox adopts the child,
    and with it what the child had adopted: it delivers the rest, and nothing the child had
    settled (each event once)."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 200)
    behaviour = SinkBehaviour(fail_status=503)  # (nothing delivered until the adoption is seen)
    with Sink(behaviour=behaviour) as sink:
        child = start_child(
            {
                "url": sink.url,
                "dir": str(spill),
                "mode": "stream",
                "pause": 0.05,
                "first": 10_000,
                "max_batch_events": 10,  # (with accept_most: some adopted are left undelivered)
            }
        )
        read_line(child, "")

        def nested() -> list[Path]:
            return [path for path in spill.rglob("*") if path.is_dir() and path.parent.parent == spill]

        # (Looked at while nothing can be delivered: once all 200 are, the child deletes the
        # adopted files and their directory, which a busy machine let it do before this look.)
        assert wait_until(nested, 30), "the dead owner's directory was moved into the child's"
        behaviour.fail_status, behaviour.accept_most = None, 30  # then nothing more is delivered
        assert sink.wait_for(30, 20)
        time.sleep(0.5)  # (the child's settlements of what was delivered are written each 0.1 s)
        delivered = set(ns(sink))  # (after any request the sink was in the middle of)
        # Both sides of the hand-over are tried: settled by the child, and left to its successor.
        assert 0 < len(delivered & set(range(200))) < 200, sorted(delivered)
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
        behaviour.accept_most = None
        sink.clear()
        successor = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        assert successor.close(30).complete
        again = ns(sink)
    adopted_rest = sorted(n for n in again if n < 200)
    assert adopted_rest == sorted(set(range(200)) - delivered)  # the rest, once each
    assert len(again) == len(set(again))
    assert os.listdir(spill) == []


# -- damage is counted, never fatal ---------------------------------------------------------


def test_damaged_and_foreign_files_are_counted_never_fatal_and_foreign_ones_left_alone(tmp_path, caplog):
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 60)
    (home,) = owner_dirs(spill)
    (segment,) = sorted(home.glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a record in the middle: its checksum fails
    segment.write_bytes(bytes(data[:-9]))  # and the last one cut short
    # A record whose checksum is sound but whose body is not JSON, in a segment of its own.
    bad = SerializedEvent(b"{not json", RUNS[0], None)
    (home / "00000002.seg").write_bytes(file_header(home.name) + encode_event(10_000, 0.0, bad))
    (home / "00000003.seg").mkdir()  # named like a segment, no file: foreign (one unreadable: below)
    (home / "notes.txt").write_text("an operator's")  # not a segment: never read, never touched
    (spill / "other.lock").write_text("not ours")
    (spill / "someone-else").mkdir()
    (spill / "someone-else" / "lock").write_text("not ours either")
    caplog.set_level(logging.WARNING, logger="outbox")
    # (The sink answers 500 to any request carrying the bad body: sent, it would show.)
    with Sink(behaviour=SinkBehaviour(poison="{not json")) as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))  # starts all the same
        report = box.close(20)
        stats = box.stats().spill
        delivered = ns(sink)
    assert len(delivered) == len(set(delivered))
    assert 50 <= len(delivered) < 60  # the damaged and the torn one are not there
    assert set(delivered) <= set(range(60))
    assert stats["corrupt_records"] >= 1, stats
    assert stats["torn_records"] == 1, stats
    assert stats["foreign_files"] == 1, stats
    assert stats["unreadable_files"] == 0, stats
    assert stats["invalid_bodies"] == 1, stats
    assert report.undelivered == {"invalid_event": 1}, report  # the body: never sent
    # Left alone: what is not ours, and what could not be read (the next outbox tries again).
    assert (spill / "other.lock").read_text() == "not ours"
    assert (spill / "someone-else" / "lock").read_text() == "not ours either"
    assert (home.parent / parts.spill(box).home.owner / home.name / "notes.txt").exists()  # type: ignore[union-attr]


def test_a_segment_this_process_may_not_read_is_counted_and_the_outbox_starts(tmp_path):
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 30)
    (home,) = owner_dirs(spill)
    (segment,) = home.glob("*.seg")
    segment.chmod(0o000)
    with Sink() as sink:
        # A child that gives up root's right to read any file (drop_dac): EACCES, as any user.
        child = start_child(
            {"url": sink.url, "dir": str(spill), "mode": "batch", "count": 5, "drop_dac": True, "flush": True}
        )
        read_line(child, "spilled ")
        tell(child)
        stats = json.loads(read_line(child, "stats "))
        child.communicate(timeout=15)
        assert sorted(ns(sink)) == list(range(5))
    assert stats["spill"]["unreadable_files"] == 1, stats
    assert stats["dropped"] == {}, stats
    (moved,) = [path for path in spill.rglob("*.seg") if path.name == segment.name and path != segment]
    moved.chmod(0o644)  # (taken over by the child, with the directory it was in)
    assert len(waiting(spill)) == 30  # still there, for an outbox that can read it


# -- a directory removed under a running outbox ---------------------------------------------


def _removed_under(tmp_path: Path, again: bool, caplog) -> None:
    spill = tmp_path / "spill"
    behaviour = SinkBehaviour(fail_status=503)
    caplog.set_level(logging.WARNING, logger="outbox")
    with Sink(behaviour=behaviour) as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), max_events=200, backoff_cap=0.2)
        for n in range(300):  # beyond the window: a stretch on disk only
            assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
            if n % 50 == 49:
                wait_until(lambda: box.stats().spill["overflow_events"] == 0, 2)
        assert wait_until(lambda: box.stats().spill["stretch_events"] > 0), box.stats().spill
        shutil.rmtree(spill)
        if again:
            spill.mkdir()
        for n in range(300, 320):
            assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: box.stats().dropped.get("spill_lost", 0) > 0), box.stats()
        lost = box.stats().dropped["spill_lost"]
        behaviour.fail_status = None
        report = box.close(20)
        delivered = set(ns(sink))
    assert report.undelivered == {"spill_lost": lost}, report
    assert len(delivered) + lost == 320
    warnings = [r for r in caplog.records if "removed under it" in r.getMessage()]
    assert len(warnings) == 1
    assert os.listdir(spill) == []  # all settled: nothing handed on that was not counted


def test_a_directory_removed_under_a_running_outbox_is_noticed_warned_about_once_and_counted(
    tmp_path, caplog
):
    _removed_under(tmp_path, again=False, caplog=caplog)


def test_a_directory_removed_and_made_again_is_noticed_too(tmp_path, caplog):
    _removed_under(tmp_path, again=True, caplog=caplog)


def test_a_directory_removed_while_nothing_more_is_written_is_noticed_at_the_close(tmp_path):
    """No write after the removal to notice it: the close does, and hands on exactly what is on
    disk (the events in flight at the removal, retried, are not written again: counted lost)."""
    spill = tmp_path / "spill"
    box = Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(spill), shutdown_timeout=1)
    for n in range(50):
        assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
    assert wait_until(lambda: box.stats().spill["written"] == 50)
    shutil.rmtree(spill)
    report = box.close()
    handed = report.undelivered.get("spilled_at_close", 0)
    assert (
        handed + report.undelivered.get("spill_lost", 0) + report.undelivered.get("dropped_shutdown", 0) == 50
    )
    with Sink() as sink:
        assert Outbox(HttpTransport(sink.url), spill_dir=str(spill)).close(20).complete
        assert len(ns(sink)) == handed, report


# -- order across adoption ---------------------------------------------------------------------


def test_a_successor_smaller_than_what_it_adopts_delivers_it_before_its_own_newer_events(tmp_path):
    spill = tmp_path / "spill"
    pad = "x" * 400
    box = Outbox(
        HttpTransport(refused_url(), timeout=0.5), spill_dir=str(spill), shutdown_timeout=1, max_events=5000
    )
    for n in range(3000):
        event = run_event(run_id=RUNS[n % 4], n=n)
        event["job"]["facets"] = {"pad": {"_producer": "p", "_schemaURL": "s", "v": pad}}
        assert box.emit(event)
    assert wait_until(lambda: box.stats().spill["written"] == 3000), box.stats().spill  # (then its 1 s close)
    assert box.close().undelivered == {"spilled_at_close": 3000}
    with Sink() as sink:
        successor = Outbox(
            HttpTransport(sink.url),
            spill_dir=str(spill),
            max_events=200,
            max_spill_bytes=32 * 1024,  # far less than the 2 MB it adopts: read in place
            policy="drop_newest",  # (drop_oldest would evict adopted events for new ones, counted)
        )
        accepted = []
        for n in range(3000, 3400):  # newer events of the same runs, as the adopted ones go
            if successor.emit(run_event(run_id=RUNS[n % 4], n=n)):
                accepted.append(n)
            if n % 20 == 0:
                time.sleep(0.01)
        report = successor.close(30)
        events = sink.events
    # Memory and the small disk may refuse some of the new ones (counted), never reorder.
    assert set(report.undelivered) <= {"dropped_full", "dropped_spill_full"}, report
    assert report.lost == 400 - len(accepted), report
    last: dict[str, int] = {}
    for event in events:
        run, n = event["run"]["runId"], event["n"]
        assert n > last.get(run, -1), f"run {run}: {n} after {last[run]}"
        last[run] = n
    assert sorted(event["n"] for event in events) == [*range(3000), *accepted]
    assert len(accepted) > 100


def test_records_read_back_are_what_was_written(tmp_path):
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 5)
    bodies = [orjson.loads(event.body)["n"] for _, _, event in waiting(spill)]
    assert bodies == list(range(5))


def test_what_the_window_has_room_for_at_start_is_read_once(tmp_path, monkeypatch):
    """The first dead owner's events fit the window: kept as the replay reads them, its files
    are not read again.  The second's are read again, in place: the same events either way."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 300)
    dead_owner(spill, 300, 200)
    first, second = owner_dirs(spill)
    opened: list[str] = []
    real_open = SegmentReader.open

    def counted_open(self: SegmentReader) -> str:
        opened.append(self.path)
        return real_open(self)

    monkeypatch.setattr(SegmentReader, "open", counted_open)
    with Sink() as sink:
        assert Outbox(HttpTransport(sink.url), spill_dir=str(spill)).close(20).complete
        assert sorted(ns(sink)) == list(range(500))
    opens = [path.split(os.sep)[-2] for path in opened]
    assert opens.count(first.name) == 1, opens
    assert opens.count(second.name) == 2, opens


def test_owners_that_died_with_no_files_leave_no_directories_behind(tmp_path):
    """Dead owners that held nothing but their lock (one died before writing, one adopted by it
    and emptied): adopted, then the clean close of a drained directory left them, one inside the
    other, and the adopter's own directory around them, for good (its close pruned only the
    directories its deleted files had emptied, and these had none).  Now they go once adopted."""
    spill = tmp_path / "spill"
    alone, adopter = spill / "18eede7303f8dae8-5920-b9183112", spill / "18eede72c6bdf34b-58f7-056adfae"
    for owner in (alone, adopter, adopter / "18eede71c6bdf34b-58f7-056adfae"):
        owner.mkdir(parents=True)
        (owner / "lock").write_bytes(LOCK_TEXT)
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        assert box.stats().spill["owners_adopted"] == 2, box.stats().spill
        assert not [path for path in spill.glob("*/*") if path.is_dir()]  # (gone once adopted)
        assert box.emit(run_event(run_id=RUNS[0], n=1))
        assert box.close(10).complete
    assert list(spill.iterdir()) == [], list(spill.rglob("*"))


def test_a_directory_a_process_died_making_goes_and_one_being_made_stays(tmp_path):
    """An owner's directory is made as ``.tmp-ID`` with its lock taken, then renamed: a process
    killed in between left it (with its lock, or a link to a dead owner's lock: a directory made
    on a full disk) for good, as nothing but ``outbox check``'s listing ever looked at it.  The
    next look for dead owners removes one whose lock no one holds, and only such a one."""
    spill = tmp_path / "spill"
    died, alive = spill / ".tmp-18eede7303f8dae8-5920-b9183112", spill / ".tmp-18eede7303f8dae9-5920-b9183113"
    for made in (died, alive):
        made.mkdir(parents=True)
        (made / "lock").write_bytes(LOCK_TEXT)
    begun = spill / f".tmp-{time.time_ns():016x}-1-0badc0de"  # (its lock made, not yet written)
    begun.mkdir()
    (begun / "lock").touch()
    held = os.open(alive / "lock", os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # (as the process making it holds it)
        box = Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(spill), shutdown_timeout=0.5)
        box.close()
        assert not died.exists()
        assert (alive / "lock").read_bytes() == LOCK_TEXT
        assert begun.exists()  # (younger than STALE_AFTER: being made)
    finally:
        os.close(held)
