"""A successor on a disk too full to make its directory takes over a dead owner's
(``Home._take_over``), and adopted owners are pruned (``prune_all``): attacked as a hostile
operator would, each test one fault found in the first design (a dead owner's lock borrowed by
a hard link in a new directory), the smallest reproduction of it, with real outboxes on real
filesystems (a tmpfs, and an ext4 image on a loop device, as root)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_spill_log import RUNS, dead_owner, ns, owner_dirs, refused_url
from test_spill_takeover import as_nobody

from outbox import Outbox
from outbox._spill._disk import Disk
from outbox._spill._owners import LOCK_TEXT, Home
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport

from support.disk import fill, free
from support.helpers import run_event, wait_until


@pytest.fixture
def ext4() -> Iterator[Path]:
    """An 8 MiB ext4 filesystem (4 KiB blocks, none reserved for root) on a loop device: a disk
    that fills as most servers' do, where a new directory needs a block of its own."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        why = "an ext4 image needs root and mkfs.ext4 (e2fsprogs)"
        if os.geteuid() == 0 or os.environ.get("CI") == "true":
            pytest.fail(why)  # (as root, as CI runs, the take-over on ext4 must be proven)
        pytest.skip(why)
    work = Path(tempfile.mkdtemp(prefix="ext4-disk-"))
    image, path = work / "image", work / "mnt"
    path.mkdir()
    try:
        with open(image, "wb") as file:
            file.truncate(8 * 1024 * 1024)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", str(image)], check=True)
        done = subprocess.run(["mount", "-o", "loop", str(image), str(path)], capture_output=True, text=True)
        if done.returncode:
            pytest.fail(f"cannot mount an ext4 image as root: {done.stderr.strip()}")
        try:
            yield path
        finally:
            subprocess.run(["umount", "-l", str(path)], check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_on_an_ext4_disk_full_of_a_dead_owners_files_its_successor_adopts_it(ext4):
    """A dead owner with 100 events and no reserve left, the disk full, on ext4 (8 MiB, nothing
    reserved for root): a new directory needs a block there, so the first design (a ``.tmp-``
    directory holding a link to the dead owner's lock) failed ENOSPC before its link, and the
    successor, in memory, could not adopt: the events stayed on the full disk.  Taking the dead
    owner's directory over by a rename (and an empty mark in it) needs no block: the successor
    adopts, and the next one delivers all 100."""
    spill = ext4 / "spill"
    dead_owner(spill, 0, 100)
    (dead,) = owner_dirs(spill)
    (dead / "reserve").unlink()
    fill(ext4)
    box = Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(spill), shutdown_timeout=0.5)
    try:
        assert box.stats().spill["owners_adopted"] == 1, box.stats().spill
    finally:
        box.close()
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        report = box.close(20)
        assert report.complete, report
        assert sorted(set(ns(sink))) == list(range(100))


def test_a_dead_owners_lock_this_user_may_not_link_does_not_keep_the_application_from_starting(tmpfs):
    """A spill directory shared by two services running as different users (mode 0777), the
    disk full, and a dead owner of the other user's with no reserve left.  The first design
    hard-linked the dead owner's lock, which the kernel refuses for another user's file this one
    may not write (``fs.protected_hardlinks=1``): EPERM, taken for a directory that is not
    usable, and ``Outbox()`` raised ``ConfigError``.  Whatever a take-over meets now, the outbox
    starts (in memory, if it must).  (The user here is nobody, in a forked child.)"""
    if os.geteuid() != 0:
        pytest.skip("needs root, to be another user")
    spill = tmpfs / "spill"
    dead_owner(spill, 0, 20)
    (dead,) = owner_dirs(spill)
    (dead / "reserve").unlink()
    for path in (spill, dead):  # (writable by both services)
        path.chmod(0o777)
    fill(tmpfs)
    said = as_nobody(spill, refused_url())
    assert said.startswith("{"), said  # (its spill's stats: it started)


def test_pruning_an_adopted_owner_leaves_files_that_are_not_ours_alone(tmp_path):
    """A dead owner that held nothing of ours but its lock, and a directory of someone else's
    (``operator``, holding their ``lock`` and ``reserve`` files: any names).  Adopted, it is
    pruned at once with ``prune_all``, which walks every directory under it, ours or not, and
    deletes every file named ``lock`` or ``reserve`` there before trying ``rmdir``: the other
    files' owner loses both (and the directory, when those were all it held).  The manual:
    "Only what is ours is touched: an owner's directory (its name and its lock's first line), a
    segment (its header).  Anything else in spill_dir is left alone."  (Before 75c55e1 only
    directories that deleted segments had emptied were pruned.)"""
    spill = tmp_path / "spill"
    dead = spill / "18eede7303f8dae8-5920-b9183112"
    theirs = dead / "operator"
    theirs.mkdir(parents=True)
    (dead / "lock").write_bytes(LOCK_TEXT)
    (theirs / "lock").write_bytes(b"someone else's lock\n")
    (theirs / "reserve").write_bytes(b"someone else's reserve\n")
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        assert box.stats().spill["owners_adopted"] == 1, box.stats().spill
        assert box.close(10).complete
    left = {path.name: path.read_bytes() for path in spill.rglob("*") if path.parent.name == "operator"}
    assert left == {"lock": b"someone else's lock\n", "reserve": b"someone else's reserve\n"}, left


def test_a_borrowed_lock_removed_under_its_outbox_is_noticed(tmpfs):
    """An outbox whose own lock is removed under it notices (``Home.vanished``: the lock's fd has
    no link left), and writes its events in a new directory.  The first design's lock had a
    second name (the adopted dead owner's ``lock``), so removing it went unnoticed, and events
    were written to a directory no successor takes for an owner.  A directory taken over keeps
    one lock: the removal is noticed, and the old directory is not left behind."""
    spill = tmpfs / "spill"
    dead_owner(spill, 0, 100)
    (dead,) = owner_dirs(spill)
    (dead / "reserve").unlink()
    fill(tmpfs)
    down = HttpTransport(refused_url(), timeout=0.5)
    box = Outbox(down, spill_dir=str(spill), shutdown_timeout=0.5, spill_interval=0.05)
    try:
        assert box.stats().spill["owners_adopted"] == 1, box.stats().spill
        free(tmpfs)
        (mine,) = owner_dirs(spill)
        (mine / "lock").unlink()
        for n in range(1000, 1010):
            assert box.emit(run_event(run_id=RUNS[0], n=n))
        assert wait_until(lambda: box.stats().spill["written"] >= 10, 20), box.stats().spill
        unlocked = [path.name for path in owner_dirs(spill) if not (path / "lock").exists()]
        assert not unlocked, f"events written to {unlocked}, a directory no successor adopts"
    finally:
        box.close()


def test_stats_read_as_the_directory_is_made_again_never_go_back(tmpfs, monkeypatch):
    """An outbox started in memory on a full disk counts ``failed_enospc``; once the disk has
    room it makes its directory, and ``Spill._begin`` carries the counts on to the new ``Disk``
    (9b87831: "counters never go back").  But it assigns ``self.disk`` first and carries the
    counts after, and ``Outbox.stats()`` (and the OpenTelemetry observer) reads the spill's
    counts without the buffer's lock, from any thread: a read between the two statements (a
    thread switch there, the GIL's to give) sees every counter at zero, after having seen it at
    one, under a user alerting on it (an OpenTelemetry counter that goes back is a reset).  The
    instant is made observable here by reading ``stats()`` as ``carry_counts`` is entered."""
    spill = tmpfs / "spill"
    fill(tmpfs)
    seen: list[dict[str, float]] = []
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), spill_interval=0.05)
        try:
            assert box.stats().spill["failed_enospc"] == 1
            carry = Disk.carry_counts

            def observed(disk: Disk, before: Disk) -> None:
                seen.append(box.stats().spill)  # (what any thread reading now sees)
                carry(disk, before)

            monkeypatch.setattr(Disk, "carry_counts", observed)
            free(tmpfs)
            assert wait_until(lambda: seen, 20), "the directory was not made again"
        finally:
            assert box.close(10).complete
    assert seen[0].get("failed_enospc", 0) >= 1, seen[0]


@pytest.mark.parametrize("killed", ["before the rename", "after the rename"])
def test_a_crash_while_taking_over_a_directory_loses_nothing_and_leaves_no_litter(tmpfs, killed):
    """A successor on a full disk takes over the oldest dead owner's directory: it marks it
    (``was-ID``, an empty file), then renames it to its own name.  Killed before or after the
    rename, the files are with one owner, adoptable: the next outbox delivers every event and
    leaves the drained directory empty.  (The first design made a ``.tmp-`` directory with a
    second name of the dead owner's lock, and a crash before its rename left it for good.)"""
    spill = tmpfs / "spill"
    dead_owner(spill, 0, 50)
    (dead,) = owner_dirs(spill)
    (dead / "reserve").unlink()
    fill(tmpfs)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child, killed as it takes the dead owner's directory over)
        try:
            real = os.rename

            def rename(source: str, target: str) -> None:
                if os.path.basename(source) == dead.name and killed == "before the rename":
                    os.kill(os.getpid(), signal.SIGKILL)
                real(source, target)
                if os.path.basename(source) == dead.name:
                    os.kill(os.getpid(), signal.SIGKILL)

            os.rename = rename  # type: ignore[assignment]
            Home(str(spill))
        finally:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == signal.SIGKILL
    (left,) = owner_dirs(spill)
    assert (left.name == dead.name) == (killed == "before the rename")
    assert (left / f"was-{dead.name}").exists()
    free(tmpfs)
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        assert box.close(20).complete
        assert sorted(set(ns(sink))) == list(range(50))
    assert os.listdir(spill) == [], sorted(str(path.relative_to(spill)) for path in spill.rglob("*"))


def test_a_lock_that_is_a_fifo_does_not_hang_the_outbox_or_outbox_check(tmp_path):
    """A directory named like an owner whose ``lock`` is a FIFO (anyone's: not ours, and
    "anything else in spill_dir is left alone").  ``_probe`` opens each owner's lock with a
    blocking ``open(O_RDONLY)``, which on a FIFO waits for a writer: ``Outbox()`` (its adoption
    at start, and each borrow's ``dead_owners``) and ``outbox check`` (``inspect_dir``) never
    return.  The application cannot start, and the tool meant to diagnose it hangs too."""
    spill = tmp_path / "spill"
    fifo = spill / "18eede7303f8dae8-5920-b9183112" / "lock"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    made: list[Outbox] = []

    def start() -> None:
        down = HttpTransport(refused_url(), timeout=0.5)
        made.append(Outbox(down, spill_dir=str(spill), shutdown_timeout=0.5))

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    try:
        assert wait_until(lambda: not starting.is_alive(), 10), "Outbox() hangs on a FIFO named lock"
    finally:
        done = threading.Event()

        def poke() -> None:  # (let every blocked open go: a writer that comes and goes)
            while not done.wait(0.05):
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

        poker = threading.Thread(target=poke, daemon=True)
        poker.start()
        starting.join()
        for box in made:
            box.close()
        done.set()
        poker.join()
