"""The spill's memory window (outbox/_window.py): with a spill, an outage longer than the buffer
costs disk, not events; memory holds a window; once the backend is back the stretch is read
back from disk and delivered in order.  Real backends on loopback: the ``outbox sink`` behind
the fault proxy, refusing and then passing."""

from __future__ import annotations

import asyncio
import glob
import os
import threading
import time

import orjson
import pytest

from outbox import Outbox
from outbox._run._serde import serialize, weight
from outbox.tools.faultproxy import FaultProxy
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport

from support import parts
from support.chaos import Pulse
from support.helpers import ScriptedTransport, run_event, wait_until
from support.spill_log import records, waiting

RUNS = [f"00000000-0000-4000-8000-{i:012d}" for i in range(8)]


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def assert_each_once_in_run_order(events: list[dict], count: int) -> None:
    """Every event arrived, each run's first arrivals in order.  (A request that timed out on a
    loaded machine after the sink took it is sent again: at least once at the wire; the
    outbox's own accounts, checked by the callers, count each event delivered once.)"""
    ns = [e["n"] for e in events]
    assert sorted(set(ns)) == list(range(count)), f"{len(ns)} delivered, {len(set(ns))} distinct"
    seen: set[int] = set()
    last: dict[str, int] = {}
    for event in events:
        run, n = event["run"]["runId"], event["n"]
        if n in seen:
            continue
        seen.add(n)
        assert n > last.get(run, -1), f"run {run}: event {n} arrived after {last[run]}"
        last[run] = n


def emit_through_the_overflow(box: Outbox, ns: range, pace: float = 1.0) -> None:
    """Emit the run events numbered ``ns`` (of four runs), each accepted, and every ten give
    the sidecar its turn (up to ``pace`` seconds): it writes the overflow to disk within a
    tick, a promise that holds while it keeps pace with emit on this shared, loaded machine."""
    for n in ns:
        assert box.emit(run_event(run_id=RUNS[n % 4], n=n)), box.stats().dropped
        if n % 10 == 0:
            wait_until(lambda: parts.in_window(box) < 20, pace)


def held_in_memory(box: Outbox) -> tuple[int, int]:
    """(events, bytes) the buffer holds in memory: its queue, in flight, the overflow."""
    buf = parts.buffer(box)
    with buf.lock:
        window = buf.holdings.overflow
        events = len(buf.holdings.queue) + buf.holdings.in_flight + len(window.events)
        return events, buf.holdings.held_bytes_locked() + window.bytes(buf.holdings.estimate)


@pytest.mark.slow
def test_a_long_outage_at_4000_events_a_second_drops_nothing_while_the_disk_lasts(tmp_path):
    """9 s at 4,000 events/s (36,000 events, 9 buffers of 4,000) against a backend that
    refuses; nothing dropped, memory within the buffer's bounds (and RSS flat); then the backend
    comes back and every event arrives once, each run in order.

    The promise holds for a sidecar that keeps pace with the rate; one starved of CPU falls
    behind, and emit then drops, counted (docs/operations.md).  So that this test proves the
    promise rather than the machine's load (CI saw a sidecar beside two busy processes and three
    other suites fall 2,000 events behind at 3.5 s), the emitter gives way while memory holds
    three quarters of the buffer, and the rate is asserted at half of 4,000 a second."""
    # A buffer of 4,000: the overflow (half) gives the sidecar half a second to write what
    # emit accepts, which it needs at start-up on a loaded machine (it yields to handlers).
    # (9 s, not longer: the suite keeps every test but the chaos test under 20 s beside load;
    # at 12 s it took 19 s beside two busy processes, the backlog's delivery after the outage.)
    rate, seconds, max_events, max_bytes = 4000, 9.0, 4000, 8 * 1024 * 1024
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="refuse") as proxy:
        box = Outbox(
            HttpTransport(proxy.url, timeout=5),
            spill_dir=str(tmp_path / "spill"),
            max_events=max_events,
            max_bytes=max_bytes,
            shutdown_timeout=60,
            backoff_cap=0.5,
        )
        most = (0, 0)
        gave_way = 0
        rss_at: list[int] = []
        start = time.monotonic()
        n = 0
        total = int(rate * seconds)
        while n < total:
            # At most 400 at once: a thread descheduled on a loaded machine does not catch up in
            # one burst larger than the overflow (half the buffer) before the sidecar's turn, and
            # one whose every sleep lasts 30 ms (CI beside three suites) still keeps the rate.
            due = min(int((time.monotonic() - start) * rate), total, n + 400)
            if held_in_memory(box)[0] > max_events * 3 // 4:
                due = n  # the sidecar is behind: give it the CPU
                gave_way += 1
            for _ in range(due - n):
                assert box.emit(run_event(run_id=RUNS[n % len(RUNS)], n=n))
                n += 1
            held = held_in_memory(box)
            most = (max(most[0], held[0]), max(most[1], held[1]))
            if not rss_at and n >= rate * 2:
                rss_at.append(rss())
            time.sleep(0.005)
        rss_at.append(rss())
        took = time.monotonic() - start
        assert took < 2 * seconds, f"{total} events in {took:.1f} s: below half the rate ({gave_way} waits)"
        stats = box.stats()
        assert stats.dropped == {}, stats.dropped
        assert stats.delivered == 0
        assert most[0] <= max_events, most
        assert most[1] <= max_bytes, most
        # 36,000 dicts of about 1 KiB held in memory would take far more than this.
        assert rss_at[1] - rss_at[0] < 24 * 1024 * 1024, rss_at
        assert stats.spill["stretch_events"] > 24_000, stats.spill
        assert stats.spill["spilled_bytes"] > 0
        proxy.mode = "pass"
        assert sink.wait_for(total, 60), len(sink.events)
        report = box.close(30)
        assert report.complete, report
        assert_each_once_in_run_order(sink.events, total)
        assert box.stats().dropped == {}
        assert box.stats().delivered == total
    assert os.listdir(tmp_path / "spill") == []


def test_an_outage_beyond_the_buffer_is_held_on_disk_and_delivered_in_order(tmp_path):
    """The same, small enough for every run: 20 buffers' worth, no drop, then all in order."""
    max_events = 100
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="refuse") as proxy:
        box = Outbox(
            HttpTransport(proxy.url, timeout=5),
            spill_dir=str(tmp_path / "spill"),
            max_events=max_events,
            shutdown_timeout=30,
            backoff_cap=0.5,
        )
        most = 0
        for n in range(2000):
            assert box.emit(run_event(run_id=RUNS[n % 3], n=n)), box.stats().dropped
            if n % 10 == 0:
                most = max(most, held_in_memory(box)[0])
                # The sidecar's turn: it writes the overflow to disk within a tick (the promise
                # holds while it keeps pace with emit; this machine is shared and loaded).
                wait_until(lambda: parts.in_window(box) < 20)
        assert most <= max_events
        assert wait_until(lambda: box.stats().spill["stretch_events"] > 1500)
        assert box.stats().dropped == {}
        proxy.mode = "pass"
        assert sink.wait_for(2000, 30), len(sink.events)
        assert box.close(10).complete
        assert box.stats().delivered == 2000
        assert_each_once_in_run_order(sink.events, 2000)


def test_the_overflow_full_applies_the_policy_under_its_own_reason(tmp_path):
    """A disk that holds little (max_spill_bytes): once it is full and the overflow too,
    emit refuses, counted dropped_spill_full; everything else still arrives, in order.
    (drop_newest: under drop_oldest, the default, the oldest queued events, read back from the
    stretch, make room for the newest instead, and an accepted event may be given up.)"""
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="refuse") as proxy:
        box = Outbox(
            HttpTransport(proxy.url, timeout=5),
            spill_dir=str(tmp_path / "spill"),
            max_events=100,
            max_spill_bytes=64 * 1024,
            policy="drop_newest",
            shutdown_timeout=30,
            backoff_cap=0.5,
        )
        accepted = []
        for n in range(3000):
            if box.emit(run_event(run_id=RUNS[n % 3], n=n)):
                accepted.append(n)
            if n % 10 == 0 and not box.stats().dropped:  # paced until the disk is full
                wait_until(lambda: parts.in_window(box) < 20, 1)
        dropped = box.stats().dropped
        assert dropped.get("dropped_spill_full", 0) > 0, dropped
        assert set(dropped) <= {"dropped_spill_full", "dropped_full"}
        assert len(accepted) + sum(dropped.values()) == 3000
        spilled = box.stats().spill
        assert spilled["spilled_bytes"] <= 64 * 1024
        proxy.mode = "pass"
        report = box.close(20)
        assert not report.timed_out, report
        assert report.pending == 0, report
        assert report.delivered == len(accepted)
        got = sorted(e["n"] for e in sink.events)
        assert got == accepted


def test_per_run_order_across_a_restart_when_what_is_recovered_exceeds_the_buffer(tmp_path):
    """A process closes with 3,000 events on disk (the backend down); its successor's buffer
    holds 200.  It adopts all of them (a window in memory, the rest through its own disk),
    and newer events of the same runs emitted at once arrive after them."""
    spill = str(tmp_path / "spill")
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="refuse") as proxy:
        first = Outbox(HttpTransport(proxy.url, timeout=5), spill_dir=spill, shutdown_timeout=0.5)
        for n in range(3000):
            assert first.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: first.stats().spill["written"] == 3000), first.stats().spill
        assert first.close().undelivered == {"spilled_at_close": 3000}
        proxy.mode = "pass"
        second = Outbox(HttpTransport(proxy.url), spill_dir=spill, max_events=200)
        assert held_in_memory(second)[0] <= 200
        assert second.stats().spill["recovered"] == 3000
        emit_through_the_overflow(second, range(3000, 3400), pace=10.0)
        assert sink.wait_for(3400, 30), len(sink.events)
        assert second.close(10).complete
        assert second.stats().dropped == {}
        assert_each_once_in_run_order(sink.events, 3400)
    assert os.listdir(spill) == []


def test_blocked_emitters_under_block_wait_for_the_overflow_and_none_is_lost(tmp_path):
    """Several threads under ``block`` while the backend refuses: they go to disk, never wait
    long, and every event arrives once the backend is back."""
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="refuse") as proxy:
        box = Outbox(
            HttpTransport(proxy.url, timeout=5),
            spill_dir=str(tmp_path / "spill"),
            max_events=50,
            policy="block",
            block_timeout=5,
            shutdown_timeout=30,
            backoff_cap=0.5,
        )
        refused = []

        def emitter(k: int) -> None:
            for i in range(300):
                n = k * 300 + i
                if not box.emit(run_event(run_id=RUNS[k], n=n)):
                    refused.append(n)

        threads = [threading.Thread(target=emitter, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert refused == []
        proxy.mode = "pass"
        assert sink.wait_for(1200, 30), len(sink.events)
        assert box.close(10).complete
        assert_each_once_in_run_order(sink.events, 1200)


def test_adoption_at_construction_reads_within_the_buffers_bounds(tmp_path):
    """A dead owner's 4 MiB of events adopted by an outbox of max_bytes=256 KiB: read a window at
    a time (tracemalloc's peak during the constructor stays far below what was on disk), and
    all of it delivered once, in order."""
    import tracemalloc

    spill = tmp_path / "spill"
    pad = "x" * 1500
    count = 2500
    with FaultProxy("127.0.0.1", 9, mode="refuse") as proxy:
        first = Outbox(
            HttpTransport(proxy.url, timeout=5),
            spill_dir=str(spill),
            max_events=count,
            max_bytes=16 * 1024 * 1024,
            shutdown_timeout=0.5,
        )
        for n in range(count):
            event = run_event(run_id=RUNS[n % 4], n=n)
            event["job"]["facets"] = {"pad": {"_producer": "p", "_schemaURL": "s", "v": pad}}
            assert first.emit(event)
        assert wait_until(lambda: first.stats().spill["written"] == count), first.stats().spill
        assert first.close().undelivered == {"spilled_at_close": count}
        # (A busy machine's close may end by its 0.5 s deadline with the sidecar abandoned: it
        # lets go of the directory's lock when it ends, and only then can a successor adopt.)
        assert wait_until(lambda: not parts.sidecar(first).thread.is_alive(), 30)
    on_disk = sum(p.stat().st_size for p in spill.rglob("*.seg"))
    # (Once, in CI beside busy processes and the e2e suite on 3.12, 3,200,420 bytes were found
    # here where 4.9 MB are written: exactly the size of seqs 0-373 and 1,250-2,499, as if the
    # overflow's release had passed the queue's 374-1,249 (see the test of events queued while
    # the sidecar writes).  What the directory and the accounts held is named if it comes back.)
    listing = sorted((p.name, p.stat().st_size) for p in spill.rglob("*"))
    assert on_disk > 4 * 1024 * 1024, (on_disk, listing, first.stats().spill)
    with Sink() as sink:
        tracemalloc.start()
        try:
            second = Outbox(
                HttpTransport(sink.url),
                spill_dir=str(spill),
                max_events=100,
                max_bytes=256 * 1024,
                max_batch_bytes=128 * 1024,
            )
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert second.stats().spill["recovered"] == count
        assert peak < on_disk // 4, (peak, on_disk)
        assert sink.wait_for(count, 30), len(sink.events)
        assert second.close(10).complete
        assert_each_once_in_run_order(sink.events, count)


def test_adoption_at_construction_holds_no_more_events_in_memory_than_max_events(tmp_path):
    """A dead owner's 2,000 small events (a few hundred KB, within the window's bytes) adopted by
    an outbox of max_events=10, the backend refusing: what memory holds (queue, in flight,
    overflow, and what the adopted run keeps of its replay) stays within max_events.  The
    replay used to keep every event that fit the window's *bytes*, whatever their count: 1,995
    events in memory with max_events 10 (19,995 of 20,000 and 15.9 MB traced with
    /tmp/p4work/kept.py 20000 10 in the session that found it)."""
    spill, count, most = tmp_path / "spill", 2000, 10
    with FaultProxy("127.0.0.1", 9, mode="refuse") as proxy:
        first = Outbox(
            HttpTransport(proxy.url, timeout=5), spill_dir=str(spill), max_events=count, shutdown_timeout=0.5
        )
        for n in range(count):
            assert first.emit(run_event(run_id=RUNS[n % 4], n=n))
        assert wait_until(lambda: first.stats().spill["written"] == count), first.stats().spill
        assert first.close().undelivered == {"spilled_at_close": count}
        assert wait_until(lambda: not parts.sidecar(first).thread.is_alive(), 30)
        second = Outbox(
            HttpTransport(proxy.url, timeout=5), spill_dir=str(spill), max_events=most, shutdown_timeout=0.5
        )
        try:
            assert second.stats().spill["recovered"] == count
            buf = parts.buffer(second)
            window = buf.holdings.overflow
            assert wait_until(lambda: window.disk < count)  # (the first read of the stretch)
            with buf.lock:
                held = buf.holdings
                kept = sum(len(run.kept) for run in window.runs)
                in_memory = len(held.queue) + held.in_flight + len(window.events) + kept
        finally:
            report = second.close(0.5)
    assert in_memory <= most, f"{in_memory} events in memory, {kept} of them kept by the adopted run"
    assert sum(report.undelivered.values()) == count


class _EmitAtHandOff:
    """A slicer whose first hand-off lets an emitter in: while the sidecar writes what it
    collected, the application fills the queue's window and overflows (what a loaded machine
    does when the sidecar waits for the GIL between its write and its release)."""

    def __init__(self, buf, events: list) -> None:
        self.buf, self.events = buf, events

    def begin(self) -> None:
        events, self.events = self.events, []
        for event in events:
            with self.buf.lock:
                assert self.buf.put_locked(event, 0)

    def checkpoint(self) -> None:
        pass


def test_events_queued_while_the_sidecar_writes_are_on_disk_before_the_overflow_passes_them(tmp_path):
    """A tick writes the queue as it was (3 events); meanwhile emit fills the window (10) and
    overflows (5 more).  The release of the overflow used to write those 5 at 10-14 and move the
    write position past 3-9, which were never written: close reported all 15 on disk (counted
    spilled_at_close) with 7 missing from the segment.  (CI once found 876 of 2,500 missing in
    the adoption test above: seqs 374-1,249, the queue's window after a write of 374.)"""
    from outbox._buffer._buffer import Buffer, Policy
    from outbox._spill import Spill

    buf = Buffer(max_events=20, max_bytes=10**7, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    spill = Spill(tmp_path, adopt=False)
    spill.attach(buf)
    with buf.lock:
        for n in range(3):
            assert buf.put_locked(run_event(n=n), 0)
    slicer = _EmitAtHandOff(buf, [run_event(n=n) for n in range(3, 15)])
    spill.tick(buf, slicer, 0.0, force=True)
    with buf.lock:
        assert (len(buf.holdings.queue), buf.holdings.beyond) == (10, 5)
    assert spill.close(buf)  # "every event held is on disk"
    on_disk = [(seq, orjson.loads(e.body)["n"]) for _, seq, e in waiting(tmp_path)]
    assert on_disk == [(n, n) for n in range(15)]


def sidecar_cpu(box: Outbox) -> float:
    """Seconds of CPU the outbox's sidecar thread has used."""
    thread = parts.sidecar(box).thread
    assert thread is not None
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def test_a_stretch_waiting_for_byte_room_leaves_the_sidecar_idle_and_emit_within_its_timeout(tmp_path):
    """The queue empty, what is in flight filling the window's bytes (not its count), the stretch
    on disk, the backend holding the batch: nothing can be read back until it answers.  The
    sidecar waits (it used to spin on its loop, its spill due at once and its refill finding no
    room, starving the handlers' threads of the GIL: emit under block took 0.86 s for a
    block_timeout of 0.01 in the chaos test), and emit keeps its bound."""
    # Exact sizes (pre-serialized events): the window's 32 KiB is 32 of them at their length and
    # once the sidecar has measured them (with their key: 1,013 bytes), whenever it does; at 1,024
    # a measure before the 32nd emit sent it to the overflow (CI, 1 run in many, beside load).
    size = 1000

    def text(n: int) -> bytes:
        body = orjson.dumps(run_event(run_id=RUNS[n % 4], n=n))
        return body[:-1] + b',"pad":"' + b"x" * (size - len(body) - 9) + b'"}'

    assert len(text(0)) == size
    held = weight(serialize(text(0)))  # and its key: what each counts for once serialized
    transport = ScriptedTransport(open_gate=False)
    box = Outbox(
        transport,
        spill_dir=str(tmp_path / "spill"),
        max_events=100,
        max_bytes=64 * 1024,
        policy="block",
        block_timeout=0.01,
        # The 32 go out as one batch, taken as the 32nd fills it: never a first event alone,
        # as with no linger a loaded machine's sidecar did, leaving 31 queued behind a lane the
        # backend holds (the window's bytes then never in flight).
        linger=2.0,
        max_batch_events=32,
        shutdown_timeout=5,
    )
    try:
        buf = parts.buffer(box)
        for n in range(32):
            assert box.emit(text(n))
        # All of it taken from the queue, held by the backend: the window's bytes are in flight.
        assert wait_until(lambda: not buf.holdings.queue and buf.holdings.in_flight_bytes == 32 * held), (
            len(buf.holdings.queue),
            buf.holdings.in_flight_bytes,
        )
        for n in range(32, 52):
            assert box.emit(text(n))
        assert wait_until(lambda: box.stats().spill["stretch_events"] == 20), box.stats().spill
        # The window has room by count, not by bytes.
        assert buf.holdings.in_flight < 50
        assert not buf.holdings.queue
        # Emits are judged in the time the process ran (the chaos test's Pulse): beside load
        # it can be off the CPU for half a second in the middle of one.
        pulse = Pulse(slow_emit=float("inf"))
        try:
            began, cpu = time.monotonic(), sidecar_cpu(box)
            slow = []
            n = 52
            while time.monotonic() - began < 1.0:
                t0 = time.monotonic()
                box.emit(text(n))  # accepted (the overflow has room) or refused after block_timeout
                if time.monotonic() - t0 > 0.05:
                    slow.append((t0, time.monotonic()))
                n += 1
                time.sleep(0.001)
            used = sidecar_cpu(box) - cpu
            wall = time.monotonic() - began
            worst = max((pulse.unexplained(t0, t1) for t0, t1 in slow), default=0.0)
        finally:
            pulse.stop()
        assert worst < 0.01 + 0.5, f"emit took {worst:.3f} s (block_timeout 0.01)"
        # Waiting, the sidecar ticks a few times (its spill's interval, emit's wake-ups); spinning,
        # it took a core's share (all of a free core; half of one beside busy processes).
        assert used < 0.2 * wall, f"the sidecar used {used:.3f} s of CPU in {wall:.3f} s, waiting"
        transport.gate.set()
        accepted = box.stats().accepted
        assert transport.wait_delivered(accepted, 30), (len(transport.delivered), accepted)
        report = box.close(10)
        # Every event accepted is delivered; one refused after its block_timeout (a 10 ms wait
        # that a loaded machine can overrun: seen once in CI) is counted, never lost.
        assert report.delivered == accepted, report
        assert report.emitted == accepted + report.undelivered.get("dropped_full", 0), report
        assert set(report.undelivered) <= {"dropped_full"}, report
        # How often a 10 ms wait is overrun is the machine's (29 of 321 beside two CI runs and
        # two busy processes on 2 cores); a stretch that stopped taking events would refuse most.
        assert report.undelivered.get("dropped_full", 0) < (n - 52) // 2, report
    finally:
        transport.gate.set()
        box.close(1)


def test_a_read_back_that_fails_is_tried_again_later_not_round_after_round(tmp_path, monkeypatch):
    """The stretch on disk, the queue empty and room to read it back, but the read fails (EIO:
    a disk that cannot be made to fail here, so the reader is made to): the sidecar tries again
    after READ_AGAIN_AFTER, rather than at once on every round of its loop (a spin that starved
    the handlers' threads of the GIL), warns, and reads the stretch back once the disk does."""
    import errno

    from outbox._spill._streams import Run
    from outbox._spill._window import READ_AGAIN_AFTER

    transport = ScriptedTransport(open_gate=False)
    box = Outbox(transport, spill_dir=str(tmp_path / "spill"), max_events=100, linger=0.0, shutdown_timeout=5)
    try:
        buf = parts.buffer(box)
        n = 0
        while box.stats().spill["stretch_events"] < 40 and n < 2_000:
            box.emit(run_event(run_id=RUNS[n % 4], n=n))
            n += 1
            if n % 50 == 0:
                wait_until(lambda: box.stats().spill["overflow_events"] == 0, 2)
        assert box.stats().spill["stretch_events"] >= 40, box.stats().spill
        reads = 0
        real_read = Run.read

        def failing_read(*args: object, **kwargs: object) -> object:
            nonlocal reads
            reads += 1
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(Run, "read", failing_read)
        transport.gate.set()  # the queue and what is in flight are delivered: room to read back
        assert wait_until(lambda: not buf.holdings.queue and not buf.holdings.in_flight and reads >= 1), (
            reads,
            len(buf.holdings.queue),
        )
        began, cpu, before = time.monotonic(), sidecar_cpu(box), reads
        time.sleep(1.5)  # (the outcome measured: what the sidecar did meanwhile)
        used, wall = sidecar_cpu(box) - cpu, time.monotonic() - began
        # (Reads from here on: a busy machine's wait above saw some already, a second apart.)
        assert reads - before <= wall / READ_AGAIN_AFTER + 1, (reads, before)
        assert used < 0.2 * wall, f"the sidecar used {used:.3f} s of CPU in {wall:.3f} s, to read again"
        monkeypatch.setattr(Run, "read", real_read)
        accepted = box.stats().accepted
        assert transport.wait_delivered(accepted, 30), (len(transport.delivered), accepted)
        report = box.close(10)
        assert report.complete, report
    finally:
        transport.gate.set()
        box.close(1)


def _spill_full_box(tmp_path) -> tuple[Outbox, ScriptedTransport]:
    """An outbox under ``block`` with a spill of 64 KiB, its backend holding every request:
    emitted until the disk is full and a blocked emit has been refused for it."""
    transport = ScriptedTransport(open_gate=False)
    box = Outbox(
        transport,
        spill_dir=str(tmp_path / "spill"),
        max_events=100,
        max_spill_bytes=64 * 1024,
        policy="block",
        block_timeout=0.05,
        shutdown_timeout=5,
    )
    n = 0
    while not box.stats().dropped and n < 5000:
        box.emit(run_event(run_id=RUNS[n % 3], n=n))
        n += 1
        if n % 10 == 0:  # the sidecar's turn: the overflow goes to disk within a tick
            wait_until(lambda: parts.in_window(box) < 20, 1)
    return box, transport


def test_emit_async_under_block_counts_a_refusal_for_a_full_spill_as_emit_does(tmp_path):
    """With the spill at max_spill_bytes and the overflow full, a blocked ``emit`` that times out
    is counted ``dropped_spill_full`` (_window, Reason.DROPPED_SPILL_FULL), and so is the same
    refusal through ``emit_async`` (``_waiting.put_async``: it said ``dropped_full``)."""
    box, transport = _spill_full_box(tmp_path)
    try:
        dropped = box.stats().dropped
        assert set(dropped) == {"dropped_spill_full"}, dropped  # what emit counts
        before = dict(dropped)
        assert not box.emit(run_event(run_id=RUNS[0], n=10_000))
        after_emit = box.stats().dropped
        assert after_emit == {"dropped_spill_full": before["dropped_spill_full"] + 1}, after_emit

        accepted = asyncio.run(box.emit_async(run_event(run_id=RUNS[0], n=10_001)))
        assert not accepted
        after_async = box.stats().dropped
        assert after_async == {"dropped_spill_full": after_emit["dropped_spill_full"] + 1}, after_async
    finally:
        transport.gate.set()
        box.close(5)


def test_a_corrupt_last_record_of_the_stretch_costs_only_itself_not_the_flush(tmp_path):
    """The stretch on disk, its newest record corrupt (a bad sector, a byte flipped): once the
    backend answers, that event is counted ``spill_lost`` and everything else delivered, as
    for a corrupt record in the middle of the stretch (where the next record's sequence number
    shows the gap).  At the stretch's end no record follows: the reader used to find nothing
    more and read again every second for ever, ``flush`` timing out with a healthy backend and
    close handing the corrupt record on as ``spilled_at_close``."""
    transport = ScriptedTransport(open_gate=False)
    box = Outbox(transport, spill_dir=str(tmp_path / "spill"), max_events=100, linger=0.0, shutdown_timeout=5)
    try:
        emit_through_the_overflow(box, range(300))
        assert wait_until(lambda: box.stats().spill["overflow_events"] == 0, 5), box.stats().spill
        assert box.stats().spill["stretch_events"] > 100, box.stats().spill
        (segment,) = glob.glob(str(tmp_path / "spill" / "*" / "*.seg"))
        with open(segment, "rb") as f:
            data = bytearray(f.read())
        found = [r for r in records(bytes(data)) if not isinstance(r, int)]
        assert found[-1].seq == 299  # the newest event, on the stretch
        data[len(data) - 5] ^= 0xFF  # a byte of its body: its checksum no longer matches
        with open(segment, "r+b") as f:
            f.write(data)
        transport.gate.set()
        assert box.flush(5), box.stats()
        stats = box.stats()
        assert stats.dropped == {"spill_lost": 1}, stats
        assert stats.delivered == 299, stats
        assert stats.spill["lost_records"] == 1, stats.spill
    finally:
        transport.gate.set()
        report = box.close(5)
    assert report.undelivered == {"spill_lost": 1}, report


def test_the_stretch_reader_keeps_no_buffered_file_a_fork_could_copy_locked(tmp_path):
    """The chaos test (CI, stop 36) forked while the sidecar was reading the stretch back: the
    reader's buffered file object was mid-read, its lock held by the sidecar, and the child's
    after-fork hook (``Spill.for_child`` closing the reader) waited on that lock for ever.  The
    reader now reads a bare file descriptor with ``os.pread``: nothing in it has a lock.  Read
    partway through a real stretch, it holds no file object at all."""
    import io

    transport = ScriptedTransport(open_gate=False)
    box = Outbox(transport, spill_dir=str(tmp_path / "spill"), max_events=100, linger=0.0)
    try:
        emit_through_the_overflow(box, range(300))
        assert wait_until(lambda: box.stats().spill["stretch_events"] > 100), box.stats().spill
        # Each batch takes 50 ms: the read back lasts a second, not a moment the test may miss.
        transport.delay = 0.05
        transport.gate.set()
        runs = parts.spill(box).window.runs

        def reading():
            return runs and runs[0].reader is not None and runs[0].reader.fd >= 0

        assert wait_until(reading), "the stretch is being read back"
        run = runs[0]
        segment = run.reader
        assert segment is not None
        assert not [v for v in vars(segment).values() if isinstance(v, io.IOBase)], vars(segment)
        assert not [getattr(run, name) for name in run.__slots__ if isinstance(getattr(run, name), io.IOBase)]
        assert box.flush(10)
    finally:
        transport.gate.set()
        box.close(5)


def burst_beside_a_sampler(box: Outbox, event, measure, bound: int) -> tuple:
    """Four threads emit as fast as they can against a refused backend (drop_oldest, the
    default) while a sampler takes ``measure(holdings, window)`` under the buffer's lock;
    bursts until one passes ``bound`` (five at most).  Returns the largest sample, and the
    queue, in flight, overflow and stretch then."""
    buf = parts.buffer(box)
    most: list = [0, None]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with buf.lock:
                held = buf.holdings
                window = held.overflow
                value = measure(held, window)
                if value > most[0]:
                    most[:] = [value, (len(held.queue), held.in_flight, len(window.events), window.disk)]
            time.sleep(0.0005)

    def burst(t: int) -> None:
        for n in range(t, 48_000, 4):
            box.emit(event(n))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for _ in range(5):  # (one burst in four stayed within the bounds)
            emitters = [threading.Thread(target=burst, args=(t,)) for t in range(4)]
            for emitter in emitters:
                emitter.start()
            for emitter in emitters:
                emitter.join()
            if most[0] > bound:
                break
    finally:
        stop.set()
        sampler.join()
    return most[0], most[1]


@pytest.mark.parametrize("bound", ["max_events", "max_bytes"])
def test_memory_stays_within_the_bounds_while_the_stretch_is_read_back_beside_the_overflow(tmp_path, bound):
    """The overflow fills up to the buffer's bound while drop_oldest evicts the queue, and the
    sidecar reads the stretch back into the queue's window beside it: the read's room counts
    the overflow, and is held while it reads outside the lock (emits do not take it), and it
    reads no event past its bytes.  Before, the room was the window's alone: 150 events held
    with max_events 100 (queue 50, overflow 100), and 1.65x max_bytes with text.  The buffer's
    bounds are memory's (docs/operations.md, the loss table)."""
    pad = "x" * 20_000
    if bound == "max_events":
        limits, event = {"max_events": 100}, lambda n: run_event(run_id=RUNS[n % 4], n=n)

        def measure(held, window):
            return len(held.queue) + held.in_flight + len(window.events) + window.reading_events

    else:
        limits = {"max_bytes": 256 * 1024}

        def event(n):
            return orjson.dumps({**run_event(run_id=RUNS[n % 4], n=n), "pad": pad})

        def measure(held, window):
            return held.held_bytes_locked() + window.bytes(held.estimate) + window.reading_bytes

    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="refuse") as proxy:
        box = Outbox(
            HttpTransport(proxy.url, timeout=5),
            spill_dir=str(tmp_path / "spill"),
            shutdown_timeout=30,
            backoff_cap=0.5,
            **limits,
        )
        try:
            most, where = burst_beside_a_sampler(box, event, measure, limits[bound])
        finally:
            proxy.mode = "pass"
            report = box.close(30)
    assert most <= limits[bound], f"held {most} (queue, in flight, overflow, stretch: {where})"
    stats = box.stats()
    assert stats.emitted == stats.delivered + sum(report.undelivered.values())
