"""One contender of ``outbox bench`` in a process of its own.

``python -m outbox._bench_child '<json spec>'`` runs the handler model twice, without and
then with lineage, and prints one JSON line of figures. The parent kills it when it takes
too long, which is how a client that blocks (openlineage-python's Kafka transport with the
broker down) shows up as "blocked" instead of hanging the tool.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

CONTENDERS = (
    "outbox-http-single",
    "outbox-http-auto",
    "outbox-kafka",
    "openlineage-http",
    "openlineage-async_http",
    "openlineage-kafka",
)


def _events(count: int, state: str) -> list[Any]:
    from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState

    job = Job(namespace="vast-dataengine://bench", name="bench.lineagefn")
    when = datetime.now(UTC).isoformat()
    return [
        RunEvent(
            eventType=RunState(state),
            eventTime=when,
            job=job,
            producer="https://example.com/outbox-bench",
            run=Run(runId=f"00000000-0000-0000-0000-{i:012d}"),
            inputs=[InputDataset(namespace="s3://bench", name=f"objects/{i}.csv")],
        )
        for i in range(count)
    ]


class Emitter:
    """emit(event) and close(timeout) -> (undelivered by reason, seconds) for one contender."""

    def __init__(self, spec: dict[str, Any]) -> None:
        kind = spec["contender"]
        self.errors = 0
        self.delivered: int | None = None  # as an outbox reports it (the backend counts otherwise)
        if kind.startswith("outbox-"):
            from outbox import Outbox
            from outbox.transports import HttpTransport, KafkaTransport

            transport: Any
            if kind == "outbox-kafka":
                transport = KafkaTransport(
                    spec["topic"], {"bootstrap.servers": spec["bootstrap"]}, start_timeout=2.0
                )
            else:
                transport = HttpTransport(spec["url"], mode=kind.rsplit("-", 1)[1], timeout=5.0)
            options = {"policy": spec["policy"], "max_events": spec["max_events"]} if "policy" in spec else {}
            self.outbox = Outbox(transport, close_at_exit=False, **options)
            self._emit: Callable[[Any], Any] = self.outbox.emit
            self._close: Callable[[float], Any] = self._close_outbox
        elif kind == "from-env":
            self.outbox = _from_env(spec)
            self._emit, self._close = self.outbox.emit, self._close_outbox
        elif kind == "openlineage-http":
            from openlineage.client.transport.http import HttpConfig
            from openlineage.client.transport.http import HttpTransport as OLHttp

            client = OLHttp(HttpConfig.from_dict({"url": spec["url"]}))
            self._emit, self._close = client.emit, lambda timeout: client.close(timeout)
        elif kind == "openlineage-async_http":
            from openlineage.client.transport.async_http import AsyncHttpConfig, AsyncHttpTransport

            client2 = AsyncHttpTransport(AsyncHttpConfig.from_dict({"url": spec["url"]}))
            self._emit, self._close = client2.emit, lambda timeout: client2.close(timeout)
        elif kind == "openlineage-kafka":
            from openlineage.client.transport.kafka import KafkaConfig
            from openlineage.client.transport.kafka import KafkaTransport as OLKafka

            client3 = OLKafka(
                KafkaConfig.from_dict(
                    {"topic": spec["topic"], "config": {"bootstrap.servers": spec["bootstrap"]}}
                )
            )
            self._emit, self._close = client3.emit, lambda timeout: client3.close(timeout)
        else:
            raise ValueError(f"unknown contender {kind!r}; choose from {', '.join(CONTENDERS)}")

    def _close_outbox(self, timeout: float) -> dict[str, int]:
        report = self.outbox.close(timeout)
        self.delivered = report.delivered
        return dict(report.undelivered)

    def emit(self, event: Any) -> None:
        try:
            self._emit(event)
        except Exception:  # openlineage-python raises into the handler when the backend is down
            self.errors += 1

    def close(self, timeout: float) -> tuple[dict[str, int], float]:
        started = time.monotonic()
        try:
            result = self._close(timeout)
        except Exception:
            result = None
        lost = result if isinstance(result, dict) else {}
        if self.errors:
            lost = {**lost, "raised_in_handler": self.errors}
        return lost, time.monotonic() - started


def _from_env(spec: dict[str, Any]) -> Any:
    """The environment's own outbox (transport and OUTBOX_* settings, as Outbox.from_env()
    builds it), pointed at the simulated backend of ``spec`` when it names one."""
    import os

    from outbox import Outbox
    from outbox._toolkit import outbox_settings, resolve_transport_config
    from outbox.transports import transport_from_config

    resolved = resolve_transport_config(os.environ)
    config = dict(resolved.config or {})
    if "url" in spec:
        config["url"] = spec["url"]
    if "bootstrap" in spec:
        producer = config.get("config") or {}
        producer = json.loads(producer) if isinstance(producer, str) else dict(producer)
        config["config"] = {**producer, "bootstrap.servers": spec["bootstrap"]}
        config["topic"] = spec["topic"]
    resolved.config = config
    settings, _ = outbox_settings(os.environ)
    return Outbox(transport_from_config(resolved), **{**settings, "close_at_exit": False})


def _busy(microseconds: float) -> None:
    end = time.perf_counter_ns() + microseconds * 1000
    while time.perf_counter_ns() < end:
        pass


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _run(
    spec: dict[str, Any], emitter: Emitter | None, starts: list[Any], completes: list[Any]
) -> dict[str, Any]:
    count, work, rate, model = spec["invocations"], spec["work_us"], spec["rate"], spec["model"]
    invocation_ns: list[int] = []
    emit_ns: list[int] = []

    def invocation(i: int) -> None:
        clock = time.perf_counter_ns
        started = clock()
        _busy(work / 2)
        if emitter is not None:
            t = clock()
            emitter.emit(starts[i])
            emit_ns.append(clock() - t)
        _busy(work / 2)
        if emitter is not None:
            t = clock()
            emitter.emit(completes[i])
            emit_ns.append(clock() - t)
        invocation_ns.append(clock() - started)

    cpu, started = _cpu(), time.perf_counter()
    if model == "sync":
        with ThreadPoolExecutor(max_workers=4) as pool:
            for i in range(count):
                if rate:
                    delay = started + i / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                pool.submit(invocation, i)
    else:

        async def main() -> None:
            for i in range(count):
                if rate:
                    delay = started + i / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                invocation(i)
                if i % 50 == 0:
                    await asyncio.sleep(0)

        asyncio.run(main())
    elapsed = time.perf_counter() - started
    return {"invocation_ns": invocation_ns, "emit_ns": emit_ns, "seconds": elapsed, "cpu": _cpu() - cpu}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    count = spec["invocations"]
    starts, completes = _events(count, "START"), _events(count, "COMPLETE")
    baseline = _run(spec, None, starts, completes)
    emitter = Emitter(spec)
    measured = _run(spec, emitter, starts, completes)
    cpu_before_close = _cpu()
    lost, close_seconds = emitter.close(spec["close_timeout"])
    close_cpu = _cpu() - cpu_before_close
    try:
        with open("/proc/self/status") as f:
            peak_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except OSError:
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "baseline_invocation_ns": baseline["invocation_ns"],
        "invocation_ns": measured["invocation_ns"],
        "emit_ns": measured["emit_ns"],
        "seconds": measured["seconds"],
        "lineage_cpu_s": max(0.0, measured["cpu"] - baseline["cpu"]) + close_cpu,
        "close_seconds": close_seconds,
        "lost_reported": lost,
        "peak_rss_mib": peak_kib / 1024,
        "emitted": 2 * count,
        "delivered_reported": emitter.delivered,
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    print(json.dumps(run(spec)), flush=True)


if __name__ == "__main__":
    main()
