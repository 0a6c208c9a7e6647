"""The order of hand-over: adopted owners are read in the order they were handed on, wherever they
were moved, and however many restarts an outage sees the backlog stays where a path can name it.
Real outboxes, real files, a real ``outbox sink``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from test_spill_log import RUNS, dead_owner, ns, refused_url

from outbox import Outbox
from outbox._spill._owners import HANDED
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport

from support import parts
from support.helpers import run_event, wait_until


def down_box(spill: Path) -> Outbox:
    return Outbox(HttpTransport(refused_url(), timeout=0.2), spill_dir=str(spill), close_at_exit=False)


def drain(spill: Path) -> list[int]:
    """What a successor with the backend up delivers, in the order it arrives."""
    with Sink() as sink:
        report = Outbox(HttpTransport(sink.url), spill_dir=str(spill), close_at_exit=False).close(30)
        assert report.complete, report
        delivered = ns(sink)
    assert not list(spill.rglob("*.seg"))
    return delivered


def test_restarts_during_one_outage_keep_the_backlog_one_level_deep_and_in_order(tmp_path):
    """helper-36: adoption renamed a dead owner's directory into the adopter's with the owners
    it had adopted inside it, so each restart during an outage nested the backlog one level
    deeper; past about 120 levels its path exceeded PATH_MAX, its files could not be listed, and
    a successor with the backend up delivered 129 of 140 events, counted none lost and closed
    complete.  Adopted owners are moved up beside their adopter now, read in the order handed on:
    one run's 140 events, one per generation, arrive in order."""
    spill = tmp_path / "spill"
    generations = 140
    for n in range(generations):
        box = down_box(spill)
        assert box.emit(run_event(run_id=RUNS[0], n=n))
        assert box.close(0).undelivered == {"spilled_at_close": n + 1}, n  # (all handed on)
    depth = max(len(path.relative_to(spill).parts) for path in spill.rglob("*.seg"))
    assert depth == 3  # (root/owner/adopted owner/segment)
    assert drain(spill) == list(range(generations))


def _adopted_by(box: Outbox) -> None:
    """``box`` looks for dead owners now, and has taken in what it found."""
    spill = parts.spill(box)
    assert spill is not None
    spill.begin_close()
    assert wait_until(lambda: not spill.has_pending())


def test_an_owner_adopted_by_a_longer_lived_one_is_read_first_after_both_are_moved(tmp_path):
    """helper-38, against the first flattening (26b6d71, reverted): X, started first, adopted Y
    (started later, died first) and sent Y's 0-9 on before its own 10-19 of the same run.  Once
    X died and A adopted it, siblings read by name (their start times) put X's 10-19 first.  The
    order they were handed on is recorded now, and kept wherever they move."""
    spill = tmp_path / "spill"
    x = down_box(spill)
    dead_owner(spill, 0, 10)  # Y: starts after X, dies first
    _adopted_by(x)
    for n in range(10, 20):
        assert x.emit(run_event(run_id=RUNS[n % 4], n=n))
    assert x.close(0).undelivered == {"spilled_at_close": 20}
    a = down_box(spill)  # adopts X, and Y beside it
    assert a.close(0).undelivered == {"spilled_at_close": 20}
    (home,) = [path for path in spill.iterdir() if path.is_dir()]
    assert len([path for path in home.iterdir() if path.is_dir()]) == 2  # X and Y, side by side
    assert drain(spill) == list(range(20))


def test_siblings_are_read_in_the_order_handed_on_not_the_order_they_started(tmp_path):
    """An adopter takes Y (started second) at one scan, then W (started first, died later) at
    the next, and dies: its successor reads Y's events before W's, as they were handed on (by
    name, W's came first)."""
    spill = tmp_path / "spill"
    w = down_box(tmp_path / "w")  # started first
    assert w.emit(run_event(run_id=RUNS[0], n=100))
    dead_owner(tmp_path / "y", 0, 10)  # started second, dead first
    adopter = down_box(spill)
    for owner in (tmp_path / "y").iterdir():
        owner.rename(spill / owner.name)
    _adopted_by(adopter)
    assert w.close(0).undelivered == {"spilled_at_close": 1}
    for owner in (tmp_path / "w").iterdir():
        owner.rename(spill / owner.name)
    _adopted_by(adopter)
    assert adopter.close(0).undelivered == {"spilled_at_close": 11}
    assert drain(spill) == [*range(10), 100]


def test_a_crash_between_two_moves_keeps_the_order(tmp_path):
    """An adopter that died between moving the owners nested in what it adopted: some are beside
    it, some still inside; its successor reads them in the same order either way."""
    spill = tmp_path / "spill"
    for generation in range(4):  # each adopts the last: keys 0, 1, 2 in the end beside the last
        box = down_box(spill)
        assert box.emit(run_event(run_id=RUNS[0], n=generation))
        assert box.close(0).undelivered == {"spilled_at_close": generation + 1}
    (home,) = [path for path in spill.iterdir() if path.is_dir()]
    nested = sorted(path for path in home.iterdir() if path.is_dir())
    assert len(nested) == 3
    assert all(any(name.startswith(HANDED) for name in os.listdir(path)) for path in nested)
    # As if the move of the two oldest up beside their adopter had not happened yet.
    newest = max(nested, key=lambda path: max(os.listdir(path)))
    for path in nested:
        if path != newest:
            shutil.move(str(path), str(newest / path.name))
    assert drain(spill) == [0, 1, 2, 3]
