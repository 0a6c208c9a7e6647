"""The take-over of a dead owner's directory on a full disk (``Home._take_over``, 7f461b2)
attacked as a hostile operator would: each test one fault, the smallest reproduction of it,
with real outboxes on a real filesystem (a tmpfs, as root)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from test_spill_log import RUNS, dead_owner, ns, owner_dirs, refused_url

from outbox import Outbox
from outbox._spill._owners import inspect_dir
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport

from support.disk import fill, free
from support.helpers import run_event, wait_until


def _tree(spill: Path) -> list[str]:
    return sorted(str(path.relative_to(spill)) for path in spill.rglob("*"))


def _taken_over(spill: Path, disk: Path, first: int, count: int) -> Path:
    """A dead owner's directory (its reserve spent) taken over by an outbox started on the full
    disk, which then gets room, writes ``count`` events of its own from ``first`` and closes
    with the backend down: its directory, holding both owners' segments."""
    (dead,) = owner_dirs(spill)
    (dead / "reserve").unlink()
    fill(disk)
    down = HttpTransport(refused_url(), timeout=0.5)
    box = Outbox(down, spill_dir=str(spill), shutdown_timeout=0.5, spill_interval=0.05)
    try:
        assert box.stats().spill["owners_adopted"] == 1, box.stats().spill
        free(disk)
        for n in range(first, first + count):
            assert box.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: box.stats().spill["written"] >= count, 20), box.stats().spill
    finally:
        box.close()
    (taker,) = owner_dirs(spill)
    assert (taker / f"was-{dead.name}").exists(), _tree(spill)
    return taker


def as_nobody(spill: Path, url: str) -> str:
    """An outbox started with ``spill`` and closed (``close(10)``) as the user nobody, in a
    forked child: what it said (its spill's stats at start, or the error)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        said = b"?"
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                box = Outbox(HttpTransport(url, timeout=0.5), spill_dir=str(spill), shutdown_timeout=0.5)
                stats = box.stats().spill
                box.close(10)
                said = repr(stats).encode()
            except Exception as exc:
                said = repr(exc).encode()
        finally:
            os.write(write, said)
            os._exit(0)
    os.close(write)
    try:
        said = b""
        while chunk := os.read(read, 65536):
            said += chunk
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return said.decode()


def test_a_taken_over_segment_unreadable_for_a_while_is_delivered_once_readable(tmpfs):
    """Owner A died (20 events, no reserve); on the full disk, T took A's directory over (its
    segment ``00000001.seg``, marked ``was-A``), wrote 20 events of its own in ``00000002.seg``
    and closed with the backend down.  The service that adopts T next (Q, running as another
    user) cannot read A's segment (``0600``, root's): "a file that cannot be opened or read
    (permissions ...) is left where it was, for an outbox that can".  Q delivers T's 20 events
    and deletes their segment, and ``prune`` then removes, in T's directory under Q's, the lock
    and every ``was-`` mark before trying ``rmdir`` (which fails: A's segment is there).  The
    outbox that can read it (root, R) adopts Q and finds a segment whose header names A in a
    directory named T with no ``was-A`` mark: "a copy, or forged", counted ``foreign_files``.
    A's 20 events are never delivered and never counted lost (R's close says complete), and the
    directories stay for good (R's own, its lock pruned, around them).  Before the take-over
    an unreadable segment stayed in the directory its header names, read when it could be."""
    spill = tmpfs / "spill"
    dead_owner(spill, 0, 20)
    taker = _taken_over(spill, tmpfs, 20, 20)
    for path in [spill, *spill.rglob("*")]:  # (a directory shared with the service's user)
        path.chmod(0o777 if path.is_dir() else 0o666)
    (taker / "00000001.seg").chmod(0o600)  # (A's: root's, the service cannot read it)
    with Sink() as sink:
        said = as_nobody(spill, sink.url)
        assert "'unreadable_files': 1" in said, said
        assert sorted(ns(sink)) == list(range(20, 40)), said
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        report = box.close(20)
        stats = box.stats().spill
        got = sorted(ns(sink))
    assert got == list(range(40)), (report, stats, _tree(spill))


def test_a_segment_a_process_died_making_does_not_stay_for_good(tmp_path):
    """An owner killed between the ``open(O_CREAT)`` of a new segment and the write of its header
    (``Disk._segment``: two system calls, a SIGKILL may fall between them) leaves an empty
    ``NNNNNNNN.seg``.  Its successor adopts the directory and counts the empty file
    ``foreign_files`` (no header: "not ours", never deleted); ``prune`` then deletes the adopted
    directory's lock, and its ``rmdir`` fails.  What is left never goes: a directory named like an
    owner, with no lock, that no later outbox adopts or prunes (the second one here leaves it
    too), and that ``outbox check`` counts as an owner *alive* for ever.  The file is the
    library's own, made by a crash at a point the spill promises to survive."""
    spill = tmp_path / "spill"
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child, killed as it begins its first segment)
        try:
            real = os.open

            def opened(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
                fd = real(path, flags, *args, **kwargs)
                if str(path).endswith(".seg") and flags & os.O_CREAT:
                    os.kill(os.getpid(), signal.SIGKILL)
                return fd

            os.open = opened  # type: ignore[assignment]
            box = Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(spill))
            box.emit(run_event(run_id=RUNS[0], n=0))
            box.flush(30)
        finally:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == signal.SIGKILL
    (dead,) = owner_dirs(spill)
    assert [path.stat().st_size for path in dead.glob("*.seg")] == [0], _tree(spill)
    for _ in range(2):
        with Sink() as sink:
            box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
            assert box.close(10).complete
    check = inspect_dir(spill)
    assert (check["owners_alive"], check["owners_gone"]) == (0, 0), check
    assert os.listdir(spill) == [], _tree(spill)


def test_a_directory_a_process_died_making_before_its_lock_was_written_goes(tmp_path, monkeypatch):
    """``Home._make`` makes ``.tmp-ID``, then creates its lock, takes it and writes its first
    line; ``dead_owners`` removes a ``.tmp-`` directory only once that line is there (9f4a938:
    "one being made holds its lock, or has not written it yet").  A process killed between the
    ``mkdir`` and that write (three system calls) leaves a ``.tmp-`` directory no later outbox
    removes, nor ``outbox check`` shows (it skips names beginning with a dot): litter for good,
    on a disk that may be full.  (An owner id says when it was made: a ``.tmp-`` directory whose
    lock is unwritten long after is no longer being made.)"""
    spill = tmp_path / "spill"
    spill.mkdir()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child, killed as it makes its directory)
        try:
            real = os.mkdir

            def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
                real(path, *args, **kwargs)
                if os.path.basename(str(path)).startswith(".tmp-"):
                    os.kill(os.getpid(), signal.SIGKILL)

            os.mkdir = mkdir  # type: ignore[assignment]
            Outbox(HttpTransport(refused_url(), timeout=0.5), spill_dir=str(spill))
        finally:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == signal.SIGKILL
    (made,) = os.listdir(spill)
    assert made.startswith(".tmp-"), made
    monkeypatch.setattr("outbox._spill._owners.STALE_AFTER", 0.0)  # (as a minute later)
    for _ in range(2):
        with Sink() as sink:
            box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
            assert box.close(10).complete
    assert os.listdir(spill) == [], _tree(spill)


def test_a_second_take_over_begins_a_segment_of_its_own(tmpfs):
    """Owner A died leaving, beside its segment, a file that is not ours named ``99999999.seg``
    ("anything else in spill_dir is left alone").  T takes A's directory over on the full disk
    and numbers its segments after the largest name (``_last_number``): ``100000000.seg``,
    nine digits.  T dies the same way; U takes T's directory over, and ``_last_number`` reads
    only the first eight characters of each name: ``10000000`` for T's, ``99999999`` for the
    foreign one, so U's first segment is ``100000000.seg`` again, which ``Disk._segment`` opens
    with ``O_APPEND`` and no ``O_EXCL``: U's header and events are appended to T's file.  A reader
    takes U's header for a damaged record (``corrupt_records``, no disk damaged anything) and
    U's events for T's (the file's header names T); and U holds two ``SegFile`` for one path, so
    deleting "T's" once T's events are settled deletes U's live events with it."""
    spill = tmpfs / "spill"
    dead_owner(spill, 0, 20)
    (dead,) = owner_dirs(spill)
    (dead / "99999999.seg").write_bytes(b"not a segment of ours\n")
    _taken_over(spill, tmpfs, 20, 20)
    mine = _taken_over(spill, tmpfs, 40, 20)
    segments = sorted(path.name for path in mine.glob("*.seg"))
    free(tmpfs)
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill))
        assert box.close(20).complete
        stats = box.stats().spill
    assert len(segments) == 4, segments  # A's, the foreign one, T's and U's
    assert stats["corrupt_records"] == 0, stats
