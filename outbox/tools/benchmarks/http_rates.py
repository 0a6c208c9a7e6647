"""HTTP to ``outbox sink`` on loopback (its own process): events/s in batch and single mode,
the sink's own capacity, a slow sink at close, and several batches in flight (lanes) with
each run's order checked.  Reported by ``python -m outbox.tools.benchmarks``."""

from __future__ import annotations

import time
import uuid
from typing import Any

from openlineage.client.event_v2 import RunState

from outbox import Outbox
from outbox._toolkit import serialize
from outbox.tools.benchmarks import throughput
from outbox.tools.benchmarks.emit_cost import sample_event


class SinkProcess(throughput.Server):
    """``outbox sink`` in a process of its own, so it does not compete with us for the GIL."""

    def __init__(self, *args: str) -> None:
        super().__init__(*throughput.SINK, *args)

    def received(self) -> int:
        import httpx

        return len(httpx.get(f"{self.url}/api/v1/events", timeout=30).json())


def bench_http_throughput(mode: str, n: int) -> dict[str, float]:
    from outbox.transports import HttpTransport

    with SinkProcess() as url:
        outbox = Outbox(
            HttpTransport(url, mode=mode),  # type: ignore[arg-type]
            max_events=n,
            max_bytes=2**31,
            close_at_exit=False,
        )
        event = sample_event(RunState.COMPLETE)
        started = time.perf_counter()
        for _ in range(n):
            outbox.emit(event)
        report = outbox.close(120)
        elapsed = time.perf_counter() - started
    return {
        "events": n,
        "delivered": report.delivered,
        "seconds": elapsed,
        "per_s": report.delivered / elapsed,
    }


def bench_sink_capacity(batches: int = 50, size: int = 1000) -> float:
    """What `outbox sink` itself can take: pre-serialized batches posted back to back by a
    plain httpx client (no outbox). The ceiling for the outbox's HTTP figures."""
    import httpx

    body = serialize(sample_event(RunState.COMPLETE)).body
    payload = b"[" + b",".join([body] * size) + b"]"
    with SinkProcess() as url, httpx.Client(headers={"Content-Type": "application/json"}) as client:
        client.post(f"{url}/api/v1/lineage/batch", content=payload)
        started = time.perf_counter()
        for _ in range(batches):
            client.post(f"{url}/api/v1/lineage/batch", content=payload).raise_for_status()
        return batches * size / (time.perf_counter() - started)


def bench_http_slow(mode: str, invocations: int, delay: float, deadline: float) -> dict[str, Any]:
    from outbox.transports import HttpTransport

    sink = SinkProcess("--delay", str(delay))
    with sink as url:
        outbox = Outbox(HttpTransport(url, mode=mode), close_at_exit=False)  # type: ignore[arg-type]
        start, complete = sample_event(RunState.START), sample_event(RunState.COMPLETE)
        for _ in range(invocations):
            outbox.emit(start)
            outbox.emit(complete)
        report = outbox.close(deadline)
        arrived = sink.received()
    return {
        "mode": mode,
        "events": 2 * invocations,
        "delivered": report.delivered,
        "arrived": arrived,
        "lost": dict(report.undelivered),
        "close_s": report.duration,
    }


def bench_lanes(mode: str, runs: int, delay: float, max_concurrency: int) -> dict[str, Any]:
    """Events/s delivered to a sink answering every request after ``delay`` seconds: ``runs``
    runs of START and COMPLETE (run helpers), then each run's order checked at the sink,
    event by event (START before COMPLETE, arrival order)."""
    import httpx

    from outbox import LineageJob
    from outbox.transports import HttpTransport

    with SinkProcess("--delay", str(delay)) as url:
        outbox = Outbox(
            HttpTransport(url, mode=mode, max_concurrent_requests=10),  # type: ignore[arg-type]
            max_events=2 * runs,
            max_bytes=2**31,
            max_concurrency=max_concurrency,
            close_at_exit=False,
        )
        job = LineageJob("bench", "lanes", producer="https://example.com/bench")
        started = time.perf_counter()
        for i in range(runs):
            with outbox.run(job, run_id=str(uuid.UUID(int=i + 1))):
                pass
        report = outbox.close(600)
        elapsed = time.perf_counter() - started
        arrived = httpx.get(f"{url}/api/v1/events", timeout=60).json()
    seen: dict[str, list[str]] = {}
    for event in arrived:
        seen.setdefault(event["run"]["runId"], []).append(event["eventType"])
    out_of_order = sum(1 for states in seen.values() if states != ["START", "COMPLETE"])
    return {
        "mode": mode,
        "max_concurrency": max_concurrency,
        "events": 2 * runs,
        "delivered": report.delivered,
        "seconds": elapsed,
        "per_s": report.delivered / elapsed,
        "runs_out_of_order": out_of_order,
    }


def report_lanes() -> dict[str, Any]:
    print("\nSeveral batches in flight: runs of START + COMPLETE (run helpers) against a sink answering")
    print("every request after 0.5 s; each run's order checked at the sink, event by event")
    lanes: dict[str, dict[str, Any]] = {}
    for mode, run_count in (("batch", 20_000), ("single", 400)):
        anchor = bench_lanes(mode, run_count, 0.5, 1)
        figures = bench_lanes(mode, run_count, 0.5, 8)
        lanes[mode] = {"anchor": anchor, "lanes": figures}
        rows = [
            ("max_concurrency=1 (one batch in flight)", anchor),
            ("max_concurrency=8 (the default)", figures),
        ]
        if mode == "batch":
            # What a larger setting buys (the buffer holds the 40,000 events here).
            lanes[mode]["lanes_16"] = bench_lanes(mode, run_count, 0.5, 16)
            rows.append(("max_concurrency=16", lanes[mode]["lanes_16"]))
        for label, row in rows:
            print(
                f"  {mode:<6} {label:<40}{row['per_s']:>10,.0f} events/s  "
                f"({row['delivered']:,} of {row['events']:,}; "
                f"runs out of order: {row['runs_out_of_order']})"
            )
        print(f"  {mode:<6} ratio {figures['per_s'] / anchor['per_s']:.1f}x")
    rate = lanes["batch"]["lanes"]["per_s"]
    print(f"  target >= 10,000 events/s in batch mode, by default: {'met' if rate >= 10_000 else 'NOT met'}")
    return lanes
