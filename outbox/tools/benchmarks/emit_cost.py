"""What emitting costs the caller: emit() with the sidecar idle and saturated, the
serializer against openlineage-python's, a flood's peak memory, a handler's lineage per
invocation, and Kafka (the embedded broker, healthy and down).  Reported by
``python -m outbox.tools.benchmarks``."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState
from openlineage.client.facet_v2 import error_message_run, job_type_job
from openlineage.client.serde import Serde

from outbox import Outbox, Outcome, SerializedEvent
from outbox._toolkit import serialize
from outbox.transports import DELIVERED

PRODUCER = "https://example.com/lineage-outbox/benchmarks"


def sample_event(state: RunState = RunState.FAIL) -> RunEvent:
    """A DataEngine-shaped event: job facet, one input, an error message on FAIL."""
    job = Job(
        namespace="vast-dataengine://my-tenant",
        name="lineage-demo.lineagefn",
        facets={
            "jobType": job_type_job.JobTypeJobFacet(
                processingType="STREAMING", integration="VAST_DATAENGINE", jobType="FUNCTION"
            )
        },
    )
    facets: dict[str, Any] = {}
    if state is RunState.FAIL:
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message="cannot process lineage-src/orders.bad", programmingLanguage="python"
        )
    return RunEvent(
        eventType=state,
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId="00005015-0000-0016-2e04-8a6dbdde4eb9", facets=facets),
        job=job,
        producer=PRODUCER,
        inputs=[InputDataset(namespace="s3://docs-src", name="lineage-src/orders.bad")],
    )


class NullTransport:
    """Delivers instantly."""

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        return [DELIVERED] * len(batch)

    async def aclose(self) -> None:
        pass


class SlowTransport:
    """Takes ``delay`` seconds per batch, like a backend on the far side of a network."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        await asyncio.sleep(self.delay)
        return [DELIVERED] * len(batch)

    async def aclose(self) -> None:
        pass


class DeadTransport:
    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        return [Outcome.retry("refused", "connection refused")] * len(batch)

    async def aclose(self) -> None:
        pass


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """p50/p99/p99.9/max in microseconds (nearest-rank)."""
    ordered = sorted(samples_ns)
    n = len(ordered)

    def rank(p: float) -> float:
        return ordered[min(n - 1, max(0, math.ceil(round(p / 100 * n, 9)) - 1))] / 1000

    return {"p50": rank(50), "p99": rank(99), "p99.9": rank(99.9), "max": ordered[-1] / 1000}


def timer_overhead_ns(n: int = 200_000) -> float:
    clock = time.perf_counter_ns
    samples: list[int] = []
    for _ in range(n):
        t0 = clock()
        samples.append(clock() - t0)
    return statistics.median(samples)


def measure_emit(outbox: Outbox, events: list[Any]) -> list[int]:
    clock = time.perf_counter_ns
    emit = outbox.emit
    samples: list[int] = []
    append = samples.append
    for event in events:
        t0 = clock()
        emit(event)
        append(clock() - t0)
    return samples


def bench_emit_idle(n: int, chunk: int = 5_000) -> dict[str, float]:
    # Emit in chunks that fit in one batch, with a linger that outlasts the chunk, so the sidecar
    # sleeps while we measure; between chunks (not measured) a flush ships what was emitted.
    outbox = Outbox(
        NullTransport(),
        max_events=chunk + 1,
        max_batch_events=chunk + 1,
        max_bytes=2**30,
        max_batch_bytes=2**30,
        linger=600,
        close_at_exit=False,
    )
    event = sample_event()
    outbox.emit(event)  # start the sidecar before measuring
    outbox.flush(10)
    samples: list[int] = []
    for _ in range(max(1, n // chunk)):
        samples += measure_emit(outbox, [event] * chunk)
        outbox.flush(10)
    outbox.close(10)
    return percentiles(samples)


def bench_emit_saturated(n: int, delay: float) -> tuple[dict[str, float], dict[str, Any]]:
    # Batches of 500 serialized in the sidecar and sent to a backend taking `delay` per batch:
    # the sidecar is busy the whole time, competing with emit for the GIL.
    outbox = Outbox(SlowTransport(delay), max_events=20_000, linger=0, close_at_exit=False)
    event = sample_event()
    outbox.emit(event)
    samples = measure_emit(outbox, [event] * n)
    stats = outbox.stats()
    outbox.close(0.5)
    return percentiles(samples), {
        "delivered_while_measuring": stats.delivered,
        "dropped": dict(stats.dropped),
    }


def bench_serializer(n: int) -> dict[str, float]:
    event = sample_event()
    assert json.loads(Serde.to_json(event)) == json.loads(serialize(event).body)
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            Serde.to_json(event)
        serde = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(n):
            serialize(event)
        ours = time.perf_counter() - t0
        rounds.append((serde, ours))
    serde, ours = min(r[0] for r in rounds), min(r[1] for r in rounds)
    return {"serde_per_s": n / serde, "outbox_per_s": n / ours, "ratio": serde / ours}


_FLOOD = """
import resource, sys
from outbox import Outbox
from outbox.tools.benchmarks.emit_cost import DeadTransport, sample_event
n = int(sys.argv[1])
outbox = Outbox(DeadTransport(), backoff_base=0.01, backoff_cap=0.1, close_at_exit=False)
event = sample_event()
if n:
    for _ in range(n):
        outbox.emit(event)
    stats = outbox.stats()
    held = stats.queued_events + stats.in_flight
else:
    held = 0
try:  # VmHWM: this process's own peak (ru_maxrss would include the parent's, from before exec)
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(peak, held)
"""


def bench_flood(n: int) -> dict[str, float]:
    def run(count: int) -> tuple[int, int]:
        out = subprocess.run(
            [sys.executable, "-c", _FLOOD, str(count)], capture_output=True, text=True, check=True
        ).stdout.split()
        return int(out[0]), int(out[1])

    idle_kib, _ = run(0)
    flood_kib, held = run(n)
    return {"idle_mib": idle_kib / 1024, "flood_mib": flood_kib / 1024, "held_events": held}


def bench_handler(invocations: int) -> dict[str, float]:
    """A handler's whole lineage cost per invocation (START + COMPLETE, construction included),
    three ways, in one run: the run helpers; hand-built RunEvents handed to outbox.emit; and
    the same through an unchanged OpenLineageClient whose transport is OutboxTransport."""
    from openlineage.client.event_v2 import InputDataset, Job, Run
    from openlineage.client.facet_v2 import job_type_job

    from outbox import LineageJob, s3_dataset

    facets: dict[str, Any] = {
        "jobType": job_type_job.JobTypeJobFacet(
            processingType="STREAMING", integration="VAST_DATAENGINE", jobType="FUNCTION"
        )
    }
    template = LineageJob(
        "vast-dataengine://my-tenant", "lineage-demo.lineagefn", facets=facets, producer=PRODUCER
    )
    job = Job(namespace="vast-dataengine://my-tenant", name="lineage-demo.lineagefn", facets=facets)
    outbox = Outbox(NullTransport(), close_at_exit=False)
    client, transport = _drop_in_client()
    run_id = "00005015-0000-0016-2e04-8a6dbdde4eb9"

    def helpers() -> None:
        with outbox.run(template, inputs=[s3_dataset("docs-src", "lineage-src/orders.csv")], run_id=run_id):
            pass

    def by_hand(emit: Any) -> Any:
        def invocation() -> None:
            run = Run(runId=run_id)
            inputs = [InputDataset(namespace="s3://docs-src", name="lineage-src/orders.csv")]
            for state in (RunState.START, RunState.COMPLETE):
                emit(
                    RunEvent(
                        eventType=state,
                        eventTime=datetime.now(UTC).isoformat(),
                        run=run,
                        job=job,
                        producer=PRODUCER,
                        inputs=inputs,
                    )
                )

        return invocation

    contenders = {"helpers": helpers, "hand_built": by_hand(outbox.emit), "drop_in": by_hand(client.emit)}
    results: dict[str, float] = {}
    for name, invocation in contenders.items():
        results[name] = _median_us(invocation, invocations, (outbox, transport.outbox))
    outbox.close(5)
    client.close(5)
    return results


def _median_us(invocation: Callable[[], None], invocations: int, outboxes: Sequence[Outbox]) -> float:
    """The median µs of ``invocation``, the outboxes flushed every 500 calls (not measured)."""
    samples = []
    for i in range(invocations):
        started = time.perf_counter_ns()
        invocation()
        samples.append(time.perf_counter_ns() - started)
        if i % 500 == 499:
            for outbox in outboxes:
                outbox.flush(10)
    return statistics.median(samples) / 1000


def _drop_in_client() -> tuple[Any, Any]:
    """An unchanged OpenLineageClient whose transport is an OutboxTransport shipping to a
    NullTransport, and that transport."""
    from openlineage.client import OpenLineageClient

    from outbox import OutboxTransport

    transport = OutboxTransport(
        OutboxTransport.config_class({"type": "outbox.OutboxTransport", "close_at_exit": False})
    )
    transport.outbox.close(0)
    transport.outbox = Outbox(NullTransport(), close_at_exit=False)
    return OpenLineageClient(transport=transport), transport


def bench_kafka(n: int, emits: int) -> dict[str, Any]:
    """Events/s to the embedded broker, and emit latency with the broker healthy and down."""
    from outbox.tools.broker import EmbeddedBroker
    from outbox.transports import KafkaTransport

    event = sample_event(RunState.COMPLETE)
    results: dict[str, Any] = {}
    with EmbeddedBroker() as broker:
        config = {"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5, "batch.size": 1_000_000}
        outbox = Outbox(KafkaTransport("bench", config), max_events=n, max_bytes=2**31, close_at_exit=False)
        outbox.emit(event)
        outbox.flush(30)  # producer started, topic created
        started = time.perf_counter()
        for _ in range(n):
            outbox.emit(event)
        report = outbox.close(120)
        elapsed = time.perf_counter() - started
        results["throughput"] = {
            "events": n,
            "delivered": report.delivered - 1,
            "per_s": (report.delivered - 1) / elapsed,
        }
        healthy = Outbox(KafkaTransport("bench", config), close_at_exit=False)
        healthy.emit(event)
        healthy.flush(30)
        samples: list[int] = []
        for _ in range(emits // 1000):
            samples += measure_emit(healthy, [event] * 1000)
            time.sleep(0.002)  # a handler's own work between bursts, so the sidecar keeps up
        results["emit_healthy_us"] = percentiles(samples)
        healthy.close(10)
    # The broker is gone now: connection refused on its port.
    down = Outbox(
        KafkaTransport("bench", {"bootstrap.servers": broker.bootstrap_servers}, start_timeout=0.5),
        close_at_exit=False,
    )
    samples = []
    for _ in range(emits // 1000):
        samples += measure_emit(down, [event] * 1000)
        time.sleep(0.002)
    results["emit_down_us"] = percentiles(samples)
    stats = down.stats()
    down.close(0.1)
    results["down_dropped"] = dict(stats.dropped)
    return results
