"""``python -m outbox.tools.benchmarks --only spill``: how fast the sidecar writes the spill, what
an event costs on disk, and how fast a successor drains a spill directory.

Writing: runs of the run helpers (START + COMPLETE, one input each) are emitted into an outbox
whose backend refuses every connection, with a spill directory: every event stays held, and the
sidecar writes each one to the spill.  Prints the events written per second (from the first emit
to the last written) and the bytes on disk per event, beside the event's JSON size.

Draining: the same events, held in an outbox's memory while the backend is away, are delivered
once it is back (to a does-no-work HTTP server in a process of its own); and, left in a spill
directory by an outbox that closed while the backend was away, are delivered by the next outbox
started with the directory (its construction, which adopts them, included).  Prints both rates
and their ratio, measured in one run, interleaved.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import tempfile
import time
from typing import Any

from outbox import Outbox, s3_dataset
from outbox._toolkit import Run, serialize
from outbox.tools.benchmarks.throughput import NULL_SERVER, Server, _emit_runs, _job
from outbox.transports import HttpTransport

__all__ = ["bench_drain", "bench_spill", "report_spill"]


def _refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def bench_spill(runs: int) -> dict[str, Any]:
    """One measurement: ``2 x runs`` events written to a fresh spill directory."""
    directory = tempfile.mkdtemp(prefix="outbox-bench-spill-")
    try:
        outbox = Outbox(
            HttpTransport(_refused_url(), timeout=1.0),
            max_events=2 * runs,
            max_bytes=2**31,
            spill_dir=directory,
            backoff_base=1.0,
            shutdown_timeout=0.0,
            close_at_exit=False,
        )
        events = 2 * runs
        started = time.perf_counter()
        _emit_runs(outbox, _job(), runs)
        deadline = time.monotonic() + 300
        while outbox.stats().spill["written"] < events and time.monotonic() < deadline:
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
        spill = outbox.stats().spill
        outbox.close(0)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "events": events,
        "written": spill["written"],
        "per_s": spill["written"] / elapsed,
        "disk_bytes_per_event": spill["spilled_bytes"] / max(1, spill["written"]),
        "json_bytes_per_event": _json_bytes(runs) / events,
    }


class _Collector:
    """An emitter that keeps what the run helpers hand it."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, event: Any) -> bool:
        self.events.append(event)
        return True

    async def emit_async(self, event: Any) -> bool:
        return self.emit(event)


def _json_bytes(runs: int) -> int:
    """The JSON the same runs make, serialized as the sidecar serializes them (the buffer
    cannot say: with a spill, most of them are on disk, out of its accounts)."""
    collector = _Collector()
    job = _job()
    for i in range(runs):
        with Run(collector, job, inputs=[s3_dataset("bench-src", f"in/{i}.csv")]):
            pass
    return sum(len(serialize(event).body) for event in collector.events)


def _drainer(url: str, runs: int, directory: str | None) -> Outbox:
    return Outbox(
        HttpTransport(url, mode="batch", timeout=5.0),
        max_events=4 * runs,
        max_bytes=2**31,
        spill_dir=directory,
        backoff_base=0.01,
        backoff_cap=0.01,
        shutdown_timeout=0.5,
        close_at_exit=False,
    )


def bench_drain(runs: int, from_disk: bool) -> dict[str, Any]:
    """Events/s delivered of ``2 x runs`` events held while the backend was away (its process
    stopped): from memory (from the moment it is back), or from a spill directory (from the
    start of the outbox that adopts them)."""
    directory = tempfile.mkdtemp(prefix="outbox-bench-drain-") if from_disk else None
    try:
        server = Server(*NULL_SERVER)
        with server as url:
            holder = _drainer(url, runs, directory)
            os.kill(server.process.pid, signal.SIGSTOP)  # away: requests wait for it
            _emit_runs(holder, _job(), runs)
            if from_disk:
                deadline = time.monotonic() + 300
                while holder.stats().spill["written"] < 2 * runs and time.monotonic() < deadline:
                    time.sleep(0.01)
                left = holder.close(0).undelivered.get("spilled_at_close", 0)
                assert left == 2 * runs, holder.stats()
                os.kill(server.process.pid, signal.SIGCONT)
                started = time.perf_counter()
                holder = _drainer(url, runs, directory)
            else:
                os.kill(server.process.pid, signal.SIGCONT)
                started = time.perf_counter()
            report = holder.close(300)
            elapsed = time.perf_counter() - started
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
    assert report.delivered == 2 * runs, report
    return {"events": 2 * runs, "per_s": report.delivered / elapsed}


def report_spill(runs: int = 50_000, repeats: int = 3, drain_runs: int = 30_000) -> dict[str, Any]:
    print("\nThe spill: run helpers (START + COMPLETE) against a refused backend, every event written")
    rows = [bench_spill(runs) for _ in range(repeats)]
    per_s = statistics.median(r["per_s"] for r in rows)
    disk = statistics.median(r["disk_bytes_per_event"] for r in rows)
    json_size = statistics.median(r["json_bytes_per_event"] for r in rows)
    print(
        f"  {rows[0]['events']:,} events, median of {repeats}: {per_s:,.0f} events/s written; "
        f"{disk:.0f} bytes on disk per event ({json_size:.0f} of JSON)"
    )
    print(f"Draining {2 * drain_runs:,} events held while the backend was away (does-no-work server)")
    memory, disk_rates = [], []
    for _ in range(repeats):  # interleaved, so both see the same machine
        memory.append(bench_drain(drain_runs, from_disk=False)["per_s"])
        disk_rates.append(bench_drain(drain_runs, from_disk=True)["per_s"])
    from_memory, from_disk = statistics.median(memory), statistics.median(disk_rates)
    print(
        f"  median of {repeats}: {from_memory:,.0f} events/s from memory, {from_disk:,.0f} events/s from a "
        f"spill directory (its adoption included): {from_disk / from_memory:.2f}x"
    )
    return {
        "runs": rows,
        "per_s": per_s,
        "disk_bytes_per_event": disk,
        "json_bytes_per_event": json_size,
        "drain_from_memory_per_s": from_memory,
        "drain_from_disk_per_s": from_disk,
    }
