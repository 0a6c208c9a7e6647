"""outbox bench: what lineage costs a handler, under a healthy, slow or dead backend, side by
side with openlineage-python's own transports (and, with --from-env, your own configuration).

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
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from . import _args
from ._bench_child import CONTENDERS
from ._bench_report import Result, percentile, plot, render, summarize

__all__ = ["Result", "main", "percentile", "summarize"]

SCENARIOS = ("healthy", "slow", "down", "blackhole", "flapping", "errors")
# --policies: a backend that takes one event per request (no batch route, as Marquez) and
# answers each after --latency, so that any --rate worth the name overloads it.
OVERLOAD = "overload"
# --from-env: the configured backend itself.
REAL = "real"
POLICIES = ("drop_oldest", "drop_newest", "block")
HTTP_CONTENDERS = tuple(c for c in CONTENDERS if "kafka" not in c)
KAFKA_CONTENDERS = tuple(c for c in CONTENDERS if "kafka" in c)
# Scenarios a Kafka broker can play here: up, or down (nothing listening).
KAFKA_SCENARIOS = ("healthy", "down")


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
    elif scenario == OVERLOAD:
        args = ["--delay", str(latency), "--single-only"]
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
        return "blocked", f"> {timeout:g} s"
    if process.returncode != 0 or not out.strip():
        last = (err.strip().splitlines() or ["no output"])[-1]
        return "failed", f"exit {process.returncode}: {last}"
    return "ok", json.loads(out.strip().splitlines()[-1])


def _has_confluent_kafka() -> bool:
    import importlib.util

    return importlib.util.find_spec("confluent_kafka") is not None


@dataclass(frozen=True)
class Entry:
    """One contender as the tables show it: its label, the child's kind, and the spec's extras."""

    label: str
    kind: str
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def kafka(self) -> bool:
        return "kafka" in self.kind or dict(self.extra).get("transport") == "kafka"


def _env_transport_type() -> str:
    from .._toolkit import resolve_transport_config

    resolved = resolve_transport_config(os.environ)
    return "disabled" if resolved.disabled else str((resolved.config or {}).get("type"))


def plan(args: argparse.Namespace) -> list[tuple[str, Entry]]:
    """(scenario, contender) in the order they run."""
    if args.policies:
        return [
            (
                OVERLOAD,
                Entry(f"{policy} {size}", "outbox-http-auto", (("policy", policy), ("max_events", size))),
            )
            for size in args.buffer_sizes
            for policy in POLICIES
        ]
    entries = [Entry(c, c) for c in args.contenders]
    if args.from_env:
        kind = _env_transport_type()
        family = "kafka" if kind == "kafka" else "http" if kind in ("http", "async_http") else kind
        entries.append(Entry("from-env", "from-env", (("transport", family),)))
    steps: list[tuple[str, Entry]] = []
    for scenario in args.scenarios:
        for entry in entries:
            via = dict(entry.extra).get("transport")
            if scenario == REAL:
                if entry.kind == "from-env":
                    steps.append((scenario, entry))
            elif entry.kafka:
                if scenario in KAFKA_SCENARIOS:
                    steps.append((scenario, entry))
            elif via in (None, "http"):
                steps.append((scenario, entry))
    return steps


class _Runner:
    """Runs contenders one at a time, keeping their results and the progress bar."""

    def __init__(self, args: argparse.Namespace, progress: Any, steps: int) -> None:
        self.results: list[Result] = []
        self._timeout = args.timeout
        self._base = {
            "invocations": args.invocations,
            "work_us": args.work_us,
            "model": args.model,
            "rate": args.rate,
            "close_timeout": args.close_timeout,
        }
        self._progress = progress
        self._task = progress.add_task("benchmarking", total=steps) if progress else None

    def run(self, scenario: str, entry: Entry, spec: dict[str, Any], count: Any) -> None:
        """One contender's child against one backend; ``count(out)`` what the backend received
        (None: the outbox's own report)."""
        if self._progress:
            self._progress.update(self._task, description=f"{entry.label} / {scenario}")
        child = {**self._base, **dict(entry.extra), **spec, "contender": entry.kind}
        status, out = run_child(child, self._timeout)
        if status == "ok":
            assert isinstance(out, dict)
            reported = out.get("delivered_reported")
            if scenario == OVERLOAD:
                # Each event counted once, by the outbox's own report (delivered or dropped by a
                # named reason); what the sink received is shown beside it.
                result = summarize(entry.label, scenario, out, reported or 0)
                result.received = count(out)
            else:
                delivered = count(out) if count is not None else (reported or 0)
                result = summarize(entry.label, scenario, out, delivered)
                if count is None:
                    result.note = "delivered as the outbox reports it"
            self.results.append(result)
        else:
            self.results.append(Result(entry.label, scenario, status, note=str(out)))
        self.advance()

    def skip(self, scenario: str, entry: Entry, note: str) -> None:
        self.results.append(Result(entry.label, scenario, "skipped", note=note))
        self.advance()

    def advance(self) -> None:
        if self._progress:
            self._progress.advance(self._task)


def bench(args: argparse.Namespace, progress: Any = None) -> list[Result]:
    steps = plan(args)
    runner = _Runner(args, progress, len(steps))
    broker = None
    try:
        for scenario in dict.fromkeys(s for s, _ in steps):
            here = [e for s, e in steps if s == scenario]
            if scenario == REAL:
                for entry in here:
                    runner.run(scenario, entry, {}, None)
                continue
            _bench_http(runner, scenario, [e for e in here if not e.kafka], args)
            broker = _bench_kafka(runner, scenario, [e for e in here if e.kafka], broker)
    finally:
        if broker is not None:
            broker.stop()
    return runner.results


def _bench_http(runner: _Runner, scenario: str, entries: list[Entry], args: argparse.Namespace) -> None:
    """The HTTP contenders against one simulated backend, started once for them all."""
    if not entries:
        return
    with http_backend(scenario, args.latency, args.error_rate) as (url, sink):
        for entry in entries:
            if sink is not None and entry is not entries[0]:
                sink.clear()
            count = (lambda out, sink=sink: sink.received()) if sink is not None else (lambda out: 0)
            runner.run(scenario, entry, {"url": url}, count)


def _bench_kafka(runner: _Runner, scenario: str, entries: list[Entry], broker: Any) -> Any:
    """The Kafka contenders, each on a topic of its own: against the embedded broker (started
    on first use, and returned to be stopped at the end) or, down, nothing listening."""
    for entry in entries:
        if entry.kind == "openlineage-kafka" and not _has_confluent_kafka():
            runner.skip(scenario, entry, "needs confluent-kafka: pip install 'lineage-outbox[bench-kafka]'")
            continue
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        if scenario == "healthy" and broker is None:
            from .broker import EmbeddedBroker

            broker = EmbeddedBroker().start()
        if scenario == "healthy":
            assert broker is not None
            bootstrap = broker.bootstrap_servers

            def count(out: dict[str, Any], bootstrap: str = bootstrap, topic: str = topic) -> int:
                return _count_topic(bootstrap, topic, out["emitted"])

            runner.run(scenario, entry, {"bootstrap": bootstrap, "topic": topic}, count)
        else:
            from .faultproxy import free_port

            bootstrap = f"127.0.0.1:{free_port()}"
            runner.run(scenario, entry, {"bootstrap": bootstrap, "topic": topic}, lambda out: 0)
    return broker


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox bench",
        description="What lineage costs a handler, under a healthy, slow or dead backend, side by side "
        "with openlineage-python's own transports. Each contender runs in a process of its own against "
        "a backend started here on loopback; one that blocks is killed and shown as blocked.",
        epilog="Needs the bench extra (rich); --plot needs the plot extra (matplotlib); the "
        "openlineage-kafka contender needs confluent-kafka (the bench-kafka extra).",
    )
    _add_selection(parser)
    _add_load(parser)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="healthy and down, outbox (auto) against openlineage-python's http and async_http, "
        "300 calls: under 45 s",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="draw one panel per scenario to FILE.png (the plot extra)"
    )
    return parser


def _add_selection(parser: argparse.ArgumentParser) -> None:
    """What runs: the scenarios, the contenders, one's own configuration, the policies."""
    parser.add_argument(
        "--scenarios",
        nargs="+",
        choices=[*SCENARIOS, REAL],
        default=list(SCENARIOS),
        metavar="SCENARIO",
        help=f"backends to run against: {', '.join(SCENARIOS)} (default all), and with --from-env "
        f"{REAL} (your configured backend, as it is)",
    )
    parser.add_argument(
        "--contenders",
        nargs="+",
        choices=CONTENDERS,
        default=list(CONTENDERS),
        metavar="CONTENDER",
        help=f"clients to compare: {', '.join(CONTENDERS)} (default all)",
    )
    parser.add_argument(
        "--from-env",
        action="store_true",
        help="add your own configuration as a contender: the transport and OUTBOX_* settings of this "
        "environment (as Outbox.from_env() reads them), pointed at each simulated backend; add the "
        f"scenario {REAL} to run it against the configured backend itself",
    )
    parser.add_argument(
        "--policies",
        action="store_true",
        help="compare the overflow policies (drop_oldest, drop_newest, block) and --buffer-sizes under "
        "an overload at --rate, against a backend that takes one event per request after --latency",
    )
    parser.add_argument(
        "--buffer-sizes",
        nargs="+",
        type=_args.count,
        default=[1000, 10_000],
        metavar="N",
        help="with --policies: the max_events values to compare (default 1000 10000)",
    )


def _add_load(parser: argparse.ArgumentParser) -> None:
    """What each contender is put through: the handler, the load, the backends' faults."""
    parser.add_argument(
        "--invocations", type=_args.count, default=2000, help="handler calls per contender (default 2000)"
    )
    parser.add_argument(
        "--work-us",
        type=_args.non_negative,
        default=200.0,
        help="the handler's own work per call, µs (default 200)",
    )
    parser.add_argument(
        "--model",
        choices=["sync", "async"],
        default="sync",
        help="sync: a thread pool of 4 handlers (default); async: an asyncio handler",
    )
    parser.add_argument(
        "--rate",
        type=_args.non_negative,
        default=None,
        help="open loop at this many calls/s (default: closed loop; 1000 with --policies)",
    )
    parser.add_argument(
        "--latency",
        type=_args.seconds_or_zero,
        default=0.5,
        help="the slow backends' answer delay in s (default 0.5)",
    )
    parser.add_argument(
        "--error-rate",
        type=_args.fraction,
        default=0.5,
        help="the errors backend's share of 503s (default 0.5)",
    )
    parser.add_argument(
        "--close-timeout",
        type=_args.seconds_or_zero,
        default=5.0,
        help="the close() deadline given to contenders, s (default 5; 2 with --quick)",
    )
    parser.add_argument(
        "--timeout",
        type=_args.positive_seconds,
        default=60.0,
        help="seconds before a contender counts as blocked (default 60; 12 with --quick)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.scenarios = ["healthy", "down"]
        args.contenders = ["outbox-http-auto", "openlineage-http", "openlineage-async_http"]
        args.invocations = 300
        args.timeout = 12.0
        args.close_timeout = 2.0
    if args.rate is None:
        args.rate = 1000.0 if args.policies else 0.0
    if REAL in args.scenarios and not args.from_env:
        parser.error(f"the scenario {REAL} runs your configuration: add --from-env")
    if args.from_env:
        kind = _env_transport_type()
        if kind not in ("http", "async_http", "kafka") and args.scenarios != [REAL]:
            parser.error(
                f"--from-env: this environment's transport is {kind}, which has no simulated backend; "
                f"run it with --scenarios {REAL}"
            )
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
