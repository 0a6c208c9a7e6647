"""One owner of the spill chaos test (``spill_chaos.py``): an outbox with a spill directory,
emitting from one thread until told to close (a line on stdin) or killed.

    python spill_chaos_child.py '{"url": ..., "dir": ..., "audit": ..., "child": 3, ...}'

Standard output, unbuffered, a line per emit: ``+ i`` (accepted) or ``- i`` (refused), ``i``
counting this child's emits; first ``start OWNER N0`` (its owner id, and how many numbers the
events it adopted at start took: its own k-th accepted event has number ``N0 + k``), last
``report {json}`` after a close.

The audit file (appended to with unbuffered writes, so that a SIGKILL loses at most the line
being written) is what the buffer counted, number by number, as the library notes it:
``N first end outcome`` (the journal: settled, delivered or lost), ``T first stream:seq ...``
(events of the stretch read back: where each came from), ``E seq ...`` (this owner's events on
disk), ``S`` (the journal taken for writing), ``Q disk n`` (the settlements taken at the last
``S`` end at record ``n`` of that disk's: a ``Disk``'s own number here, a new one after its
directory is made again), ``D disk n`` (that disk's settlement records up to ``n`` are on disk),
``G stream first:end ...`` (a file deleted: the numbers of that stream it held, settled as far
as a successor can tell, written down or not), ``X`` (nothing handed on: the close deleted the
files), ``R seq ...`` (events whose request timed
out or failed on the wire: the backend may have taken them, and they go again: at least once),
``C seq ...`` (events on the wire when the close let go of what it held: counted lost at close, and
the backend may take them all the same).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import outbox._spill._spill
from outbox import Outbox
from outbox._buffer._numbering import Journal
from outbox._spill import _disk, _streams, _window
from outbox._worker import _conductor, _keys
from outbox.transports import HttpTransport

from support import parts
from support.helpers import run_event

# A request that ended so may have reached the backend (a 1 s timeout on a loaded machine).
_MAYBE_TAKEN = ("timeout", "deadline", "network")


def install_audit(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def say(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    note, take = Journal.note, Journal.take

    def audited_note(self: Journal, first: int, end: int, outcome: str) -> None:
        note(self, first, end, outcome)
        say(f"N {first} {end} {outcome}")

    def audited_take(self: Journal) -> list:  # type: ignore[type-arg]
        entries = take(self)
        say("S")
        return entries

    remember = _window.Window.remember

    def audited_remember(self, first, origins):  # type: ignore[no-untyped-def]
        # (``origins``: [stream, its first number there, how many], in the order read back)
        say(f"T {first} " + " ".join(f"{s}:{seq}" for s, a, n in origins for seq in range(a, a + n)))
        remember(self, first, origins)

    append = _disk.Disk.append

    def audited_append(self, events, lock, drain):  # type: ignore[no-untyped-def]
        wrote = append(self, events, lock, drain)
        if wrote:
            say("E " + " ".join(str(seq) for seq, _ in events[:wrote]))
        return wrote

    # Settlement records, counted per Disk (a new one after a directory is made again):
    # appended to ``unsettled``, and written from its head.
    disks = itertools.count(1)

    def counts(disk: Any) -> list[int]:  # [its number, appended, written]
        if not hasattr(disk, "audit_counts"):
            disk.audit_counts = [next(disks), 0, 0]
        return disk.audit_counts  # type: ignore[no-any-return]

    settled = _disk.Disk.settled

    def audited_settled(self, by):  # type: ignore[no-untyped-def]
        before = len(self.unsettled)
        settled(self, by)
        mine = counts(self)
        mine[1] += len(self.unsettled) - before
        say(f"Q {mine[0]} {mine[1]}")

    write = _disk.Disk.write_settlements

    def audited_write(self):  # type: ignore[no-untyped-def]
        before = len(self.unsettled)
        write(self)
        if before > len(self.unsettled):
            mine = counts(self)
            mine[2] += before - len(self.unsettled)
            say(f"D {mine[0]} {mine[2]}")
        if self.unsettled:  # (the disk refused some: its reserve spent, or failing)
            say("F")

    forget = _streams.Streams.forget

    def audited_forget(self, dead, keep):  # type: ignore[no-untyped-def]
        before = list(self.files)
        forget(self, dead, keep)
        for seg in (seg for seg in before if seg not in self.files):
            if seg.numbers:
                say(f"G {seg.stream} " + " ".join(f"{a}:{b}" for a, b in seg.numbers))

    drop = _disk.Disk.drop_all

    def audited_drop(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        drop(self, *args, **kwargs)
        say("X")

    send = _conductor.Worker._send

    async def audited_send(self, items):  # type: ignore[no-untyped-def]
        outcomes = await send(self, items)
        again = [item.seq for item, o in zip(items, outcomes, strict=False) if o.reason in _MAYBE_TAKEN]
        if again:
            say("R " + " ".join(map(str, again)))
        return outcomes

    drain = _keys.Keys.drain

    def audited_drain(self):  # type: ignore[no-untyped-def]
        on_the_wire = [item.seq for lane in self._wire.values() for item in lane]
        if on_the_wire:
            say("C " + " ".join(map(str, on_the_wire)))
        return drain(self)

    _conductor.Worker._send = audited_send  # type: ignore[method-assign]
    _keys.Keys.drain = audited_drain  # type: ignore[method-assign]
    Journal.note = audited_note  # type: ignore[method-assign]
    Journal.take = audited_take  # type: ignore[method-assign]
    _window.Window.remember = audited_remember  # type: ignore[method-assign]
    _disk.Disk.append = audited_append  # type: ignore[method-assign]
    _disk.Disk.settled = audited_settled  # type: ignore[method-assign]
    _disk.Disk.write_settlements = audited_write  # type: ignore[method-assign]
    _disk.Disk.drop_all = audited_drop  # type: ignore[method-assign]
    _streams.Streams.forget = audited_forget  # type: ignore[method-assign]


def die_in_hand_over(where: str, armed: threading.Event) -> None:
    """SIGKILL this process in the middle of a hand-over, once ``armed`` (its close began: the
    one at start would die before saying its owner): ``rekey`` just after the first new mark of
    a hand-over is written (before the old one is removed, and before the others are keyed),
    ``mark`` just after a dead owner and those it holds are marked (before its rename), ``move``
    just after the first owner nested in an adopted one was moved up beside it (before the
    others)."""
    from outbox._spill import _adoption, _order

    def die() -> None:
        os.write(sys.stdout.fileno(), f"dying in hand-over ({where})\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "rekey":
        mark = _order._mark

        def new_mark_then_dead(path: str, key: int, marked: bool = True) -> bool:
            if armed.is_set():
                os.close(os.open(os.path.join(path, f"{_order.HANDED}{key:016x}"), os.O_WRONLY | os.O_CREAT))
                die()
            return mark(path, key, marked)

        _order._mark = new_mark_then_dead
    elif where == "mark":
        hand_over = _adoption.hand_over

        def marked_then_dead(source: str, floor: int) -> tuple[int, list[str]] | None:
            key = hand_over(source, floor)
            if armed.is_set():
                die()
            return key

        _adoption.hand_over = marked_then_dead  # type: ignore[assignment]
    elif where == "move":
        flatten, rename = _adoption.flatten, os.rename

        def moved_then_dead(directory: str, into: str, order: list[str]) -> list[str]:
            def rename_once(a: str, b: str) -> None:
                rename(a, b)
                if armed.is_set():
                    die()

            os.rename = rename_once  # (flatten's: the sidecar's thread is the one that renames)
            try:
                return flatten(directory, into, order)
            finally:
                os.rename = rename

        _adoption.flatten = moved_then_dead  # type: ignore[assignment]


def main() -> None:
    cfg = json.loads(sys.argv[1])
    install_audit(cfg["audit"])
    closing = threading.Event()
    if cfg.get("die_in_hand_over"):
        die_in_hand_over(cfg["die_in_hand_over"], closing)
    # Dead owners are adopted at start and at close only: an adoption while running would
    # number its events among this owner's own (the audit's arithmetic assumes it does not).
    outbox._spill._spill.SCAN_INTERVAL = 3600.0
    box = Outbox(
        HttpTransport(cfg["url"], timeout=1.0),
        spill_dir=cfg["dir"],
        spill_interval=cfg["interval"],
        max_events=cfg["max_events"],
        max_bytes=cfg["max_bytes"],
        max_spill_bytes=cfg["max_spill_bytes"],
        policy=cfg["policy"],
        block_timeout=0.01,
        backoff_base=0.02,
        backoff_cap=0.3,
        linger=0.0,
        close_at_exit=False,
    )
    spill = parts.spill(box)
    assert spill is not None
    out = sys.stdout.fileno()
    os.write(out, f"start {spill.home.owner} {int(box.stats().spill['recovered'])}\n".encode())
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    runs, child, pad = cfg["runs"], cfg["child"], "x" * cfg["pad"]
    i = 0
    while not stop.is_set():
        event = run_event(run_id=runs[i % len(runs)], n=child * 1_000_000 + i, job=f"chaos-{child}")
        if pad:
            event["job"]["facets"] = {"pad": {"_producer": "p", "_schemaURL": "s", "v": pad}}
        os.write(out, f"{'+' if box.emit(event) else '-'} {i}\n".encode())
        i += 1
        if i % 10 == 0:
            time.sleep(cfg["pause"])
    closing.set()
    report = box.close(cfg["shutdown_timeout"])
    stats = box.stats()
    line = {
        "emitted": report.emitted,
        "delivered": report.delivered,
        "undelivered": dict(report.undelivered),
        "spill_left": dict(report.spill_left),
        "recovered": stats.spill.get("recovered", 0),
    }
    os.write(out, f"report {json.dumps(line)}\n".encode())


if __name__ == "__main__":
    main()
