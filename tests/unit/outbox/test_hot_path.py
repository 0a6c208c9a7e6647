"""The hot path's promises that are not about time: ``emit`` never serializes (on any path, for
any kind of event), objects are sized where it costs the handler nothing (the sidecar), and
the sidecar's per-event work runs in slices that hand the GIL over.  What it costs in
microseconds is measured by ``python -m outbox.tools.benchmarks tail``, not here."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import sys
import threading
import time
import uuid
import warnings
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from outbox import DatasetRef, LineageJob, Outbox, Outcome, s3_dataset
from outbox._buffer._buffer import FIRST_ESTIMATE, MEASURE_HERE_AFTER, UNLOOKED_MOST
from outbox._buffer._holdings import Measure
from outbox._run._serde import SerializedEvent, serialize, weight
from outbox._runtime._slices import CONTENDED_FOR, HANDOFF, LONGEST_SLICE, SLICE, Slicer
from outbox._worker._intake import measure_here

from support import parts
from support.helpers import ScriptedTransport, run_event, wait_until

# Modules whose code serializes or walks an event: none may run on the caller's thread.
SERIALIZING = ("outbox._run._serde", "orjson", "json", "attr", "attrs", "openlineage.client.serde")


def _openlineage_events(n: int) -> list[Any]:
    from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from openlineage.client import run as legacy

    job = Job(namespace="tests", name="job")
    events: list[Any] = []
    for i in range(n):
        run = Run(runId=str(uuid.uuid4()))
        events.append(
            RunEvent(
                eventType=RunState.START,
                eventTime="2026-12-03T10:00:00+00:00",
                run=run,
                job=job,
                producer="https://example.com/tests",
                inputs=[InputDataset(namespace="s3://b", name=f"k/{i}")],
            )
        )
        if i % 10 == 0:
            events.append(
                legacy.RunEvent(
                    eventType=legacy.RunState.COMPLETE,
                    eventTime="2026-12-03T10:00:01+00:00",
                    run=legacy.Run(runId=str(uuid.uuid4())),
                    job=legacy.Job(namespace="tests", name="job"),
                    producer="https://example.com/tests",
                )
            )
    return events


class _Str(str):
    pass


def _mixed_events(n: int) -> list[Any]:
    """Every kind emit takes: openlineage-python objects (event_v2 and legacy), dicts, str,
    bytes, bytearray and a str subclass."""
    events = _openlineage_events(n // 4)
    for i in range(n - len(events)):
        event = run_event(n=i)
        match i % 5:
            case 0 | 1:
                events.append(event)
            case 2:
                events.append(orjson.dumps(event))
            case 3:
                events.append(orjson.dumps(event).decode())
            case _:
                events.append(_Str(orjson.dumps(event).decode()) if i % 2 else bytearray(orjson.dumps(event)))
    return events


class CallRecorder:
    """A profiler of the calling thread only (``sys.setprofile`` is per thread): the module
    of every Python function and C function called.  Other libraries' garbage-collector
    callbacks (hypothesis times every collection) are set aside meanwhile: a collection may
    run on any thread, and what they call is not the outbox's."""

    def __init__(self) -> None:
        self.modules: Counter[str] = Counter()
        self._gc_callbacks: list[Any] = []

    def __call__(self, frame: Any, what: str, arg: Any) -> None:
        if what == "call":
            self.modules[frame.f_globals.get("__name__", "?")] += 1
        elif what == "c_call":
            self.modules[
                getattr(arg, "__module__", None) or type(getattr(arg, "__self__", None)).__module__
            ] += 1

    def __enter__(self) -> CallRecorder:
        self._gc_callbacks = gc.callbacks[:]
        gc.callbacks.clear()
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        gc.callbacks.extend(self._gc_callbacks)

    def serializing(self) -> dict[str, int]:
        return {m: n for m, n in self.modules.items() if m.split(".")[0] in SERIALIZING or m in SERIALIZING}


def _looked(outbox: Outbox, ahead: int = UNLOOKED_MOST - 128) -> bool:
    """Whether ``ahead`` more events may queue before an emitter would measure an object: the
    sidecar has looked at the newest objects recently (it does every 10 ms while they come)."""
    buf = parts.buffer(outbox)
    with buf.lock:
        return buf.holdings.look_end - buf.holdings.next_seq >= ahead


def _paced(outbox: Outbox, events: list[Any], emit: Any = None) -> tuple[list[Any], CallRecorder]:
    """``events`` emitted 256 at a time, each chunk once the sidecar has looked (what a handler
    meets unless it outruns the sidecar: ``test_objects_that_grow_while_the_sidecar_cannot_run_
    stay_within_the_bound_by_construction``), recorded; the waits are not.  The sidecar is
    held during each chunk, so that what a chunk's emits do does not depend on when a busy
    machine lets the sidecar run among them."""
    recorder, results = CallRecorder(), []
    for start in range(0, len(events), 256):
        assert wait_until(lambda: _looked(outbox), 10)
        with parts.sidecar_held(outbox), recorder:
            results += [(emit or outbox.emit)(event) for event in events[start : start + 256]]
    return results, recorder


def _stuck(**kw: Any) -> tuple[Outbox, ScriptedTransport]:
    """An outbox whose backend never answers: after the first batch, everything queues (the
    queue is behind, the case in which emit used to measure a sample itself)."""
    transport = ScriptedTransport(open_gate=False)
    kw.setdefault("max_events", 50_000)
    kw.setdefault("max_bytes", 2**30)
    outbox = Outbox(transport, linger=0, close_at_exit=False, **kw)
    return outbox, transport


def test_emit_never_serializes_on_the_callers_thread():
    events = _mixed_events(20_000)
    outbox, transport = _stuck()
    outbox.emit(run_event())
    assert transport.send_started.wait(10)
    first_of_each = {event.__class__: event for event in reversed(events)}
    for event in first_of_each.values():  # every class seen once (admitted) beforehand
        outbox.emit(event)
    accepted, calls = _paced(outbox, events)
    assert all(accepted)
    assert calls.serializing() == {}, calls.modules
    # What emit does call: the outbox's hot path, and C methods of builtins, deques and locks;
    # and the sidecar's wake-up (call_soon_threadsafe: a byte to its self-pipe) when the queue
    # reaches the size the worker asked to be woken at.  A wake-up disarms the threshold until
    # the worker runs again and arms it anew, which it cannot while held: at most one a chunk
    # (emit woke it per event, 256 a chunk, before that rule).
    called = set(calls.modules) - {__name__, "sys"}  # this list comprehension; setprofile(None)
    hot = {"outbox._outbox", "outbox._buffer._buffer", "builtins", "collections", "_thread"}
    wake = {"outbox._worker._sidecar", "asyncio.events", "asyncio.base_events", "asyncio.selector_events"}
    assert called <= hot | wake | {"socket", "_contextvars"}, calls.modules
    chunks = -(-len(events) // 256)
    assert calls.modules["outbox._worker._sidecar"] <= chunks
    assert calls.modules["socket"] <= calls.modules["outbox._worker._sidecar"], calls.modules
    # emit itself, once per event, and its ``_woken`` once per wake-up
    woken = calls.modules["outbox._worker._sidecar"]
    assert calls.modules["outbox._outbox"] == len(events) + woken, calls.modules
    stats = outbox.stats()
    assert stats.accepted == len(events) + len(first_of_each) + 1
    outbox.close(0.1)


def test_the_first_call_of_a_new_event_class_does_not_serialize_either():
    outbox, transport = _stuck()
    outbox.emit(run_event())
    assert transport.send_started.wait(10)
    (event,) = _openlineage_events(1)[:1]
    with CallRecorder() as calls:
        assert outbox.emit(event)
        assert outbox.emit(_Str('{"eventType": "START"}'))
    assert calls.serializing() == {}, calls.modules
    outbox.close(0.1)


def test_the_run_helpers_never_serialize_on_the_callers_thread():
    outbox, transport = _stuck()
    job = LineageJob("tests", "job")
    outbox.emit(run_event())
    assert transport.send_started.wait(10)

    def invocation(i: int) -> None:
        with outbox.run(job, inputs=[s3_dataset("b", f"k/{i}")]):
            pass

    _, calls = _paced(outbox, list(range(5_000)), invocation)
    assert calls.serializing() == {}, calls.modules
    assert outbox.stats().accepted == 10_001
    outbox.close(0.1)


@pytest.mark.parametrize("policy", ["drop_oldest", "block"])
def test_emit_async_never_serializes_on_the_callers_thread(policy):
    events = _mixed_events(4_000)
    outbox, transport = _stuck(policy=policy, block_timeout=0.01)
    outbox.emit(run_event())
    assert transport.send_started.wait(10)

    async def main() -> list[bool]:
        calls, accepted = CallRecorder(), []
        for start in range(0, len(events), 256):  # (paced as ``_paced`` does)
            assert wait_until(lambda: _looked(outbox), 10)
            with calls:
                accepted += [await outbox.emit_async(event) for event in events[start : start + 256]]
        assert calls.serializing() == {}, calls.modules
        return accepted

    assert all(asyncio.run(main()))
    outbox.close(0.1)


def test_an_object_is_counted_at_a_conservative_estimate_until_the_sidecar_measures_it():
    """The first object wakes the sidecar, which measures it: its exact size is what the
    queue counts from then on, without the handler serializing anything."""
    outbox, transport = _stuck(max_events=100)
    outbox.emit(run_event())
    assert transport.send_started.wait(10)
    big = run_event()
    big["run"]["facets"]["pad"] = {"_producer": "p", "_schemaURL": "s", "x": "x" * 50_000}
    outbox.emit(big)
    assert wait_until(lambda: outbox.stats().queued_bytes > 50_000, 10), outbox.stats()
    size = weight(serialize(big))  # its JSON and its key
    assert size == len(orjson.dumps(big)) + len(serialize(big).key)
    assert outbox.stats().queued_bytes == size
    # Later objects are counted at that estimate at once (not at the first guess).
    for _ in range(3):
        outbox.emit(big)
    assert outbox.stats().queued_bytes >= 4 * size * 0.9
    assert size > FIRST_ESTIMATE
    outbox.close(0.1)


class _LoopBlockingTransport:
    """Blocks its sidecar's event loop in send until released: a sidecar that cannot run (as
    one starved of CPU, or still starting, when a burst comes)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    async def send(self, batch: Any, deadline: float) -> list[Any]:
        self.entered.set()
        self.release.wait(30)
        return [Outcome.delivered()] * len(batch)

    async def aclose(self) -> None:
        pass


def _large_events(n: int) -> list[dict[str, Any]]:
    """``n`` dict events of about 100 KB each (a facet padded)."""
    pad = "x" * 100_000
    events = []
    for i in range(n):
        event = run_event(n=i)
        event["run"]["facets"]["pad"] = {"_producer": "p", "_schemaURL": "s", "x": pad}
        events.append(event)
    return events


def test_a_burst_of_large_objects_before_the_sidecar_measures_is_measured_by_the_emitter_once():
    """The first object asks the sidecar to measure it; a sidecar that does not run meanwhile
    would let a burst of large objects queue at the first guess (4 KiB), far past max_bytes.
    After MEASURE_HERE_AFTER of them, the emitter measures the newest itself, once: the byte
    bound holds again at once, and nothing else is serialized on its thread."""
    transport = _LoopBlockingTransport()
    max_bytes = 2 * 1024 * 1024
    outbox = Outbox(transport, max_bytes=max_bytes, linger=0, close_at_exit=False)
    assert outbox.emit('{"eventType": "START"}')  # text: exact, asks for no measuring
    assert transport.entered.wait(10)  # the sidecar's loop is stuck from here on
    events = _large_events(300)
    with CallRecorder() as calls:
        for event in events:
            outbox.emit(event)
    size = len(orjson.dumps(events[-1]))
    stats = outbox.stats()
    assert stats.queued_bytes <= max_bytes, stats
    assert stats.queued_events <= max_bytes // size + 1, stats
    assert stats.dropped["dropped_full"] >= 300 - max_bytes // size - 1, stats
    assert parts.buffer(outbox).holdings.estimate >= size * 0.99
    assert calls.modules.get("outbox._run._serde", 0) >= 1  # measured here...
    assert calls.modules["namedtuple_SerializedEvent"] == 1  # ... once (one object serialized)
    assert parts.buffer(outbox).holdings.measure_here is Measure.SIDECAR  # (and done)
    transport.release.set()
    report = outbox.close(10)
    assert not report.timed_out
    assert report.emitted == 301
    assert report.delivered == 301 - report.undelivered["dropped_full"]  # what the bound kept


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_newest"])
def test_objects_that_grow_while_the_sidecar_cannot_run_stay_within_the_bound_by_construction(policy):
    """The estimate learnt from a small object, then the sidecar cannot run, and objects of
    100 KB come (#39's "growing" flood): before, every one queued at the small estimate, up to
    max_events (3,000 of them, 300 MB held in 8 MiB).  Now the emitter of an object
    UNLOOKED_MOST events past the sidecar's last look measures the newest: the queue is
    re-priced and the bound enforced by the policy.  What objects hold beyond max_bytes is
    UNLOOKED_MOST of them at most, and the emitter measured one in UNLOOKED_MOST."""
    transport = _LoopBlockingTransport()
    max_bytes = 8 * 1024 * 1024
    outbox = Outbox(transport, max_bytes=max_bytes, policy=policy, linger=0, close_at_exit=False)
    assert outbox.emit(run_event())  # a small object: the sidecar measures it, then sends it
    assert transport.entered.wait(10)  # and its loop is stuck from here on
    small = parts.buffer(outbox).holdings.estimate
    events = _large_events(3_000)
    size = len(orjson.dumps(events[-1]))
    with CallRecorder() as calls:
        for event in events:
            outbox.emit(event)
    stats = outbox.stats()
    assert small < 1_000
    assert parts.buffer(outbox).holdings.estimate >= size * 0.99, stats
    assert stats.queued_events <= max_bytes // size + UNLOOKED_MOST, stats  # (3,000 before)
    assert stats.dropped["dropped_full"] >= 3_000 - max_bytes // size - UNLOOKED_MOST, stats
    assert 1 <= calls.modules["namedtuple_SerializedEvent"] <= 3_000 // UNLOOKED_MOST + 1, calls.modules
    transport.release.set()
    report = outbox.close(10)
    assert not report.timed_out
    assert report.emitted == 3_001
    assert report.delivered == 3_001 - report.undelivered["dropped_full"]  # what the bound kept


def test_a_sidecar_that_runs_measures_the_first_object_itself():
    """In the usual case the sidecar measures the first object long before a burst of
    MEASURE_HERE_AFTER: the emitter never does (emit never serializes)."""
    outbox, transport = _stuck()
    outbox.emit(run_event())
    assert transport.send_started.wait(10)
    assert wait_until(lambda: parts.buffer(outbox).holdings.measured, 10)
    with CallRecorder() as calls:
        for i in range(3 * MEASURE_HERE_AFTER):
            outbox.emit(run_event(n=i))
    assert calls.serializing() == {}, calls.modules
    assert parts.buffer(outbox).holdings.measure_here is Measure.SIDECAR
    outbox.close(0.1)


def test_a_long_job_name_counts_twice_as_it_is_held_twice():
    """The message key (``run:ns/name``) is a string of its own beside the body: an event
    whose job name is 100 KB holds it twice, and counts for both against max_bytes."""
    outbox, transport = _stuck(max_events=100, max_bytes=1024 * 1024)
    outbox.emit(run_event())
    assert transport.send_started.wait(10)
    named = run_event()
    named["job"]["name"] = "j" * 100_000
    outbox.emit(named)
    assert wait_until(lambda: outbox.stats().queued_bytes > 200_000, 10), outbox.stats()
    for _ in range(20):
        outbox.emit(named)
    stats = outbox.stats()
    assert stats.queued_bytes <= 1024 * 1024
    assert stats.queued_events <= 1024 * 1024 // 200_000
    assert stats.dropped["dropped_full"] >= 16
    outbox.close(0.1)


def test_objects_that_grow_are_re_priced_and_the_byte_bound_enforced():
    """Small objects first, then large ones while the sidecar is behind: the sidecar samples
    the newest, the estimate goes up at once, and every queued object is re-priced, so that
    the policy brings the held bytes back within max_bytes."""
    outbox, transport = _stuck(max_events=20_000, max_bytes=8 * 1024 * 1024)
    outbox.emit(run_event())
    assert transport.send_started.wait(10)
    for i in range(2_000):
        outbox.emit(run_event(n=i))
    pad = "x" * 20_000
    for i in range(2_000):
        event = run_event(n=i)
        event["run"]["facets"]["pad"] = {"_producer": "p", "_schemaURL": "s", "x": pad}
        outbox.emit(event)

    def within_bound() -> bool:
        stats = outbox.stats()
        # 8 MiB of ~20 KB events: at most ~420 large ones (and the 2,000 small) can be held.
        return stats.queued_events + stats.in_flight <= 2_000 + 8 * 1024 * 1024 // 20_000 + 1

    assert wait_until(within_bound, 10), outbox.stats()
    stats = outbox.stats()
    assert stats.queued_bytes <= 8 * 1024 * 1024
    assert stats.dropped.get("dropped_full", 0) >= 1_500
    assert stats.offered == stats.delivered + stats.lost + stats.queued_events + stats.in_flight
    outbox.close(0.1)


class _Buffer:
    """What a Slicer reads of the buffer."""

    def __init__(self) -> None:
        self.emitted = 0
        self.queue: list[Any] = []
        self.in_flight = 0
        self.beyond = 0  # (a spill's overflow and stretch)
        self.max_events = 10_000
        self.holdings = self  # (the queue, in_flight, beyond and max_events are the holdings')


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _slicer(buffer: _Buffer, clock: _Clock, **kw: Any) -> Slicer:
    return Slicer(buffer, clock=clock, sleep=clock.sleep, **kw)  # type: ignore[arg-type]


def _work(slicer: Slicer, buffer: _Buffer, clock: _Clock, slices: int) -> list[float]:
    """``slices`` periods of work, each as long as the slice's budget, with handlers emitting:
    the budget after each hand-off."""
    budgets = []
    for _ in range(slices):
        buffer.emitted += 1
        clock.now += slicer.budget * 1.01
        slicer.checkpoint()
        budgets.append(slicer.budget)
    return budgets


def test_a_slice_ends_in_a_hand_off_of_the_gil_while_handlers_emit():
    buffer, clock = _Buffer(), _Clock()
    slicer = _slicer(buffer, clock)
    slicer.begin()
    for _ in range(10):  # work shorter than a slice: no hand-off
        clock.now += SLICE / 20
        slicer.checkpoint()
    assert clock.sleeps == []
    buffer.emitted = 5  # a handler emits meanwhile
    clock.now += SLICE
    slicer.checkpoint()
    assert clock.sleeps == [HANDOFF]
    clock.now += SLICE / 2  # the next slice starts after the hand-off
    slicer.checkpoint()
    assert clock.sleeps == [HANDOFF]


def test_no_hand_off_when_nobody_emits_or_in_attached_mode():
    buffer, clock = _Buffer(), _Clock()
    slicer = _slicer(buffer, clock)
    buffer.emitted = 1
    slicer.begin()
    clock.now += SLICE
    slicer.checkpoint()  # handlers emitted: hand off
    assert len(clock.sleeps) == 1
    clock.now += 1.0  # nobody has emitted for a second: the sidecar keeps the GIL
    slicer.begin()
    for _ in range(5):
        clock.now += SLICE
        slicer.checkpoint()
    assert len(clock.sleeps) == 1
    attached = _slicer(buffer, clock, enabled=False)
    attached.begin()
    buffer.emitted = 2
    clock.now += SLICE
    attached.checkpoint()
    assert len(clock.sleeps) == 1


class _SlowClock(_Clock):
    """A hand-off that comes back late: a handler computed meanwhile."""

    def __init__(self, late: float) -> None:
        super().__init__()
        self.late = late

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        self.now += self.late


def test_slices_grow_while_the_sidecar_is_behind_a_handler_that_computes():
    """Politeness must not starve the sidecar: behind (more than a batch queued) with slow
    hand-offs, its slices double up to LONGEST_SLICE; caught up, they halve back."""
    buffer, clock = _Buffer(), _SlowClock(late=5e-3)
    slicer = _slicer(buffer, clock, behind_above=10)
    buffer.emitted = 1
    buffer.holdings.queue = [None] * 50
    slicer.begin()
    budgets = _work(slicer, buffer, clock, 12)
    assert budgets[0] == 2 * SLICE
    assert budgets[-1] == LONGEST_SLICE
    assert all(b <= LONGEST_SLICE for b in budgets)
    buffer.holdings.queue = []  # caught up
    _work(slicer, buffer, clock, 12)  # handlers still emit
    assert slicer.budget == SLICE
    buffer.holdings.queue = [None] * 50  # behind again, then the handlers stop: short slices again
    _work(slicer, buffer, clock, 4)
    assert slicer.budget > SLICE
    clock.now += 1.0
    slicer.checkpoint()
    assert slicer.budget == SLICE


def test_slices_grow_while_a_batch_in_hand_waits_behind_a_handler_that_computes():
    """Behind is the work in hand too: a batch taken (in flight, being serialized or waiting
    for a lane) with the queue short is no reason to hand the GIL over every slice to a handler
    that computes (each hand-off costs the sidecar a switch interval: a busy handler starved
    it, #37).  Caught up (nothing held beyond a batch), the slices halve back."""
    buffer, clock = _Buffer(), _SlowClock(late=5e-3)
    slicer = _slicer(buffer, clock, behind_above=10)
    buffer.emitted = 1
    buffer.holdings.queue, buffer.holdings.in_flight = [None] * 3, 40
    slicer.begin()
    _work(slicer, buffer, clock, 12)
    assert slicer.budget == LONGEST_SLICE
    assert slicer.contended  # (the worker then gives a new request no wait on the wire)
    buffer.holdings.in_flight = 0
    _work(slicer, buffer, clock, 12)
    assert slicer.budget == SLICE
    clock.now += 1.0  # the handlers stopped
    slicer.checkpoint()
    assert not slicer.contended


def test_slices_grow_behind_a_handler_that_computes_with_a_buffer_smaller_than_a_batch_or_a_spill():
    """Behind is judged against a quarter of max_events when that is less than a batch (a
    buffer of 1,000 never held more than a batch of 1,000 queued, nor a spill's window half of
    it), and counts what waits beyond the queue (a spill's overflow, its stretch on disk):
    before, a handler emitting in a tight loop into max_events=1,000 with a spill left the
    sidecar 30 µs slices between hand-offs of 5 ms each, and it wrote nothing to the spill in a
    0.4 s burst."""
    for queued, beyond in ((300, 0), (0, 300)):
        buffer, clock = _Buffer(), _SlowClock(late=5e-3)
        buffer.max_events = 1_000
        slicer = _slicer(buffer, clock, behind_above=1_000)
        buffer.emitted = 1
        buffer.holdings.queue, buffer.holdings.beyond = [None] * queued, beyond
        slicer.begin()
        _work(slicer, buffer, clock, 12)
        assert slicer.budget == LONGEST_SLICE, (queued, beyond)
        buffer.holdings.queue, buffer.holdings.beyond = [], 0  # caught up
        _work(slicer, buffer, clock, 12)
        assert slicer.budget == SLICE


def test_no_growth_when_hand_offs_come_back_at_once():
    """A handler waiting on I/O takes the GIL only briefly: the slices stay short, however far
    behind the sidecar is (it gets the time it needs while the handler waits)."""
    buffer, clock = _Buffer(), _Clock()
    slicer = _slicer(buffer, clock, behind_above=10)
    buffer.emitted = 1
    buffer.holdings.queue = [None] * 50
    slicer.begin()
    _work(slicer, buffer, clock, 10)
    assert slicer.budget == SLICE
    assert len(clock.sleeps) == 10


def test_a_hand_off_first_lets_the_worker_sample_what_objects_weigh():
    buffer, clock = _Buffer(), _Clock()
    calls = []
    slicer = _slicer(buffer, clock, on_handoff=lambda: calls.append(clock.now))
    slicer.begin()
    clock.now += SLICE / 2
    slicer.checkpoint()
    assert calls == []
    clock.now += SLICE
    slicer.checkpoint()
    assert len(calls) == 1


def test_the_sidecar_serializes_a_backlog_through_its_checkpoints():
    """Every event the sidecar serializes passes a checkpoint: its work is sliced, on its
    own thread, and the checkpoints run there (never on the emitting thread)."""
    outbox, transport = _stuck()
    worker = parts.worker(outbox)
    assert worker is not None
    seen: Counter[int] = Counter()

    class Counting(Slicer):
        def checkpoint(self) -> None:
            seen[threading.get_ident()] += 1
            super().checkpoint()

    worker.slicer = worker.intake.slicer = Counting(parts.buffer(outbox))
    transport.gate.set()
    for event in _mixed_events(3_000):
        outbox.emit(event)
    report = outbox.close(30)
    assert report.delivered == 3_000
    assert threading.get_ident() not in seen
    assert sum(seen.values()) >= 3_000


class FunctionRecorder:
    """The Python functions the calling thread calls (``sys.setprofile``, per thread), by
    module and name, and how many profile events (calls of Python and C functions) in all."""

    def __init__(self) -> None:
        self.functions: Counter[str] = Counter()
        self.events = 0

    def __call__(self, frame: Any, what: str, arg: Any) -> None:
        if what == "call":
            self.functions[f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"] += 1
            self.events += 1
        elif what == "c_call":
            self.events += 1

    def __enter__(self) -> FunctionRecorder:
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


def _in_an_outage(policy: str, backlog: int) -> tuple[Outbox, Any]:
    """An outbox whose backend refuses everything, its buffer full of ``backlog`` events (under
    ``block``, full but for room for 1,000 more): what the handler's emits meet in a long outage."""
    from support.helpers import FailingTransport

    outbox = Outbox(
        FailingTransport(), max_events=backlog, max_bytes=2**31, policy=policy, close_at_exit=False
    )
    event = run_event()
    fill = backlog - 1_000 if policy == "block" else backlog + 10
    for _ in range(fill):
        outbox.emit(event)
    assert wait_until(lambda: parts.buffer(outbox).holdings.measured)
    return outbox, event


@contextlib.contextmanager
def _held_out_of_reach(outbox: Outbox, emits: int) -> Iterator[None]:
    """The sidecar held (``parts.sidecar_held``) at a moment when the wake-up its worker asked
    for is more than ``emits`` events past what is queued (tried again until it is)."""
    holdings = parts.buffer(outbox).holdings
    for _ in range(200):
        with parts.sidecar_held(outbox):
            with parts.buffer(outbox).lock:
                reach = min(holdings.wake_at_events, holdings.wake_at_objects) - len(holdings.queue)
            if reach > emits:
                yield
                return
        time.sleep(0.05)
    raise AssertionError(f"the worker kept asking to be woken within {emits} events")


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_newest", "block"])
def test_emit_in_a_long_outage_does_no_work_that_grows_with_the_backlog(policy):
    # Two backlogs twenty times apart: the same calls per emit, none of them the slow path's
    # (eviction by a loop, room recomputed, the sidecar woken).  Its latency against an empty
    # buffer is the benchmark's: `tail --rows full`.
    calls = {}
    for backlog in (2_000, 40_000):
        outbox, event = _in_an_outage(policy, backlog)
        # (500 emits: no emitter measures, nor do they reach the three quarters of the look at
        # which the sidecar is woken to look again)
        assert wait_until(functools.partial(_looked, outbox))
        buf = parts.buffer(outbox)
        with buf.lock:
            held = len(buf.holdings.queue) + buf.holdings.in_flight
        assert held >= backlog - 1_000
        before = outbox.stats().dropped.get("dropped_full", 0)
        # The worker held, once the wake-up it asked for is more than 500 events away: a
        # retry that put its batch back (a loaded machine's timing) may have asked to be woken
        # 300 events on, a wake-up the emits then owe it (r81: once, under block).
        with _held_out_of_reach(outbox, 500), FunctionRecorder() as recorder:
            for _ in range(500):
                outbox.emit(event)
        slow = {name: n for name, n in recorder.functions.items() if name.startswith("outbox.")}
        slow.pop("outbox._outbox.emit")
        slow.pop("outbox._buffer._buffer.put")
        # (a queued event the sidecar sampled, now evicted at its exact size: the room recomputed)
        assert slow.get("outbox._buffer._holdings.recompute_locked", 0) <= 8, slow
        slow.pop("outbox._buffer._holdings.recompute_locked", None)
        assert slow.pop("outbox._buffer._numbering.end", 0) <= 8, slow  # (the recompute's)
        assert slow == {}, slow  # nothing else: no slow path, no wake-up of the sidecar
        calls[backlog] = recorder.events
        dropped = outbox.stats().dropped.get("dropped_full", 0) - before
        assert dropped == (0 if policy == "block" else 500)  # each emit evicted or was refused
        outbox.close(0.1)
    assert abs(calls[40_000] - calls[2_000]) <= 16, calls  # (the same, but for those samples)


def test_events_evicted_in_an_outage_are_freed_by_the_sidecar_never_by_the_handler():
    # Freeing an openlineage-python event costs its emitter microseconds (`tail --rows full`):
    # under drop_oldest, what emit evicts waits for the sidecar, which frees it, all of it.
    from support.helpers import FailingTransport

    outbox = Outbox(FailingTransport(), max_events=300, policy="drop_oldest", close_at_exit=False)
    handler, freed_on = threading.get_ident(), []

    def freed(_: Any) -> None:
        freed_on.append(threading.get_ident())

    filler = run_event()
    outbox.emit(filler)
    assert wait_until(lambda: parts.buffer(outbox).holdings.measured)
    events = _openlineage_events(300)[:299]
    refs = [weakref.ref(event, freed) for event in events]
    for _ in range(13):
        # Each chunk once the sidecar has looked (no emitter measures: it would free the object
        # it serialized), and with the sidecar held (a batch it took would be freed by whoever
        # drops the last reference: an emit in the middle of its call).
        assert wait_until(lambda: _looked(outbox, 128))
        with parts.sidecar_held(outbox):
            for _ in range(100):
                outbox.emit(events.pop() if events else filler)  # the outbox's alone once emitted
    assert outbox.stats().dropped.get("dropped_full", 0) >= 600
    assert wait_until(lambda: all(ref() is None for ref in refs)), sum(ref() is not None for ref in refs)
    assert len(freed_on) == 299
    assert handler not in freed_on
    outbox.close(0.1)


def test_the_run_helpers_record_what_changes_in_few_python_calls():
    # A run in a span of its own trace, as a DataEngine handler's: the dataset, the run, its
    # id, and two records handed straight to the buffer (no class check, no NamedTuple made).
    from opentelemetry import context, trace

    outbox, _ = _stuck()
    job = LineageJob("tests", "job")
    with outbox.run(job, inputs=[s3_dataset("bucket", "warm-up")]):  # (the first object: measured)
        pass
    assert wait_until(lambda: parts.buffer(outbox).holdings.measured)
    spans = [trace.NonRecordingSpan(trace.SpanContext(i + 1 << 64, 1, is_remote=False)) for i in range(200)]
    contexts = [trace.set_span_in_context(span) for span in spans]
    tokens = [None]
    with parts.sidecar_held(outbox), FunctionRecorder() as recorder:  # (it takes nothing meanwhile)
        for ctx in contexts:
            tokens[0] = context.attach(ctx)
            with outbox.run(job, inputs=[s3_dataset("bucket", "key")]):
                pass
            context.detach(tokens[0])
        with parts.buffer(outbox).lock:
            queued = list(parts.buffer(outbox).holdings.queue)[-2:]
    ours = {name: n for name, n in recorder.functions.items() if name.startswith("outbox.")}
    # s3_dataset, Outbox.run (Run.__init__ in line), run_id_of_span, __enter__, put, __exit__,
    # put (and now and then the sidecar's wake-up, when a batch's worth is queued)
    calls = sum(n for name, n in ours.items() if not name.endswith(("_woken", ".wake")))
    assert calls <= 7 * len(contexts), ours
    assert "outbox._run._run.__init__" not in ours
    assert "outbox._outbox.emit" not in ours  # (the class check is for what a caller hands emit)
    assert [record.__class__ for record in queued] == [tuple, tuple]  # one allocation each
    assert [record[1] for record in queued] == ["START", "COMPLETE"]
    outbox.close(0.1)


def test_a_run_keeps_two_gc_tracked_objects_its_two_records():
    # Each GC-tracked object a run leaves held (until the sidecar takes it) brings the next
    # young collection closer, and a collection in the handler is its p99.9.  A run of one
    # dataset keeps its two records, which hold the dataset's namespace and name (strings,
    # not tracked), not the DatasetRef or a tuple of it; the run itself, the list and the
    # DatasetRef go, and the run id is a number.
    from opentelemetry import context, trace

    outbox, _ = _stuck()
    job = LineageJob("tests", "job")
    with outbox.run(job, inputs=[s3_dataset("bucket", "warm-up")]):
        pass
    spans = [trace.NonRecordingSpan(trace.SpanContext(i + 1 << 80, 1, is_remote=False)) for i in range(3)]
    with parts.sidecar_held(outbox):  # (so that the records are still queued as the run left them)
        for span in spans:
            token = context.attach(trace.set_span_in_context(span))
            with outbox.run(job, inputs=[s3_dataset("bucket", "key")]):
                pass
            context.detach(token)
        with parts.buffer(outbox).lock:
            start, complete = list(parts.buffer(outbox).holdings.queue)[-2:]
    kept = {id(o): o for record in (start, complete) for o in (record, *gc.get_referents(record))}
    per_run = [o for o in kept.values() if gc.is_tracked(o) and o is not job]
    assert len(per_run) == 2, per_run
    assert (start[4], start[7]) == (complete[4], complete[7]) == ("s3://bucket", "key")
    # And with facets (a table's symlink), the DatasetRef alone: three.
    table = DatasetRef("trino://h:8080", "c.s.t")
    with parts.sidecar_held(outbox):
        with outbox.run(job, inputs=[s3_dataset("bucket", "key", table=table)]):
            pass
        with parts.buffer(outbox).lock:
            start, complete = list(parts.buffer(outbox).holdings.queue)[-2:]
    kept = {id(o): o for record in (start, complete) for o in (record, *gc.get_referents(record))}
    assert len([o for o in kept.values() if gc.is_tracked(o) and o is not job]) == 3
    assert start[4] is complete[4] == s3_dataset("bucket", "key", table=table)
    outbox.close(0.1)


def test_a_runs_overhead_is_measured_only_for_a_timed_job():
    outbox, _ = _stuck()
    quiet, timed = LineageJob("tests", "quiet"), LineageJob("tests", "timed", timed=True)
    with outbox.run(quiet) as run:
        pass
    assert run.overhead == 0.0  # no clock read on the handler's path
    assert quiet.last_run is None
    with outbox.run(timed, inputs=[s3_dataset("bucket", "key")]) as run:
        pass
    assert run.overhead > 0
    assert timed.last_run is run
    assert outbox.stats().accepted == 4
    outbox.close(0.1)


def test_a_slice_is_fresh_only_after_a_wait_that_lasted_a_hand_off():
    # The worker's loop reports its waits: a zero-timeout one hands nothing over (the slice
    # goes on); one that lasted a hand-off starts a fresh slice.  (The seconds waited, not a
    # time the slicer subtracts from its clock: a test preempted for a hand-off, 20 µs, between
    # reading the clock and the slicer's own reading took "no time" for a hand-off, under load.)
    buffer, clock = _Buffer(), _Clock()
    slicer = _slicer(buffer, clock)
    buffer.emitted = 1
    slicer.begin()
    clock.now += SLICE * 0.9
    slicer.waited(0.0)  # waited no time: the slice goes on
    clock.now += SLICE * 0.2
    slicer.checkpoint()
    assert clock.sleeps == [HANDOFF]
    clock.now += SLICE * 0.9
    slicer.waited(2 * HANDOFF)
    clock.now += SLICE * 0.2
    slicer.checkpoint()
    assert clock.sleeps == [HANDOFF]  # fresh after the wait: no hand-off yet


def test_every_turn_of_the_sidecars_loop_is_in_its_slice():
    # A turn that only polls (callbacks ready: select with timeout 0) ends the slice in a
    # hand-off once it has lasted its budget, whatever code filled it (an HTTP client's steps
    # between two awaits too); a turn that waits starts a fresh one.
    from outbox._runtime._slices import SlicedSelector

    buffer, clock = _Buffer(), _Clock()
    slicer = _slicer(buffer, clock)
    selector = SlicedSelector(slicer)
    try:
        buffer.emitted = 1
        slicer.begin()
        clock.now += SLICE / 2
        assert selector.select(0) == []
        assert clock.sleeps == []  # within the slice: no hand-off
        clock.now += SLICE
        selector.select(0)
        assert clock.sleeps == [HANDOFF]
        clock.now += SLICE * 0.9
        selector.select(0.001)  # a wait (nothing registered: 1 ms): the next slice starts here
        clock.now += SLICE * 0.2
        selector.select(0)
        assert clock.sleeps == [HANDOFF]
        slicer._contended = True  # the last hand-off found a handler computing without pause:
        clock.now += 2 * SLICE  # the slices' own hand-offs only (each costs a switch interval)
        selector.select(0)
        assert clock.sleeps == [HANDOFF]
    finally:
        selector.close()


def test_objects_that_grow_in_the_spills_overflow_while_the_sidecar_cannot_run_stay_bounded(tmp_path):
    """With a spill, once the queue's window is full (here of text) every object goes to the
    overflow, in memory until the sidecar writes it: the newest objects are there, not in the
    queue.  The emitter measures the newest object *held*, so objects that grow there while the
    sidecar cannot run hold beyond max_bytes UNLOOKED_MOST of them at most (before: all 3,000
    of 100 KB, 287 MiB, in the overflow of a buffer of 8 MiB, priced at the small estimate)."""
    transport = _LoopBlockingTransport()
    max_bytes = 8 * 1024 * 1024
    outbox = Outbox(transport, max_bytes=max_bytes, linger=0, spill_dir=tmp_path, close_at_exit=False)
    assert outbox.emit(run_event())  # a small object: the sidecar measures it, then sends it
    assert transport.entered.wait(10)  # and its loop is stuck from here on
    buf = parts.buffer(outbox)
    text = orjson.dumps({"eventType": "START", "x": "y" * 100_000}).decode()
    while not buf.holdings.overflow.active:  # the queue's window full of text: what follows overflows
        assert outbox.emit(text)
    pad = "x" * 100_000
    events = []
    for i in range(3_000):
        event = run_event(n=i)
        event["run"]["facets"]["pad"] = {"_producer": "p", "_schemaURL": "s", "x": pad}
        events.append(event)
    size = len(orjson.dumps(events[-1]))
    for event in events:
        outbox.emit(event)
    held_objects = [e for e in [*buf.holdings.queue, *buf.holdings.overflow.events] if isinstance(e, dict)]
    assert len(held_objects) <= max_bytes // size + UNLOOKED_MOST, outbox.stats()  # (3,000 before)
    assert buf.holdings.estimate >= size * 0.99, outbox.stats()
    transport.release.set()
    report = outbox.close(10)
    assert not report.timed_out
    assert report.delivered + sum(report.undelivered.values()) == report.emitted, report


def test_a_re_entrant_emit_leaves_a_due_measure_to_the_next_emitter():
    """A signal handler that emits on a thread interrupted inside the outbox (its lock held,
    the accounts half-changed) parks the event in the side queue and touches nothing else:
    not even the measure another emitter left due (its ``put`` returned, its measure not yet
    claimed).  Before, the re-entrant emit measured under the lock it re-entered: serialized
    on the signal's way, re-priced the queue and could shed under the interrupted code."""
    transport = _LoopBlockingTransport()
    outbox = Outbox(transport, max_bytes=8 * 1024 * 1024, linger=0, close_at_exit=False)
    assert outbox.emit(run_event())  # measured by the sidecar, then its loop is stuck
    assert transport.entered.wait(10)
    buf = parts.buffer(outbox)
    n = 0
    while buf.holdings.measure_here is not Measure.DUE:  # another thread's emit, between put and measure
        assert buf.put(run_event(n=n), 0)
        n += 1
    with buf.lock:  # the interrupted thread's hold
        queue, sizes, estimate = list(buf.holdings.queue), list(buf.holdings.sizes), buf.holdings.estimate
        with CallRecorder() as calls:
            assert outbox.emit(run_event(n=n))  # the signal handler's
        assert calls.serializing() == {}, calls.modules
        assert list(buf.holdings.queue) == queue
        assert list(buf.holdings.sizes) == sizes
        assert buf.holdings.estimate == estimate
        assert buf.holdings.measure_here is Measure.DUE
    measure_here(buf)  # the emitter that made it due measures, once the lock is free
    assert buf.holdings.measure_here is Measure.SIDECAR
    assert buf.holdings.exact_count == 1  # (the newest object, measured in its place)
    transport.release.set()
    report = outbox.close(10)
    assert not report.timed_out
    assert report.delivered == report.emitted, report


def test_objects_that_cannot_be_serialized_stop_at_twice_the_budget_while_the_sidecar_cannot_run():
    """An object the emitter cannot measure (it cannot be serialized: counted invalid_event when
    the sidecar takes it) teaches nothing: before, its failed measure counted as a look, and
    such objects of 100 KB queued up to max_events at the small estimate (5,000 held, the
    process grew 484 MiB for 8).  Now objects stop 2 x UNLOOKED_MOST past the last look that
    measured (``dropped_full``) until the sidecar looks again; every event is accounted for."""
    transport = _LoopBlockingTransport()
    outbox = Outbox(transport, max_bytes=8 * 1024 * 1024, linger=0, close_at_exit=False)
    assert outbox.emit(run_event())  # measured by the sidecar, then its loop is stuck
    assert transport.entered.wait(10)
    buf = parts.buffer(outbox)
    pad = "x" * 100_000
    for i in range(5_000):
        event = run_event(n=i)
        event["run"]["facets"]["pad"] = {"_producer": "p", "_schemaURL": "s", "x": pad}
        event["run"]["facets"]["bad"] = {1, 2}  # cannot be serialized
        outbox.emit(event)
    stats = outbox.stats()
    assert stats.queued_events <= 2 * UNLOOKED_MOST + 1, stats  # (5,000 before)
    assert stats.dropped["dropped_full"] >= 5_000 - 2 * UNLOOKED_MOST - 1, stats
    assert buf.holdings.measure_here is Measure.SIDECAR
    transport.release.set()
    report = outbox.close(10)
    assert not report.timed_out
    assert report.delivered + sum(report.undelivered.values()) == report.emitted == 5_001, report


def _overflowing(tmp_path: Any, **kw: Any) -> tuple[Outbox, _LoopBlockingTransport]:
    """An outbox with a spill whose sidecar cannot run (its loop stuck in a send), its queue's
    window full: every object from here on goes to the spill's overflow, in memory."""
    transport = _LoopBlockingTransport()
    outbox = Outbox(transport, linger=0, spill_dir=tmp_path, close_at_exit=False, **kw)
    assert outbox.emit(run_event())  # measured by the sidecar, then sent: its loop stuck from here
    assert transport.entered.wait(10)
    held = parts.buffer(outbox).holdings
    assert wait_until(lambda: held.measured)
    while not held.overflow.active:
        assert outbox.emit(run_event())
    return outbox, transport


def test_an_object_into_the_spills_overflow_takes_a_fast_path_of_two_calls(tmp_path):
    # During an outage longer than the memory window every emit goes to the overflow: it used
    # to take the slow path there, ten Python calls (the fits, the bytes, the look, the policy).
    outbox, transport = _overflowing(tmp_path / "spill", max_events=4_000)
    events = [run_event(n=i) for i in range(300)]
    with FunctionRecorder() as recorder:
        for event in events:
            outbox.emit(event)
    ours = {name: n for name, n in recorder.functions.items() if name.startswith("outbox.")}
    calls = sum(n for name, n in ours.items() if not name.endswith(("_woken", ".wake")))
    # emit, put, put_object, went_beyond_locked; and once in UNLOOKED_MOST, the emit that makes
    # a measure due (the sidecar cannot look) takes the slow path and measures the newest object.
    assert ours["outbox._spill._window.put_object"] >= len(events) - 1, ours
    assert ours.get("outbox._buffer._buffer._put_slow_locked", 0) <= 1, ours
    measure = sum(n for name, n in ours.items() if name.startswith("outbox._run."))  # (serializing)
    assert calls - measure <= 4 * len(events) + 80, "; ".join(f"{k} {n}" for k, n in sorted(ours.items()))
    ids, tail = {id(e) for e in events}, list(parts.buffer(outbox).holdings.overflow.events)[-300:]
    assert all(id(e) in ids or e.__class__ is SerializedEvent for e in tail)  # (one measured in place)
    transport.release.set()
    outbox.close(10)


def test_emit_into_the_spills_overflow_wakes_the_sidecar_for_a_burst_only(tmp_path):
    # A wake-up costs the emitting thread a slice of the sidecar's work (the woken sidecar takes
    # the CPU, and the GIL): waking it every 64 overflowed events was the spill's p99 in an
    # outage (`tail --spill`).  The interval's write keeps up with an outage; emit wakes the
    # sidecar once the overflow holds max_events/8 (a quarter of its room), and for the first.
    outbox, transport = _overflowing(tmp_path / "spill", max_events=4_000)
    window = parts.buffer(outbox).holdings.overflow
    assert window.wake_at == 500
    with FunctionRecorder() as recorder:
        for i in range(1_200):
            outbox.emit(run_event(n=i))
    wakes = recorder.functions.get("outbox._outbox._woken", 0)
    assert len(window.events) >= 1_200
    # the first overflowed event, every 500 more, and at most one due measure (UNLOOKED_MOST)
    assert 1 <= wakes <= 1_200 // 500 + 2, recorder.functions
    transport.release.set()
    outbox.close(10)


def test_emit_wakes_the_sidecar_before_an_overflow_bound_by_bytes_is_full(tmp_path):
    # The wake for a burst counts events (max_events/8), but the overflow may be bound by bytes
    # first: max_bytes 1 MiB, the default 10,000 events, events of about 1.4 KB fill the
    # overflow (half of max_bytes) at about 370, below 1,250.  Then no emit woke the sidecar
    # after the first, and everything beyond the overflow waits for the interval's write or is
    # dropped: at 8,000 events/s against a refused backend, 12,356 of 24,000 dropped_full where
    # the tree before (a wake every 64) dropped none.  Emit must wake the sidecar before the
    # overflow is full, whichever bound fills it.
    outbox, transport = _overflowing(tmp_path / "spill", max_bytes=1024 * 1024, policy="drop_newest")
    window = parts.buffer(outbox).holdings.overflow
    pad = "x" * 1_000
    events = [orjson.dumps({**run_event(n=i), "pad": pad}) for i in range(2_000)]
    with FunctionRecorder() as recorder:
        accepted = 0
        for event in events:
            if not outbox.emit(event):
                break
            accepted += 1
    wakes = recorder.functions.get("outbox._outbox._woken", 0)
    assert 0 < accepted < len(events), accepted  # the overflow filled, by bytes
    assert wakes >= 1, f"{accepted} emits filled the overflow ({len(window.events)} events) without a wake"
    transport.release.set()
    outbox.close(10)


def test_text_into_the_overflow_does_not_wake_the_sidecar_on_every_emit_after_large_objects(tmp_path):
    # The wake for a burst counts objects at the estimate (wake_at = (max_bytes/8) / estimate) and
    # text by its exact bytes.  After objects as large as an eighth of max_bytes the estimate
    # makes wake_at 1, and text (priced exactly, never at the estimate) was counted by that count
    # too: every text emit into the overflow woke the sidecar, as many wakes as emits, the cost
    # c5f42c5 removed (mixed.py smalltext_big_est against a refused backend, max_bytes 256 KiB:
    # 5,152 wakes for 5,154 accepted emits; the tree before c5f42c5: 61).  Text must wake the
    # sidecar by its bytes (an eighth of max_bytes) or the count of max_events/8, not per emit.
    transport = _LoopBlockingTransport()
    max_bytes = 1024 * 1024
    outbox = Outbox(
        transport,
        linger=0,
        spill_dir=tmp_path / "spill",
        close_at_exit=False,
        max_bytes=max_bytes,
        policy="drop_newest",
    )
    big = run_event(n=-1)
    big["run"]["facets"]["pad"] = {"_producer": "p", "_schemaURL": "s", "x": "x" * (max_bytes // 6)}
    assert outbox.emit(big)  # measured by the sidecar (the estimate a sixth of max_bytes), then stuck
    assert transport.entered.wait(10)
    held = parts.buffer(outbox).holdings
    window = held.overflow
    assert wait_until(lambda: held.measured and held.estimate >= max_bytes // 8)
    n = 0
    while not window.active:
        assert outbox.emit(orjson.dumps(run_event(n=n)))
        n += 1
    text = [orjson.dumps(run_event(n=n + i)) for i in range(300)]
    size = sum(len(t) for t in text)
    assert size < max_bytes // 8  # not an eighth of max_bytes in all: no wake by bytes is due
    with FunctionRecorder() as recorder:
        accepted = sum(outbox.emit(t) for t in text)
    wakes = recorder.functions.get("outbox._outbox._woken", 0)
    assert accepted == len(text)
    # the first overflowed event (if it is one of these), and one per eighth of max_bytes crossed
    assert wakes <= 2, f"{wakes} wakes for {accepted} text emits ({size} bytes), wake_at {window.wake_at}"
    transport.release.set()
    outbox.close(10)


@pytest.mark.parametrize("bound", ["events", "bytes", "look"])
def test_the_overflows_fast_path_admits_exactly_what_its_slow_path_would(tmp_path, bound):
    # The same emits, text among the objects, into an overflow bounded by count, by bytes, or
    # by the sidecar's last look: accepted, refused and held alike with the fast path and
    # with the slow path alone (``fast_room`` kept at 0).
    from outbox._spill._window import Window

    sizes = {"events": dict(max_events=3_000), "bytes": dict(max_events=50_000, max_bytes=600_000)}
    kw = dict(sizes.get(bound, {"max_events": 50_000}), policy="drop_newest")
    text = orjson.dumps(run_event(n=-1)).decode() + " " * 2_000

    def run(where: Any) -> tuple[Any, ...]:
        outbox, transport = _overflowing(where, **kw)
        held = parts.buffer(outbox).holdings
        accepted = [outbox.emit(text if i % 7 == 0 else run_event(n=i)) for i in range(3_000)]
        seen = (
            accepted,
            len(held.overflow.events),
            held.held_bytes_locked() + held.overflow.bytes(held.estimate),
        )
        assert held.held_bytes_locked() + held.overflow.bytes(held.estimate) <= held.max_bytes
        assert len(held.queue) + held.in_flight + len(held.overflow.events) <= held.max_events
        transport.release.set()
        outbox.close(10)
        return seen

    fast = run(tmp_path / "fast")
    recompute = Window.recompute

    def slow_only(self: Window, held: Any) -> None:
        recompute(self, held)
        self.fast_room = 0

    Window.recompute = slow_only  # type: ignore[method-assign]
    try:
        slow = run(tmp_path / "slow")
    finally:
        Window.recompute = recompute  # type: ignore[method-assign]
    assert fast == slow
    if bound != "look":  # (one emitting thread past the look measures, and goes on)
        assert 0 < sum(fast[0]) < 3_000  # (the bound was reached)


def test_a_closed_buffer_takes_no_object_into_the_spills_overflow(tmp_path):
    outbox, transport = _overflowing(tmp_path / "spill", max_events=4_000)
    assert outbox.emit(run_event())  # (the fast path into the overflow)
    buf = parts.buffer(outbox)
    with buf.lock:
        buf.close_locked()
    assert not outbox.emit(run_event())
    assert not outbox.emit(run_event())
    transport.release.set()
    outbox.close(10)


def test_a_grown_slice_shrinks_once_no_hand_off_was_slow_for_a_while_even_while_behind():
    """A few slow hand-offs (a collection in a handler, the machine taking the CPU) doubled the
    slice while a batch was in hand, and it stayed grown until the sidecar caught up, up to
    5 ms: at 20,000 events/s a handler waited up to 5 ms to start (the whole row's p99.9, #37).
    Once no hand-off was slow for CONTENDED_FOR, each halves it.  A handler that computes
    without pause makes every other hand-off slow (the one after a forced switch comes back at
    once): the slice still grows to LONGEST_SLICE, or the sidecar starves (the busy rows)."""
    buffer, clock = _Buffer(), _SlowClock(late=5e-3)
    slicer = _slicer(buffer, clock, behind_above=10)
    buffer.emitted = 1
    buffer.holdings.queue, buffer.holdings.in_flight = [None] * 3, 1_000  # a batch in hand
    slicer.begin()
    _work(slicer, buffer, clock, 1)
    assert slicer.budget == 2 * SLICE
    clock.late = 0.0  # the handler waits on its own I/O again: hand-offs come back at once
    assert _work(slicer, buffer, clock, 1) == [2 * SLICE]  # (a slow one just now)
    clock.now += CONTENDED_FOR
    assert _work(slicer, buffer, clock, 2) == [SLICE, SLICE]
    for i in range(24):  # a handler that computes without pause
        clock.late = 5e-3 if i % 2 == 0 else 0.0
        _work(slicer, buffer, clock, 1)
    assert slicer.budget == LONGEST_SLICE
    clock.late = 0.0
    clock.now += CONTENDED_FOR
    assert _work(slicer, buffer, clock, 12)[-1] == SLICE


def test_the_per_batch_steps_pause_only_while_no_handler_computes_without_pause():
    """``pause`` is a checkpoint for the per-batch steps beyond serializing, skipped while the
    last hand-off was slow: each hand-off then costs the sidecar a switch interval, and pausing
    in those steps too left it more often starved behind a busy handler (the busy rows)."""
    buffer, clock = _Buffer(), _SlowClock(late=5e-3)
    slicer = _slicer(buffer, clock, behind_above=10)
    buffer.emitted = 1
    slicer.begin()
    clock.now += SLICE * 1.01
    slicer.pause()
    assert len(clock.sleeps) == 1
    assert slicer.contended
    clock.now += slicer.budget * 1.01
    slicer.pause()  # contended: no hand-off
    assert len(clock.sleeps) == 1
    slicer.checkpoint()  # (serializing hands over all the same)
    assert len(clock.sleeps) == 2


def test_the_sidecars_per_batch_steps_pass_checkpoints_in_pieces():
    """Past serialization, a batch went into the backlog, was taken into a lane and settled,
    each in one step with no checkpoint: hundreds of microseconds with the GIL held, whatever
    the slice (the whole invocation's tail, #37).  Now the backlog grows by at most a piece
    between two pauses, and taking a lane and settling it pause every 32 keys."""
    outbox, transport = _stuck(max_batch_events=1_000)
    worker = parts.worker(outbox)
    assert worker is not None
    grew: list[int] = []
    seen = Counter[int]()

    class Counting(Slicer):
        last = 0

        def note(self) -> None:
            held = len(worker.backlog)
            grew.append(held - self.last)
            self.last = held
            seen[threading.get_ident()] += 1

        def pause(self) -> None:  # (recorded whether or not the last hand-off was slow)
            self.note()
            super().pause()

        def checkpoint(self) -> None:
            self.note()
            super().checkpoint()

    worker.slicer = worker.intake.slicer = Counting(parts.buffer(outbox))
    worker.backlog.keys.pause = worker.slicer.pause
    job = LineageJob("ns", "job")
    for _ in range(1_500):  # 3,000 events of 1,500 keys (runs)
        with outbox.run(job):
            pass
    transport.gate.set()
    report = outbox.close(30)
    assert report.delivered == 3_000
    assert max(grew) <= 64
    assert threading.get_ident() not in seen
    # A checkpoint per event serialized, and a pause every 32 keys taken into a lane, and settled.
    assert sum(seen.values()) >= 3_000 + 2 * 1_500 // 32


def test_a_settled_lane_is_let_go_in_pieces_between_checkpoints():
    """A settled lane held the last references to a batch's events and bodies: freeing them
    whole held the GIL for hundreds of microseconds.  They go in pieces, a checkpoint before
    each; a lane whose list something else still holds is left to it, untouched."""
    from outbox._worker._dispatch import Lane

    outbox, _ = _stuck()
    worker = parts.worker(outbox)
    assert worker is not None

    class Item:  # (an event's stand-in that can be watched)
        pass

    alive: weakref.WeakSet[Item] = weakref.WeakSet()
    left: list[int] = []

    class Counting(Slicer):
        def checkpoint(self) -> None:
            left.append(len(alive))

    worker.slicer = Counting(parts.buffer(outbox))
    lane = Lane([Item() for _ in range(1_000)], 0.0)
    alive.update(lane.items)
    worker._free(lane)
    assert lane.items == []
    assert len(alive) == 0
    assert left == list(range(1_000, 0, -64))
    shared = [Item() for _ in range(100)]
    worker._free(Lane(shared, 0.0))
    assert len(shared) == 100
    outbox.close(0)


def test_a_grown_slice_shrinks_as_the_sidecar_waits_once_caught_up():
    """A slice grown to LONGEST_SLICE reaches a hand-off (where it used to shrink) only after
    that long a period of work; a sidecar that has caught up works in shorter periods and
    waits between them, so its slice stayed at 5 ms, and every handler that wanted the GIL
    during its work waited up to that long (the whole row's p99.9 at 20,000 events/s).  Each
    wait that lasted a hand-off now halves it while nothing is behind; while behind, it stays."""
    buffer, clock = _Buffer(), _SlowClock(late=5e-3)
    slicer = _slicer(buffer, clock, behind_above=10)
    buffer.emitted = 1
    buffer.holdings.queue = [None] * 50
    slicer.begin()
    _work(slicer, buffer, clock, 12)
    assert slicer.budget == LONGEST_SLICE
    slicer.waited(HANDOFF)  # behind still: a wait is no reason to shrink
    assert slicer.budget == LONGEST_SLICE
    buffer.holdings.queue = []  # caught up: periods of 1 ms of work, then a wait
    budgets = []
    for _ in range(10):
        clock.now += 1e-3
        slicer.checkpoint()  # (within the budget: no hand-off)
        slicer.waited(HANDOFF / 2)  # too short to count
        slicer.waited(HANDOFF)
        budgets.append(slicer.budget)
    assert budgets[0] == LONGEST_SLICE / 2
    assert budgets[-1] == SLICE
