"""``outbox bench``: what lineage costs a handler, under a healthy, slow or dead backend,
side by side with openlineage-python's own transports.

Every contender runs in a process of its own against a backend this tool starts on
loopback (``outbox sink`` in its own process, the fault proxy, the embedded Kafka-protocol
broker), so one that blocks is reported as "blocked longer than N s". Each child runs the
handler model twice, without and then with lineage, so the overhead is measured in one run.

Needs the ``bench`` extra (rich); ``--plot`` needs the ``plot`` extra (matplotlib); the
openlineage-python ``kafka`` contender needs confluent-kafka.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from ._bench_child import CONTENDERS

__all__ = ["Result", "main", "percentile", "summarize"]

SCENARIOS = ("healthy", "slow", "down", "blackhole", "flapping", "errors")
HTTP_CONTENDERS = tuple(c for c in CONTENDERS if "kafka" not in c)
KAFKA_CONTENDERS = tuple(c for c in CONTENDERS if "kafka" in c)
# Scenarios a Kafka broker can play here: up, or down (nothing listening).
KAFKA_SCENARIOS = ("healthy", "down")


def percentile(samples: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100) of ``samples``; NaN when empty."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(round(p / 100 * len(ordered), 9)) - 1))])


@dataclass
class Result:
    contender: str
    scenario: str
    #: "ok", "blocked" (killed after the timeout), "skipped" (with ``note``) or "failed".
    status: str
    note: str = ""
    emit_us: dict[str, float] = field(default_factory=dict)
    invocation_us: dict[str, float] = field(default_factory=dict)
    baseline_us: dict[str, float] = field(default_factory=dict)
    overhead_us: float = math.nan
    emitted: int = 0
    delivered: int = 0
    lost: dict[str, int] = field(default_factory=dict)
    close_seconds: float = math.nan
    cpu_us_per_delivered: float = math.nan
    peak_rss_mib: float = math.nan
    throughput_per_s: float = math.nan


def summarize(contender: str, scenario: str, child: dict[str, Any], delivered: int) -> Result:
    """Figures from one child's raw samples and what the backend received."""

    def stats(ns: Sequence[int]) -> dict[str, float]:
        us = [n / 1000 for n in ns]
        return {
            name: percentile(us, p) for name, p in (("p50", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9))
        } | {"max": max(us) if us else math.nan}

    invocation = stats(child["invocation_ns"])
    baseline = stats(child["baseline_invocation_ns"])
    emitted = child["emitted"]
    lost = dict(child["lost_reported"])
    unaccounted = emitted - delivered - sum(v for k, v in lost.items() if k != "raised_in_handler")
    if unaccounted > 0 and "raised_in_handler" not in lost:
        lost["not_delivered"] = unaccounted
    return Result(
        contender=contender,
        scenario=scenario,
        status="ok",
        emit_us=stats(child["emit_ns"]),
        invocation_us=invocation,
        baseline_us=baseline,
        overhead_us=invocation["p50"] - baseline["p50"],
        emitted=emitted,
        delivered=delivered,
        lost=lost,
        close_seconds=child["close_seconds"],
        cpu_us_per_delivered=child["lineage_cpu_s"] * 1e6 / delivered if delivered else math.nan,
        peak_rss_mib=child["peak_rss_mib"],
        throughput_per_s=len(child["invocation_ns"]) / child["seconds"] if child["seconds"] else math.nan,
    )


# -- backends -------------------------------------------------------------------------------


class _SinkProcess:
    def __init__(self, *args: str) -> None:
        import re

        self.process = subprocess.Popen(
            [sys.executable, "-m", "outbox.tools.cli", "sink", "--port", "0", "--quiet", *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        match = re.search(r" on (http://\S+):\s", self.process.stdout.readline())
        if match is None:
            raise RuntimeError("outbox sink did not start")
        self.url = match.group(1)
        self.port = int(self.url.rsplit(":", 1)[1])

    def received(self) -> int:
        import httpx

        return len(httpx.get(f"{self.url}/api/v1/events", timeout=30).json())

    def clear(self) -> None:
        """Forget what arrived, once the previous contender's requests stopped arriving: a request
        cut off at its close deadline may still be answered, and must not count for the next."""
        import httpx

        last, stable_since = -1, time.monotonic()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            count = self.received()
            if count != last:
                last, stable_since = count, time.monotonic()
            elif time.monotonic() - stable_since >= 1.0:
                break
            time.sleep(0.2)
        httpx.delete(f"{self.url}/api/v1/events", timeout=30)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@contextmanager
def http_backend(scenario: str, latency: float, error_rate: float) -> Iterator[tuple[str, Any]]:
    """(url for the contenders, the sink that counts arrivals or None)."""
    from .faultproxy import FaultProxy, free_port

    if scenario == "down":
        yield f"http://127.0.0.1:{free_port()}", None
        return
    args: list[str] = []
    if scenario == "slow":
        args = ["--delay", str(latency)]
    elif scenario == "errors":
        args = ["--fail-status", "503", "--fail-rate", str(error_rate)]
    sink = _SinkProcess(*args)
    try:
        if scenario in ("blackhole", "flapping"):
            proxy = FaultProxy(
                "127.0.0.1", sink.port, mode="blackhole" if scenario == "blackhole" else "pass"
            )
            proxy.start()
            stop = threading.Event()

            def flap() -> None:  # up for a second, refusing for a second
                while not stop.wait(1.0):
                    proxy.mode = "refuse" if proxy.mode == "pass" else "pass"

            flapper = threading.Thread(target=flap, daemon=True)
            if scenario == "flapping":
                flapper.start()
            try:
                yield proxy.url, sink
            finally:
                stop.set()
                proxy.stop()
        else:
            yield sink.url, sink
    finally:
        sink.stop()


def _count_topic(bootstrap: str, topic: str, expected: int, timeout: float = 10.0) -> int:
    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def count() -> int:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        seen = 0
        deadline = time.monotonic() + timeout
        try:
            while seen < expected and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=300)
                seen += sum(len(v) for v in batch.values())
        finally:
            await consumer.stop()
        return seen

    return asyncio.run(count())


# -- one contender ----------------------------------------------------------------------------


def run_child(spec: dict[str, Any], timeout: float) -> tuple[str, dict[str, Any] | str]:
    """("ok", figures) or ("blocked"/"failed", why)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "outbox.tools._bench_child", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return "blocked", f"blocked longer than {timeout:g} s"
    if process.returncode != 0 or not out.strip():
        last = (err.strip().splitlines() or ["no output"])[-1]
        return "failed", f"exit {process.returncode}: {last}"
    return "ok", json.loads(out.strip().splitlines()[-1])


def _has_confluent_kafka() -> bool:
    import importlib.util

    return importlib.util.find_spec("confluent_kafka") is not None


def bench(args: argparse.Namespace, progress: Any = None) -> list[Result]:
    results: list[Result] = []
    base = {
        "invocations": args.invocations,
        "work_us": args.work_us,
        "model": args.model,
        "rate": args.rate,
        "close_timeout": args.close_timeout,
    }
    plan = [(c, s) for s in args.scenarios for c in args.contenders if "kafka" not in c] + [
        (c, s) for s in args.scenarios if s in KAFKA_SCENARIOS for c in args.contenders if "kafka" in c
    ]
    task = progress.add_task("benchmarking", total=len(plan)) if progress else None
    broker = None
    try:
        for scenario in args.scenarios:
            http_plan = [c for c, s in plan if s == scenario and "kafka" not in c]
            if http_plan:
                with http_backend(scenario, args.latency, args.error_rate) as (url, sink):
                    for contender in http_plan:
                        if progress:
                            progress.update(task, description=f"{contender} / {scenario}")
                        if sink is not None and contender != http_plan[0]:
                            sink.clear()
                        status, out = run_child({**base, "contender": contender, "url": url}, args.timeout)
                        if status == "ok":
                            assert isinstance(out, dict)
                            delivered = sink.received() if sink is not None else 0
                            results.append(summarize(contender, scenario, out, delivered))
                        else:
                            results.append(Result(contender, scenario, status, note=str(out)))
                        if progress:
                            progress.advance(task)
            for contender in [c for c, s in plan if s == scenario and "kafka" in c]:
                if progress:
                    progress.update(task, description=f"{contender} / {scenario}")
                if contender == "openlineage-kafka" and not _has_confluent_kafka():
                    results.append(
                        Result(
                            contender,
                            scenario,
                            "skipped",
                            note="needs confluent-kafka: pip install 'lineage-outbox[bench-kafka]'",
                        )
                    )
                    if progress:
                        progress.advance(task)
                    continue
                topic = f"bench-{uuid.uuid4().hex[:8]}"
                if scenario == "healthy" and broker is None:
                    from .broker import EmbeddedBroker

                    broker = EmbeddedBroker().start()
                if scenario == "healthy":
                    assert broker is not None
                    bootstrap = broker.bootstrap_servers
                else:
                    from .faultproxy import free_port

                    bootstrap = f"127.0.0.1:{free_port()}"
                spec = {**base, "contender": contender, "bootstrap": bootstrap, "topic": topic}
                status, out = run_child(spec, args.timeout)
                if status == "ok":
                    assert isinstance(out, dict)
                    delivered = _count_topic(bootstrap, topic, out["emitted"]) if scenario == "healthy" else 0
                    results.append(summarize(contender, scenario, out, delivered))
                else:
                    results.append(Result(contender, scenario, status, note=str(out)))
                if progress:
                    progress.advance(task)
    finally:
        if broker is not None:
            broker.stop()
    return results


# -- output -----------------------------------------------------------------------------------


def _fmt(value: float, digits: int = 1) -> str:
    return (
        "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"
    )


def render(results: Sequence[Result], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 170)
    table = Table(
        title=f"lineage cost per handler: {args.invocations} invocations, {args.work_us:g} µs of work each, "
        f"{args.model} model, {'open loop at ' + str(args.rate) + '/s' if args.rate else 'closed loop'}",
    )
    columns = (
        "scenario",
        "contender",
        "emit µs p50 / p99 / p99.9 / max",
        "+lineage µs (p50)",
        "handler p99 ms off / on",
        "delivered",
        "lost",
        "close s",
        "CPU µs/event",
        "RSS MiB",
        "calls/s",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("scenario", "contender", "lost") else "right")
    for r in results:
        if r.status != "ok":
            table.add_row(r.scenario, r.contender, f"[yellow]{r.status}[/]: {r.note}", *[""] * 8)
            continue
        lost = ", ".join(f"{k} {v}" for k, v in r.lost.items()) or "0"
        emit = " / ".join(
            _fmt(r.emit_us.get(k, math.nan), 1 if k == "p50" else 0) for k in ("p50", "p99", "p99.9", "max")
        )
        tails = f"{_fmt(r.baseline_us['p99'] / 1000, 2)} / {_fmt(r.invocation_us['p99'] / 1000, 2)}"
        table.add_row(
            r.scenario,
            r.contender,
            emit,
            _fmt(r.overhead_us),
            tails,
            f"{r.delivered}/{r.emitted}",
            lost,
            _fmt(r.close_seconds, 2),
            _fmt(r.cpu_us_per_delivered),
            _fmt(r.peak_rss_mib),
            _fmt(r.throughput_per_s, 0),
        )
    console.print(table)
    console.print(
        "'+lineage': the handler's median latency with lineage minus the same handler's without, measured "
        "in the same process; 'handler p99': its tail without and with lineage. 'lost': what the contender "
        "reported, or 'not_delivered' for what never reached the backend. 'CPU µs/event': the process's CPU "
        "time with lineage minus without, per delivered event."
    )


def plot(results: Sequence[Result], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.status == "ok"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    labels = [f"{r.contender}\n{r.scenario}" for r in ok]
    for key, marker in (("p50", "o"), ("p99", "s"), ("p99.9", "^")):
        left.scatter(
            range(len(ok)), [max(r.emit_us.get(key, math.nan), 0.01) for r in ok], marker=marker, label=key
        )
    left.set_yscale("log")
    left.set_xticks(range(len(ok)), labels, rotation=75, fontsize=7)
    left.set_ylabel("emit latency (µs, log)")
    left.legend()
    left.set_title("emit latency per contender")
    delivered = [r.delivered for r in ok]
    lost = [max(0, r.emitted - r.delivered) for r in ok]
    right.bar(range(len(ok)), delivered, label="delivered")
    right.bar(range(len(ok)), lost, bottom=delivered, label="lost", color="tab:red")
    right.set_xticks(range(len(ok)), labels, rotation=75, fontsize=7)
    right.set_title("delivered vs lost by close")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outbox bench", description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument(
        "--invocations", type=int, default=2000, help="handler calls per contender (default 2000)"
    )
    parser.add_argument("--work-us", type=float, default=200.0, help="the handler's own work per call, µs")
    parser.add_argument(
        "--model",
        choices=["sync", "async"],
        default="sync",
        help="sync: a thread pool of 4 handlers; async: an asyncio handler",
    )
    parser.add_argument(
        "--rate", type=float, default=0.0, help="open loop at this many calls/s (0: closed loop)"
    )
    parser.add_argument("--latency", type=float, default=0.5, help="the slow backend's answer delay, s")
    parser.add_argument("--error-rate", type=float, default=0.5, help="the errors backend's share of 503s")
    parser.add_argument(
        "--close-timeout", type=float, default=5.0, help="close() deadline given to contenders"
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds before a contender counts as blocked"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="healthy and down, outbox (auto) against openlineage-python's http and async_http, "
        "300 calls: under 45 s",
    )
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw latency and delivery charts (plot extra)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.scenarios = ["healthy", "down"]
        args.contenders = ["outbox-http-auto", "openlineage-http", "openlineage-async_http"]
        args.invocations = 300
        args.timeout = 12.0
        args.close_timeout = 2.0
    try:
        from rich.progress import Progress
    except ImportError:
        print("outbox bench needs the bench extra: pip install 'lineage-outbox[bench]'", file=sys.stderr)
        return 2
    started = time.monotonic()
    with Progress(transient=True) as progress:
        results = bench(args, progress)
    if args.json:  # first: a problem drawing the table must not lose the figures
        with open(args.json, "w") as f:
            json.dump(
                {
                    "settings": {k: v for k, v in vars(args).items() if k not in ("json", "plot")},
                    "results": [asdict(r) for r in results],
                },
                f,
                indent=2,
            )
    render(results, args)
    print(f"finished in {time.monotonic() - started:.0f} s")
    if args.plot:
        try:
            plot(results, args.plot)
        except ImportError:
            print("--plot needs the plot extra: pip install 'lineage-outbox[plot]'", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
