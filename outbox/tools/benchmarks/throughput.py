"""Throughput and cost figures, each beside its anchor measured in the same run.

* ``healthy``: events/s to a backend that does no work (``nullserver``) and to
  ``outbox sink``, with the lanes (``max_concurrency`` 8) against one batch in flight;
* ``cpu``: the whole process's CPU per delivered event (run helpers, file transport)
  against the floor: building the same event's dict and ``orjson.dumps``;
* ``tail``: a handler's invocation latency (START + COMPLETE through the run helpers)
  while the sidecar ships its events over HTTP;
* ``kafka``: events/s through the outbox against the raw aiokafka producer sending the
  same pre-serialized records to the same broker.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson

from outbox import LineageJob, Outbox, s3_dataset


def _job() -> LineageJob:
    from openlineage.client.facet_v2 import job_type_job

    return LineageJob(
        "vast-dataengine://my-tenant",
        "lineage-demo.lineagefn",
        facets={
            "jobType": job_type_job.JobTypeJobFacet(
                processingType="STREAMING", integration="VAST_DATAENGINE", jobType="FUNCTION"
            )
        },
        producer="https://example.com/lineage-outbox/benchmarks",
    )


class Server:
    """A server in a process of its own (so it does not compete with us for the GIL)."""

    def __init__(self, *argv: str) -> None:
        self.argv = argv

    def __enter__(self) -> str:
        self.process = subprocess.Popen([sys.executable, *self.argv], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        banner = self.process.stdout.readline()
        match = re.search(r" on (http://[^\s:]+:\d+)", banner)
        assert match, f"unexpected banner from {self.argv}: {banner!r}"
        self.url = match.group(1)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(10)


NULL_SERVER = ("-m", "outbox.tools.benchmarks.nullserver")
SINK = ("-m", "outbox.tools.cli", "sink", "--port", "0", "--quiet")


def _emit_runs(outbox: Outbox, job: LineageJob, runs: int) -> None:
    """``runs`` invocations of the run helpers, one input each; run ids as a handler outside
    a span gets them (``current_run_id``: a new UUIDv7 per run)."""
    for i in range(runs):
        with outbox.run(job, inputs=[s3_dataset("bench-src", f"in/{i}.csv")]):
            pass


def bench_healthy(server: tuple[str, ...], runs: int, max_concurrency: int) -> dict[str, Any]:
    """Events/s delivered (batch mode) to a healthy backend, from the first emit to close."""
    from outbox.transports import HttpTransport

    with Server(*server) as url:
        outbox = Outbox(
            HttpTransport(url, mode="batch"),
            max_events=2 * runs,
            max_bytes=2**31,
            max_concurrency=max_concurrency,
            close_at_exit=False,
        )
        job = _job()
        started = time.perf_counter()
        _emit_runs(outbox, job, runs)
        report = outbox.close(300)
        elapsed = time.perf_counter() - started
    return {"events": 2 * runs, "delivered": report.delivered, "per_s": report.delivered / elapsed}


def report_healthy(runs: int = 50_000, repeats: int = 3) -> dict[str, Any]:
    print("\nA healthy backend on loopback (its own process), batch mode: runs of START + COMPLETE")
    print("(run helpers) emitted at once, then close; the anchor is one batch in flight, this run")
    figures: dict[str, Any] = {}
    for name, server in (("does-no-work server", NULL_SERVER), ("outbox sink", SINK)):
        rates: dict[int, list[float]] = {1: [], 8: []}
        for _ in range(repeats):
            for k in (1, 8):  # interleaved, so both see the same machine
                row = bench_healthy(server, runs, k)
                assert row["delivered"] == row["events"], row
                rates[k].append(row["per_s"])
        one, eight = statistics.median(rates[1]), statistics.median(rates[8])
        figures[name] = {"max_concurrency_1": rates[1], "max_concurrency_8": rates[8], "ratio": eight / one}
        print(
            f"  {name:<20} max_concurrency=1 {one:>9,.0f}  max_concurrency=8 {eight:>9,.0f} events/s"
            f"  ratio {eight / one:.2f}  (median of {repeats})"
        )
    worst = min(f["ratio"] for f in figures.values())
    print(f"  target: no regression (ratio >= 0.95): {'met' if worst >= 0.95 else 'NOT met'}")
    return figures


def _floor(job: LineageJob, n: int) -> float:
    """Process CPU per event for building the event's dict (time, run id, one input, the
    job's prepared part) and ``orjson.dumps``: what any emitter pays at least."""
    return _floor_round(job, n)


def _floor_round(job: LineageJob, n: int) -> float:
    run_id = str(uuid.UUID(int=1))
    started = time.process_time()
    for i in range(n):
        orjson.dumps(
            {
                "eventTime": datetime.now(UTC).isoformat(),
                "producer": job.producer,
                "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
                "run": {"runId": run_id, "facets": {}},
                "job": job.plain_job,
                "eventType": "START" if i & 1 else "COMPLETE",
                "inputs": [
                    {"namespace": "s3://bench-src", "name": f"in/{i}.csv", "facets": {}, "inputFacets": {}}
                ],
                "outputs": [],
            }
        )
    return (time.process_time() - started) / n


def bench_cpu(runs: int) -> dict[str, float]:
    from outbox.transports import FileTransport

    job = _job()
    before = _floor(job, 2 * runs)
    with tempfile.TemporaryDirectory() as tmp:
        outbox = Outbox(
            FileTransport(os.path.join(tmp, "events.jsonl"), append=True),
            max_events=2 * runs,
            max_bytes=2**31,
            close_at_exit=False,
        )
        outbox.emit({"eventType": "START", "run": {"runId": "warm-up"}})
        outbox.flush(30)  # the sidecar thread started
        started = time.process_time()
        _emit_runs(outbox, job, runs)
        report = outbox.close(300)
        cpu = time.process_time() - started
    # The same number of events just before and just after: this machine's speed drifts.
    floor = (before + _floor(job, 2 * runs)) / 2
    delivered = report.delivered - 1
    return {"floor_us": floor * 1e6, "per_event_us": cpu / delivered * 1e6, "delivered": delivered}


def report_cpu(runs: int = 50_000, repeats: int = 3) -> dict[str, Any]:
    # This machine's speed drifts by tens of percent within a minute: each ratio is of a
    # floor and an outbox run measured back to back, and the median ratio is the figure.
    pairs = [bench_cpu(runs) for _ in range(repeats)]
    ratios = sorted(p["per_event_us"] / p["floor_us"] for p in pairs)
    ratio = statistics.median(ratios)
    print(f"\nThe whole process's CPU per delivered event: {runs:,} runs of START + COMPLETE (run helpers,")
    print("one input each), file transport, from the first emit until close returned; the floor (the")
    print("event's dict and orjson.dumps, as many events) measured just before and just after each run")
    for p in pairs:
        print(
            f"  outbox {p['per_event_us']:>6.2f} µs per delivered event, floor {p['floor_us']:>5.2f} µs: "
            f"{p['per_event_us'] / p['floor_us']:.1f}x"
        )
    print(f"  median ratio {ratio:.1f}x (target <= 4x: {'met' if ratio <= 4 else 'NOT met'})")
    return {"pairs": pairs, "ratio": ratio}


def bench_tail(rate: float, seconds: float, *, spin: bool = False) -> dict[str, Any]:
    """A handler's invocation latency (``with outbox.run(...)``, START + COMPLETE, one input)
    while the sidecar ships ``rate`` events/s to the does-no-work server in batch mode.

    Between invocations the handler does its own work.  By default it waits (sleeps) until
    the next millisecond tick, as a handler waiting on I/O, and runs that tick's
    invocations back to back.  With ``spin`` it computes until its next slot and so never
    releases the GIL: the sidecar gets it only when CPython's switch interval forces it.
    """
    from outbox.transports import HttpTransport

    job = _job()
    per_tick = max(1, round(rate / 2 / 1000))
    interval = 2 / rate
    samples: list[int] = []
    clock = time.perf_counter_ns
    now = time.perf_counter
    with Server(*NULL_SERVER) as url:
        outbox = Outbox(HttpTransport(url, mode="batch"), close_at_exit=False)
        outbox.emit({"eventType": "START", "run": {"runId": "warm-up"}})
        outbox.flush(30)
        delivered_before = outbox.stats().delivered
        started = now()
        slot = started
        i = 0
        while slot - started < seconds:
            for _ in range(1 if spin else per_tick):
                i += 1
                t0 = clock()
                with outbox.run(job, inputs=[s3_dataset("bench-src", f"in/{i}.csv")]):
                    pass
                samples.append(clock() - t0)
            if spin:
                slot += interval
                while now() < slot:
                    pass
            else:
                slot += 0.001
                pause = slot - now()
                if pause > 0:
                    time.sleep(pause)
        elapsed = now() - started
        shipped = outbox.stats().delivered - delivered_before
        report = outbox.close(60)
    samples.sort()
    return {
        "invocations": len(samples),
        "shipped_per_s": shipped / elapsed,
        "emitted_per_s": 2 * len(samples) / elapsed,
        "p50_us": samples[len(samples) // 2] / 1000,
        "p99_us": samples[int(len(samples) * 0.99)] / 1000,
        "p999_us": samples[int(len(samples) * 0.999)] / 1000,
        "lost": dict(report.undelivered),
    }


def report_tail(rate: float = 50_000, seconds: float = 5.0) -> dict[str, Any]:
    print("\nA handler's invocation (with outbox.run: START + COMPLETE, one input) while the sidecar ships")
    print(f"over HTTP to the does-no-work server, {seconds:g} s each")
    figures: dict[str, Any] = {}
    for label, spin in (
        ("handler waits on I/O between 1 ms ticks", False),
        ("handler computes between calls", True),
    ):
        row = bench_tail(rate, seconds, spin=spin)
        figures["spin" if spin else "io"] = row
        print(f"  {label}:")
        print(
            f"    {row['invocations']:,} invocations; emitted {row['emitted_per_s']:,.0f} events/s, "
            f"shipped {row['shipped_per_s']:,.0f}; lost {row['lost'] or 'none'}"
        )
        print(
            f"    invocation p50 {row['p50_us']:.2f} µs  p99 {row['p99_us']:.2f} µs"
            f"  p99.9 {row['p999_us']:.1f} µs"
        )
    row = figures["io"]
    met = row["p99_us"] <= 10 and row["shipped_per_s"] >= 0.95 * rate
    print(
        f"  target p99 <= 10 µs while shipping {rate:,.0f} events/s (I/O handler): "
        f"{'met' if met else 'NOT met'}"
    )
    return figures


async def _raw_aiokafka(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> float:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=1_000_000, acks="all"
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"{}", key=b"warm-up")
        started = time.perf_counter()
        futures = [await producer.send(topic, value, key=key) for key, value in records]
        await asyncio.gather(*futures)
        return time.perf_counter() - started
    finally:
        await producer.stop()


def bench_kafka_vs_raw(n: int) -> dict[str, Any]:
    """Events/s: the outbox's Kafka transport against the raw aiokafka producer with the same
    records (the outbox's own serialized events and keys), to the same broker, in one run."""
    from outbox._toolkit import serialize
    from outbox.tools.broker import EmbeddedBroker
    from outbox.transports import KafkaTransport

    job = _job()
    events: list[Any] = []
    from outbox._toolkit import RunRecord

    now = time.time()
    for i in range(n // 2):
        run_id = str(uuid.UUID(int=i + 1))
        inputs = (s3_dataset("bench-src", f"in/{i}.csv"),)
        events.append(RunRecord(job, "START", now, run_id, inputs, ()))
        events.append(RunRecord(job, "COMPLETE", now, run_id, inputs, ()))
    records = []
    for event in events:
        ser = serialize(event)
        records.append(((ser.key or "").encode(), ser.body))
    results: dict[str, Any] = {}
    with EmbeddedBroker() as broker:
        raw = asyncio.run(_raw_aiokafka(broker.bootstrap_servers, "bench-raw", records))
        results["raw_per_s"] = len(records) / raw
        config = {"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5, "batch.size": 1_000_000}
        outbox = Outbox(
            KafkaTransport("bench-outbox", config), max_events=n + 1, max_bytes=2**31, close_at_exit=False
        )
        outbox.emit({"eventType": "START", "run": {"runId": "warm-up"}})
        outbox.flush(30)  # producer started, topic created
        started = time.perf_counter()
        for event in events:
            outbox.emit(event)
        report = outbox.close(120)
        elapsed = time.perf_counter() - started
        results["outbox_per_s"] = (report.delivered - 1) / elapsed
        results["delivered"] = report.delivered - 1
    results["events"] = n
    results["ratio"] = results["outbox_per_s"] / results["raw_per_s"]
    return results


def report_kafka(n: int = 100_000) -> dict[str, Any]:
    figures = bench_kafka_vs_raw(n)
    print(f"\nKafka to the embedded broker (Tansu, its own process), {n:,} run-helper events")
    print(f"  raw aiokafka producer, the same records pre-serialized {figures['raw_per_s']:>10,.0f} events/s")
    print(
        f"  outbox (run helpers emitted, serialized in the sidecar) {figures['outbox_per_s']:>9,.0f} events/s"
        f"  ({figures['delivered']:,} delivered)"
    )
    ratio = figures["ratio"]
    print(f"  ratio {ratio:.0%} (target >= 80%: {'met' if ratio >= 0.8 else 'NOT met'})")
    return figures
