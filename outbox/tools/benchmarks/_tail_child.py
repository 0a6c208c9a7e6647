"""One row of ``python -m outbox.tools.benchmarks tail``, in a process of its own.

Run by path (``python _tail_child.py SPEC_JSON``) so that ``PYTHONPATH`` can put another
release's ``outbox`` first: it uses only the public API every release has had
(``Outbox.from_env``, ``emit``, ``run``, ``LineageJob``, ``s3_dataset``, ``stats``, ``close``).

A handler thread runs ``invocations`` invocations; each one's lineage is timed:

* ``objects``: two pre-built openlineage-python ``RunEvent`` objects (START, COMPLETE) emitted;
* ``dicts``: the same events as dicts, emitted;
* ``helpers``: ``with outbox.run(job, inputs=[s3_dataset(...)])``, building included, as a
  DataEngine handler runs it: in a span of its own trace (entered and left outside the timed
  part: the runtime's work), once 5,000 traces have run (a container that has served a while);
* ``off``: nothing (the machine's own floor: the timer, the interpreter, the scheduler);
* ``floor`` (with ``objects`` or ``dicts``): the same events handed to :class:`MinimalEmitter`
  instead of an outbox: the least a pure-Python ``emit`` with a bound can do.

Between invocations the handler does its own work: ``io`` sleeps ``work_us`` (a handler
waiting on storage), ``cpu`` computes for ``work_us`` (it never lets go of the GIL).  The
``mode`` changes what is timed: ``whole``, the handler's computing and its lineage together,
invocations due at ``rate`` a second (each in a span of its own trace, lineage on or off, as a
runtime runs it; timed from when it was due, if it waited for that: a GIL held by the sidecar
then delays it); ``busy``, computing and lineage back to back, never a
pause (what is dropped is the figure); ``full``, two emits into an outbox whose buffer is empty
and into one full of an outage's backlog, in turn (:func:`full_buffer`).  A helpers
invocation's object key is made before the clock runs: the trigger gives it to a handler.
Prints one JSON object: the sorted per-invocation samples' percentiles and the outbox's counts.
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import threading
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox import Outbox

_LATE = 1 << 62  # (an invocation that starts late is timed from when it starts)


def percentiles(samples: list[int]) -> dict[str, float]:
    ordered = sorted(samples)
    n = len(ordered)

    def rank(p: float) -> float:  # nearest rank, in microseconds
        return ordered[min(n - 1, max(0, math.ceil(p / 100 * n) - 1))] / 1000

    return {"p50": rank(50), "p99": rank(99), "p99.9": rank(99.9), "max": ordered[-1] / 1000}


class MinimalEmitter:
    """The least a pure-Python ``emit`` that keeps a bound can do: check the event's class,
    take a lock (re-entrant, as a signal handler may emit), append to a deque of at most
    ``room`` events (beyond it the oldest goes, in C).  No accounting, no policy, no sidecar:
    a floor, not an outbox.  (Its memory is reused once full, as an outbox's is while its
    sidecar ships.)"""

    def __init__(self, classes: set[type], room: int) -> None:
        self.classes = classes
        self.queue: deque[Any] = deque(maxlen=room)
        self.lock = threading.RLock()
        self.beside: Outbox | None = None

    def emit(self, event: Any) -> bool:
        if event.__class__ not in self.classes:
            raise TypeError(f"not an event: {event.__class__.__name__}")
        lock = self.lock
        if lock._is_owned():  # type: ignore[attr-defined]
            return False
        lock.acquire()
        try:
            self.queue.append(event)
        finally:
            lock.release()
        return True


def build_objects(count: int, tag: str) -> list[tuple[Any, Any]]:
    from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState

    job = Job(namespace="vast-dataengine://my-tenant", name="lineage-demo.lineagefn")
    pairs = []
    for i in range(count):
        run = Run(runId=str(uuid.uuid4()))
        inputs = [InputDataset(namespace="s3://bench-src", name=f"{tag}/{i}.csv")]
        now = "2026-12-03T10:00:00.000000+00:00"
        pairs.append(
            tuple(
                RunEvent(
                    eventType=state,
                    eventTime=now,
                    run=run,
                    job=job,
                    producer="https://example.com/lineage-outbox/benchmarks",
                    inputs=inputs,
                )
                for state in (RunState.START, RunState.COMPLETE)
            )
        )
    return pairs  # type: ignore[return-value]


def build_dicts(count: int, tag: str) -> list[tuple[Any, Any]]:
    pairs = []
    for i in range(count):
        run = {"runId": str(uuid.uuid4()), "facets": {}}
        inputs = [{"namespace": "s3://bench-src", "name": f"{tag}/{i}.csv", "facets": {}}]
        pairs.append(
            tuple(
                {
                    "eventType": state,
                    "eventTime": "2026-12-03T10:00:00.000000+00:00",
                    "run": run,
                    "job": {"namespace": "vast-dataengine://my-tenant", "name": "lineage-demo.lineagefn"},
                    "producer": "https://example.com/lineage-outbox/benchmarks",
                    "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
                    "inputs": inputs,
                    "outputs": [],
                }
                for state in ("START", "COMPLETE")
            )
        )
    return pairs  # type: ignore[return-value]


def main() -> None:
    spec = json.loads(sys.argv[1])
    os.environ.update(spec.get("env", {}))
    if spec.get("mode") == "full":
        print(json.dumps(full_buffer(spec)))
        return
    if spec.get("mode") == "whole":
        _no_timer_slack()
    kit = Kit(spec)
    gc.collect()
    workers = [threading.Thread(target=handler, args=(kit, t)) for t in range(kit.threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.monotonic() - started
    figures = _figures(kit.results, kit.firsts, elapsed, kit.outbox, spec.get("close_timeout", 2.0))
    if kit.whole:
        figures["waited"] = percentiles([w for r in kit.waits for w in r])
    print(json.dumps(figures))


def _no_timer_slack() -> None:
    """Sleeps that end when due (Linux adds 50 µs of timer slack to an ordinary thread's
    sleep; none under SCHED_FIFO): a whole invocation is timed from when it was due, in both
    rows.  Inherited by the threads started after it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK, 1 ns
    except (OSError, AttributeError):  # not Linux: its sleeps as they are
        pass


class Kit:
    """What a row's handler threads share: the events (or spans), the outbox or the minimal
    emitter, the mode, and where the samples go."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.kind, self.threads = spec["kind"], spec["threads"]
        self.warmup = spec.get("warmup", 10)
        self.per_thread = spec["invocations"] + self.warmup
        self.lineage = [_pairs(self.kind, self.per_thread, f"t{t}") for t in range(self.threads)]
        self.outbox, self.target = _target(spec, self.kind, self.lineage, self.per_thread)
        mode = spec.get("mode", "lineage")
        # ``whole``: the handler's own work (computing) is inside the timed part, and invocations
        # start at ``rate`` a second (sleeping between them); ``busy``: back to back, never a pause.
        self.whole, self.busy = mode == "whole", mode == "busy"
        self.period_ns = int(1e9 / spec["rate"]) if self.whole else 0
        self.work_ns, self.work_s = int(spec["work_us"] * 1000), spec["work_us"] / 1e6
        self.cpu_work = spec["work"] == "cpu"
        self.keys: list[list[str]] = []
        # Each invocation's span (the helpers' rows, and both whole rows: the runtime enters one
        # whether lineage is on or off), entered and left outside the timed part.
        self.spans = self.lineage if self.kind == "helpers" else [[] for _ in range(self.threads)]
        self.attach: Any = None
        self.detach: Any = None
        if self.whole and self.kind != "helpers":
            from opentelemetry.context import attach, detach

            self.spans = [trace_contexts(self.per_thread, f"t{t}") for t in range(self.threads)]
            self.attach, self.detach = attach, detach
        if self.kind == "helpers":
            self.job, self.attach, self.detach, self.s3_dataset = _helpers_kit(self.outbox)
            # The objects' keys, as a handler gets them from its trigger (not lineage's work).
            self.keys = [[f"t{t}/{i}.csv" for i in range(self.per_thread)] for t in range(self.threads)]
            if (self.whole or self.busy) and self.outbox is not None:
                # The sidecar started and its connection made before the clock runs (its imports
                # and first request are a process's start, not the invocations').
                with self.outbox.run(self.job, inputs=[self.s3_dataset("bench-src", "warm-up.csv")]):
                    pass
                self.outbox.flush(30)
        self.barrier = threading.Barrier(self.threads)
        self.results: list[list[int]] = [[] for _ in range(self.threads)]
        self.firsts: list[int] = [0] * self.threads
        #: ``whole``: how long each invocation waited to start once due (its thread waiting for
        #: the GIL another thread held), a part of its sample.
        self.waits: list[list[int]] = [[] for _ in range(self.threads)]


def handler(kit: Kit, t: int) -> None:
    """One handler thread's invocations, each timed (see the module's docstring)."""
    kind, whole, busy, cpu_work, warmup = kit.kind, kit.whole, kit.busy, kit.cpu_work, kit.warmup
    pairs, samples, outbox, waits = kit.lineage[t], kit.results[t], kit.outbox, kit.waits[t]
    emit = kit.target  # (a local: the call costs what a handler's would)
    spans = kit.spans[t]
    if kind == "helpers":
        job, s3_dataset, mine = kit.job, kit.s3_dataset, kit.keys[t]
    attach, detach = kit.attach, kit.detach
    clock, work_ns, period_ns = time.perf_counter_ns, kit.work_ns, kit.period_ns
    kit.barrier.wait()
    slot = due = clock()
    for i in range(kit.per_thread):
        # The runtime's span for this invocation, entered before the handler runs and left
        # after (outside the timed part: its work, whether lineage is on or off).
        token = attach(spans[i]) if spans else None
        t0 = started = clock()
        if whole:
            # Timed from when it was due, if it waited for that: an invocation that cannot start
            # because another thread (the sidecar) holds the GIL then is slower by that wait.
            t0 = min(started, due)
        if whole or busy:
            until = started + work_ns
            while clock() < until:
                pass
        if kind == "objects" or kind == "dicts":
            start, complete = pairs[i]
            if not whole:
                t0 = clock()
            emit(start)
            emit(complete)
            t1 = clock()
        elif kind == "helpers":
            if not whole:
                t0 = clock()
            with outbox.run(job, inputs=[s3_dataset("bench-src", mine[i])]):  # type: ignore[union-attr]
                pass
            t1 = clock()
        else:
            if not whole:
                t0 = clock()
            t1 = clock()
        if token is not None:
            detach(token)
        if i == 0:
            kit.firsts[t] = t1 - t0
        if i >= warmup:
            samples.append(t1 - t0)
            waits.append(started - t0)  # (whole: the wait to start once due; reported there only)
        if busy:
            continue
        if whole:
            slot += period_ns
            due = _sleep_until(slot)
        elif cpu_work:
            until = t1 + work_ns
            while clock() < until:
                pass
        else:
            time.sleep(kit.work_s)


def _sleep_until(slot: int) -> int:
    """Sleep until ``slot`` (a ``perf_counter_ns`` value).  Returns when the next invocation is
    due: ``slot``, or ``_LATE`` if it is late already (it starts now, and is timed from then)."""
    pause = slot - time.perf_counter_ns()
    if pause <= 0:
        return _LATE
    time.sleep(pause / 1e9)
    return slot


def full_buffer(spec: dict[str, Any]) -> dict[str, Any]:
    """Two emits per invocation against a refused backend, into two outboxes of the same
    process, taken in turn invocation by invocation: one whose buffer was empty when the
    invocations began, one full of an outage's backlog (``fill``: ``full``, the policy evicting or
    refusing at every emit; ``nearly``: filled to what the timed invocations will still fit).
    In turn, so that the machine's drift (tens of percent within minutes here) falls on both
    alike, where an empty phase then a full one set it against the ratio.  Each event is the
    outbox's alone once emitted, as a handler's is (built, emitted, forgotten): an eviction
    frees the oldest on the emitter's thread, as it would in a user's process, and is timed
    with it."""
    kind, invocations = spec["kind"], spec["invocations"]
    warmup = spec.get("warmup", 10)
    per_box = invocations + warmup
    pairs: list[Any] = _pairs(kind, 2 * per_box, "t0")
    empty_box, full_box = _outbox(kind), _outbox(kind)
    assert empty_box is not None
    assert full_box is not None
    max_events = int(os.environ.get("OUTBOX_MAX_EVENTS", "10000"))
    stats = full_box.stats()
    held = stats.queued_events + stats.in_flight
    room = max_events + 1 - held if spec["fill"] == "full" else max_events - held - 2 * per_box - 64
    fill = _pairs(kind, max(0, room) // 2 + 1, "f")
    for i in range(max(0, room)):
        full_box.emit(fill[i // 2][i & 1])
    del fill
    time.sleep(0.3)  # the sidecars take what they take (a window), retry, and wait
    stats = full_box.stats()
    held_before = stats.queued_events + stats.in_flight
    clock = time.perf_counter_ns
    work_s = spec["work_us"] / 1e6
    samples: tuple[list[int], list[int]] = ([], [])
    emits = (empty_box.emit, full_box.emit)
    gc.collect()
    for i in range(2 * per_box):
        emit = emits[i & 1]
        start, complete = pairs[i]
        pairs[i] = None  # (the events' last references are the outbox's)
        t0 = clock()
        emit(start)
        emit(complete)
        t1 = clock()
        del start, complete
        if i >= 2 * warmup:
            samples[i & 1].append(t1 - t0)
        time.sleep(work_s)
    stats = full_box.stats()
    out: dict[str, Any] = {
        "empty": percentiles(samples[0]),
        "full": percentiles(samples[1]),
        "held_before": held_before,
        "held_after": stats.queued_events + stats.in_flight,
        "dropped_while_full": dict(stats.dropped),
    }
    empty_box.close(0.1)
    full_box.close(0.1)
    return out


def _target(
    spec: dict[str, Any], kind: str, lineage: list[list[tuple[Any, Any]]], per_thread: int
) -> tuple[Outbox | None, Any]:
    """The outbox, and what the handler calls: its ``emit``, or in the floor's row the minimal
    emitter's (given the same events)."""
    if spec.get("floor", False):
        # An outbox beside it all the same, its sidecar started (one event) and idle: the
        # process is the idle row's, only the call differs.
        floor = MinimalEmitter({lineage[0][0][0].__class__}, 1024)
        floor.beside = _outbox(kind)
        floor.beside.emit(lineage[0][0][0])  # type: ignore[union-attr]
        return None, floor.emit
    outbox = _outbox(kind)
    return outbox, (outbox.emit if outbox is not None else None)


def _outbox(kind: str) -> Outbox | None:
    """The outbox this environment configures (none for ``off``, the handler alone)."""
    if kind == "off":
        return None
    from outbox import Outbox as _Outbox  # imported only when measured: "off" is the handler alone

    return _Outbox.from_env()


def _pairs(kind: str, count: int, tag: str) -> list[tuple[Any, Any]]:
    """One thread's START and COMPLETE events, built before measuring (none for the kinds
    that build their own)."""
    if kind == "objects":
        return build_objects(count, tag)
    if kind == "dicts":
        return build_dicts(count, tag)
    if kind == "helpers":
        return trace_contexts(count, tag)
    return []


def trace_contexts(count: int, tag: str) -> list[Any]:
    """``count`` OpenTelemetry contexts, each current span in a trace of its own."""
    from opentelemetry import trace

    first = (int(tag[1:]) + 1) << 100 if tag[1:].isdigit() else 1 << 110
    spans = [trace.NonRecordingSpan(trace.SpanContext(first + i, 1, is_remote=False)) for i in range(count)]
    return [trace.set_span_in_context(span) for span in spans]


def _helpers_kit(outbox: Any) -> tuple[Any, Any, Any, Any]:
    """The job, the runtime's span calls and ``s3_dataset``, once 5,000 traces have run."""
    from opentelemetry.context import attach, detach

    from outbox import LineageJob, s3_dataset

    job = LineageJob("vast-dataengine://my-tenant", "lineage-demo.lineagefn")
    traces_before(outbox, job, 5000)
    return job, attach, detach, s3_dataset


def traces_before(outbox: Any, job: Any, count: int) -> None:
    """Runs made (not entered: no events) in ``count`` traces, before the timed invocations."""
    from opentelemetry import context

    for ctx in trace_contexts(count, "before"):
        token = context.attach(ctx)
        outbox.run(job)
        context.detach(token)


def _figures(
    results: list[list[int]], firsts: list[int], elapsed: float, outbox: Any, close_timeout: float
) -> dict[str, Any]:
    """The invocations' percentiles, and the outbox's counts and close report."""
    out: dict[str, Any] = {
        **percentiles([s for r in results for s in r]),
        "first": max(firsts) / 1000,
        "seconds": elapsed,
        "samples": sum(len(r) for r in results),
    }
    if outbox is not None:
        stats = outbox.stats()
        out["delivered_while_measuring"] = stats.delivered
        out["emitted"] = stats.emitted
        report = outbox.close(close_timeout)
        out["delivered"] = report.delivered
        out["lost"] = dict(report.undelivered)
    return out


if __name__ == "__main__":
    main()
