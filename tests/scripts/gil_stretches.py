"""What a handler waits for while the sidecar ships (#37 item 3): the whole-invocation scenario
of ``tail --rows whole`` (WORK_US µs of computing at RATE invocations a second, the run helpers, a
healthy local sink), in one process, with two records kept meanwhile:

- the sidecar's *stretches*: its thread CPU between two calls of its slices' checkpoint (or of
  its loop's ``select``), by the two call sites.  A handler that wants the GIL gets it at a
  checkpoint or a wait; a stretch longer than a slice is a handler's wait.  Thread CPU includes
  system calls that let go of the GIL (a ``send``'s copy), so a stretch that holds one is shorter
  for a handler than it prints.
- each wait of a handler past ``LONG_US`` to start once due, put down to what the sidecar ran
  when it was due: the loop's callback (a task by its coroutine), a collection, or the loop
  between callbacks.

The records cost the sidecar a little: the figures are for finding where the time goes, not for
comparing with the tail benchmark's.  Run from outside any checkout with a tree on PYTHONPATH:

    PYTHONPATH=/tmp/before python tests/scripts/gil_stretches.py [WORK_US [RATE [INVOCATIONS]]]
"""

import asyncio.events
import bisect
import collections
import gc
import os
import selectors
import sys
import threading
import time

from opentelemetry.context import attach, detach

from outbox import LineageJob, Outbox, s3_dataset
from outbox._runtime import _slices
from outbox.tools.benchmarks import throughput
from outbox.tools.benchmarks._tail_child import _no_timer_slack, trace_contexts

work_us = float(sys.argv[1]) if len(sys.argv) > 1 else 50.0
rate = float(sys.argv[2]) if len(sys.argv) > 2 else 5000.0
invocations = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
LONG_US = 80
clock, cpu = time.perf_counter_ns, time.thread_time_ns
stretches: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
last = {"cpu": None, "site": ""}
ran_since: list[str] = []  # the loop's callbacks begun since the last checkpoint
long_by_callbacks: dict[tuple[str, ...], list[int]] = collections.defaultdict(list)
callbacks: list[tuple[int, int, str]] = []  # (start, end, name), wall clock
collections_: list[tuple[int, int, int]] = []  # (start, end, generation), wall clock


def _site(depth: int) -> str:
    frame = sys._getframe(depth)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _mark(site: str) -> None:
    now = cpu()
    if last["cpu"] is not None:
        stretches[(last["site"], site)].append(now - last["cpu"])
        if now - last["cpu"] > LONG_US * 1e3:
            long_by_callbacks[tuple(ran_since)].append(now - last["cpu"])
    ran_since.clear()


checkpoint = _slices.Slicer.checkpoint


def _checkpoint(self: _slices.Slicer) -> None:
    site = f"{_site(2)} < {_site(3)}"
    _mark(site)
    checkpoint(self)
    last["cpu"], last["site"] = cpu(), site


select = selectors.DefaultSelector.select


def _select(self: selectors.DefaultSelector, timeout: float | None = None) -> list:
    if not isinstance(self, _slices.SlicedSelector):
        return select(self, timeout)
    _mark("select")
    ready = select(self, timeout)
    last["cpu"], last["site"] = cpu(), "select"
    return ready


run_handle = asyncio.events.Handle._run


def _run(self: asyncio.events.Handle) -> None:
    began = clock()
    callback = self._callback
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        name = "task " + getattr(owner.get_coro(), "__qualname__", "?")
    else:
        name = getattr(callback, "__qualname__", None) or type(callback).__name__
    ran_since.append(name)
    try:
        run_handle(self)
    finally:
        callbacks.append((began, clock(), name))


collecting = {}


def _gc(phase: str, info: dict) -> None:
    if threading.current_thread().name != "outbox-sidecar":
        return
    if phase == "start":
        collecting["at"] = clock()
    else:
        collections_.append((collecting.get("at", clock()), clock(), info["generation"]))


def _percentile(values: list[int], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] / 1e3 if values else 0.0


def main() -> None:
    _no_timer_slack()
    _slices.Slicer.checkpoint = _checkpoint
    selectors.DefaultSelector.select = _select
    asyncio.events.Handle._run = _run
    gc.callbacks.append(_gc)
    with throughput.Server(*throughput.SINK) as sink:
        os.environ["OPENLINEAGE_URL"] = sink
        outbox = Outbox.from_env()
        job = LineageJob("vast-dataengine://my-tenant", "lineage-demo.lineagefn")
        with outbox.run(job, inputs=[s3_dataset("bench-src", "warm-up.csv")]):
            pass
        outbox.flush(30)
        contexts = trace_contexts(invocations, "t0")
        keys = [f"t0/{i}.csv" for i in range(invocations)]
        period, work = int(1e9 / rate), int(work_us * 1e3)
        times: list[tuple[int, int, int]] = []  # (due, started, ended)
        stretches.clear()
        long_by_callbacks.clear()
        callbacks.clear()
        collections_.clear()
        slot = due = clock()
        for i in range(invocations):
            token = attach(contexts[i])
            started = clock()
            until = started + work
            while clock() < until:
                pass
            with outbox.run(job, inputs=[s3_dataset("bench-src", keys[i])]):
                pass
            ended = clock()
            detach(token)
            times.append((min(due, started), started, ended))
            slot += period
            pause = slot - clock()
            due = slot if pause > 0 else 1 << 62
            if pause > 0:
                time.sleep(pause / 1e9)
        kept = {key: list(values) for key, values in stretches.items()}
        by_callbacks = {key: list(values) for key, values in long_by_callbacks.items()}
        ran, collected = sorted(callbacks), list(collections_)
        outbox.close(10)
    _report(times, kept, ran, collected)
    print(f"stretches past {LONG_US} µs by the callbacks begun in them (ms of thread CPU, count):")
    for names, values in sorted(by_callbacks.items(), key=lambda kv: -sum(kv[1]))[:12]:
        print(f"  {sum(values) / 1e6:6.1f} {len(values):5d}  {' + '.join(names) or '(within one callback)'}")


def _report(times: list, kept: dict, ran: list, collected: list) -> None:
    whole = [ended - due for due, _, ended in times]
    waits = [started - due for due, started, _ in times]
    print(f"{len(times):,} invocations of {work_us:g} µs at {rate:,.0f}/s (µs)")
    print(
        f"  whole invocation p50 {_percentile(whole, 0.5):.1f} p99 {_percentile(whole, 0.99):.1f}"
        f" p99.9 {_percentile(whole, 0.999):.1f}"
    )
    print(
        f"  wait to start      p50 {_percentile(waits, 0.5):.1f} p99 {_percentile(waits, 0.99):.1f}"
        f" p99.9 {_percentile(waits, 0.999):.1f}"
    )
    every = [value for values in kept.values() for value in values]
    long = [value for value in every if value > LONG_US * 1e3]
    print(
        f"sidecar stretches: {len(every):,}, p99 {_percentile(every, 0.99):.1f}; "
        f"{len(long)} past {LONG_US} µs, {sum(long) / 1e6:.1f} ms of thread CPU in them"
    )
    print(f"  past {LONG_US}   count    p50     p99     max  from -> to")
    rows = sorted(kept.items(), key=lambda kv: -sum(v > LONG_US * 1e3 for v in kv[1]))
    for (start, end), values in rows[:15]:
        n = sum(value > LONG_US * 1e3 for value in values)
        print(
            f"  {n:7d} {len(values):7d} {_percentile(values, 0.5):6.0f} {_percentile(values, 0.99):7.0f}"
            f" {_percentile(values, 1):7.0f}  {start} -> {end}"
        )
    starts = [began for began, _, _ in ran]
    blamed: collections.Counter[str] = collections.Counter()
    for due, started, _ in times:
        if started - due <= LONG_US * 1e3:
            continue
        if any(began <= started and end >= due for began, end, _ in collected):
            gen = max(g for began, end, g in collected if began <= started and end >= due)
            blamed[f"a collection (generation {gen})"] += 1
            continue
        i = bisect.bisect_right(starts, due) - 1
        blamed[ran[i][2] if i >= 0 and ran[i][1] >= due else "the loop, between callbacks"] += 1
    print(f"waits past {LONG_US} µs, by what the sidecar ran when the invocation was due:")
    for name, n in blamed.most_common(12):
        print(f"  {n:6d}  {name}")


main()
