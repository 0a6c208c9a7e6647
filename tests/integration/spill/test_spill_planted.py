"""What a user plants where the spill makes a file of its own (a mark, a lock file, a reserve):
a link, a FIFO, a directory, a hard link.  The spill never writes through it, never waits on
it, and never stalls behind it (helper-43).  Real outboxes, real files, a real ``outbox sink``."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from test_spill_handover import _adopted_by, _b_adopted_w, _scarce, down_box, drain
from test_spill_log import RUNS, dead_owner, ns, owner_dirs

from outbox import Outbox
from outbox._observability._log import RateLimitedLog
from outbox._run._serde import SerializedEvent
from outbox._spill._disk import Disk
from outbox._spill._owners import HANDED, LOCK_TEXT, Home
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport

from support.disk import fill

VICTIM = b"a file of someone else's\n"


def _plant(kind: str, where: Path, victim: Path) -> None:
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "symlink":
        where.symlink_to(victim)
    elif kind == "dangling symlink":
        where.symlink_to(victim.parent / f"made-through-{where.name}")
    elif kind == "hard link":
        os.link(victim, where)
    else:
        where.mkdir()


def _within(seconds: float, call: Callable[[], object], fifos: list[Path]) -> list[object]:
    """``call()``'s result in a list, or an empty list if it has not returned in ``seconds``;
    whatever waits on one of ``fifos`` is let go of then (a reader opens it)."""
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    if not thread.is_alive():
        return got
    for fifo in fifos:
        if fifo.exists() and stat.S_ISFIFO(fifo.lstat().st_mode):
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    thread.join(10)
    return []


@pytest.mark.parametrize("kind", ["fifo", "dangling symlink", "directory"])
def test_what_stands_where_a_mark_is_made_is_never_opened_through_waited_on_nor_a_stall(tmp_path, kind):
    """A mark was made by opening its name to write, creating, following a link: a FIFO there
    held the outbox's constructor for ever; a dangling link made a file where it pointed, and
    the owner (its "mark" no file) was read before the one handed on before it; a directory
    there left the owner, and every younger one behind it, at every look.  Keys now pass every
    name that looks like a mark, and a mark is opened without following a link or waiting."""
    spill, victim = tmp_path / "spill", tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    victim.write_bytes(VICTIM)
    dead_owner(spill, 0, 5)  # W: the first a fresh adopter keys
    dead_owner(tmp_path / "p", 5, 5)
    (p,) = list((tmp_path / "p").iterdir())
    planted = [p / f"{HANDED}{key:016x}" for key in range(3)]  # (P's key, whatever W gets)
    for where in planted:
        _plant(kind, where, victim)
    p.rename(spill / p.name)
    # S takes W, then P (at its start): their marks are what its successor reads.
    (s,) = _within(30, lambda: down_box(spill), planted)
    assert isinstance(s, Outbox)
    assert s.close(0).undelivered == {"spilled_at_close": 10}
    assert _within(60, lambda: drain(spill), planted) == [list(range(10))]
    assert sorted(path.name for path in victim.parent.iterdir()) == ["victim"]
    assert victim.read_bytes() == VICTIM


def test_a_forged_mark_at_the_largest_key_leaves_the_order_as_handed_on(tmp_path):
    """A dead owner with a forged mark ``handed-3fffffffffffffff`` (a valid one: 16 hex digits
    below 2**62) was keyed past it, at 2**62, which is no mark: read as unmarked, before the
    owner handed on before it (5-9, 0-4).  Keys that a forged one leaves no room for are taken
    from the adopter's floor instead."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 5)
    dead_owner(tmp_path / "p", 5, 5)
    (p,) = list((tmp_path / "p").iterdir())
    (p / f"{HANDED}{(1 << 62) - 1:016x}").touch()
    p.rename(spill / p.name)
    s = down_box(spill)
    _adopted_by(s)
    assert s.close(0).undelivered == {"spilled_at_close": 10}
    assert drain(spill) == list(range(10))


def _events(first: int, n: int) -> list[tuple[int, SerializedEvent]]:
    return [(i, SerializedEvent(b'{"n": %d}' % i, RUNS[0], None)) for i in range(first, first + n)]


@pytest.mark.parametrize("kind", ["symlink", "hard link", "fifo", "directory"])
def test_a_reserve_replaced_by_a_link_or_a_fifo_is_never_filled_cut_nor_waited_on(tmp_path, kind):
    """A live owner's reserve, removed and replaced by a link to a file elsewhere, was allocated
    through it (the file grown to 64 KiB of zeros; cut to nothing if the allocation failed);
    replaced by a FIFO, the sidecar's thread waited on it for ever; by a directory, it was
    never made again (helper-44).  A reserve is made only as
    a regular file of its own now: what stands at its name instead is removed (never written
    through), and the reserve made again."""
    victim, large = tmp_path / "victim", VICTIM * 4096  # (larger than a reserve: no size gives it away)
    victim.write_bytes(large)
    home = Home(str(tmp_path / "spill"))
    disk = Disk(home, 1024**2, RateLimitedLog(30))
    lock = threading.Lock()
    assert disk.reserve == disk.settle_room
    reserve = Path(home.path) / "reserve"
    reserve.unlink()  # an operator's rm, then what a user puts there
    _plant(kind, reserve, victim)

    def write_then_keep() -> int:
        wrote = disk.append(_events(0, 10), lock, lambda: None)  # (a write looks at the reserve)
        disk.make_room()  # (where it is made again)
        return wrote

    assert _within(20, write_then_keep, [reserve]) == [10]
    assert victim.read_bytes() == large
    assert disk.reserve == disk.settle_room
    assert stat.S_ISREG(reserve.lstat().st_mode)
    assert reserve.lstat().st_nlink == 1
    assert reserve.stat().st_size == disk.settle_room
    assert disk.append(_events(10, 10), lock, lambda: None) == 10  # (the owner goes on)


@pytest.mark.parametrize("kind", ["symlink", "hard link"])
def test_a_lock_file_made_again_never_cuts_what_stands_at_its_temporary_name(tmp_path, kind):
    """A live owner whose lock file is removed makes it again, under ``lock.new`` then renamed:
    that name was opened to write and cut (``O_TRUNC``), following a link: a file elsewhere
    emptied.  What stands there is removed (a name of the owner's, in its own directory) and a
    file made anew."""
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    home = Home(str(tmp_path / "spill"))
    lock = Path(home.path) / "lock"
    lock.unlink()
    _plant(kind, Path(home.path) / "lock.new", victim)
    assert not home.vanished()  # (what a write asks first: the lock file is made again)
    assert victim.read_bytes() == VICTIM
    assert lock.read_bytes() == LOCK_TEXT
    assert not lock.is_symlink()
    assert os.stat(lock).st_nlink == 1


def test_names_taken_both_at_the_largest_key_and_at_the_floor_are_passed(tmp_path):
    """helper-44: directories named like marks at 2**62-1 and at 0 in a dead owner: the large
    one made the keys start from the adopter's floor, and the mark was then made at 0, over
    the other (EISDIR): the owner, and every younger one, left at every start.  Keys skip
    every name something takes, wherever they start."""
    spill = tmp_path / "spill"
    dead_owner(spill, 0, 5)
    (p,) = owner_dirs(spill)
    for key in (0, 1, (1 << 62) - 1):
        (p / f"{HANDED}{key:016x}").mkdir()
    dead_owner(spill, 5, 5)
    assert drain(spill) == list(range(10))


def test_a_taken_over_owners_directory_that_cannot_be_listed_is_named(tmpfs, monkeypatch, caplog):
    """helper-44: on a full disk an outbox takes the oldest dead owner's directory over as its
    own; an owner nested there that this process may not list (EACCES) was never looked at
    again: its events neither read nor named, and the close complete.  It is named, as when
    adopted."""
    stage, spill = tmpfs / "stage", tmpfs / "spill"
    b_dir = _b_adopted_w(stage)  # B: W (0-4) nested, then its own 5-9
    (w,) = [path.name for path in b_dir.iterdir() if path.is_dir()]
    spill.mkdir()
    b_dir.rename(spill / b_dir.name)
    (spill / b_dir.name / "reserve").unlink()  # (none to free: the directory is taken over)
    fill(tmpfs)
    _scarce(monkeypatch, w, times=1_000, code=errno.EACCES)
    with Sink() as sink:
        box = Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False)
        report = box.close(20)
        assert box.stats().spill["owners_adopted"] == 1
        assert not report.complete
        assert report.spill_left == {"events": 0, "owners": 1}, report
        assert ns(sink) == list(range(5, 10))
    assert "cannot list" in caplog.text


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_what_stands_at_a_taken_over_owners_was_mark_never_stops_the_take_over(tmpfs, kind):
    """helper-44: on a full disk the oldest dead owner's directory is taken over, marked
    ``was-ID`` first; a link, a FIFO or a directory at that name (refused, never written
    through) refused the take-over at every start, and the outbox never had a directory while
    the disk stayed full.  It is a name of the dead owner's, whose lock is held: replaced."""
    spill, victim = tmpfs / "spill", tmpfs / "victim"
    victim.write_bytes(VICTIM)
    dead_owner(spill, 0, 5)
    (dead,) = owner_dirs(spill)
    (dead / "reserve").unlink()
    was = dead / f"was-{dead.name}"
    _plant(kind, was, victim)
    fill(tmpfs)
    with Sink() as sink:
        (box,) = _within(
            30, lambda: Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False), [was]
        )
        assert isinstance(box, Outbox)
        assert box.stats().spill["owners_adopted"] == 1
        report = box.close(20)
        assert report.complete, report
        assert ns(sink) == list(range(5))
    assert victim.read_bytes() == VICTIM


def test_a_reserve_is_never_removed_for_want_of_a_descriptor(tmp_path, monkeypatch):
    """helper-44: what stood at the reserve's name was removed on any failure to open it: out of
    descriptors (EMFILE), the owner deleted its own reserve.  Only what is not a file of its
    own is replaced."""
    home = Home(str(tmp_path / "spill"))
    disk = Disk(home, 1024**2, RateLimitedLog(30))
    reserve = Path(home.path) / "reserve"
    disk.reserve = 0  # (as when a look found it cut: made again at the next keep)
    real_open = os.open

    def scarce(path: object, *args: object, **kwargs: object) -> int:
        if os.fspath(path) == str(reserve):  # type: ignore[call-overload]
            raise OSError(errno.EMFILE, "Too many open files", str(reserve))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", scarce)
    disk.keep_reserve()
    monkeypatch.undo()
    assert reserve.stat().st_size == disk.settle_room
    disk.keep_reserve()
    assert disk.reserve == disk.settle_room
