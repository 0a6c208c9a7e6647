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
    #: What an outbox contender's close report counted as delivered (None for the others).
    reported_delivered: int | None = None
    #: --policies: what the backend received, beside ``delivered`` (then the outbox's own count).
    #: It can be more: a request cut off at close's deadline may still arrive, while the outbox
    #: counts its events as dropped_shutdown (delivery is at least once).
    received: int | None = None


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
        reported_delivered=child.get("delivered_reported"),
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
    from .._config import resolve_transport_config

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


def bench(args: argparse.Namespace, progress: Any = None) -> list[Result]:
    results: list[Result] = []
    base = {
        "invocations": args.invocations,
        "work_us": args.work_us,
        "model": args.model,
        "rate": args.rate,
        "close_timeout": args.close_timeout,
    }
    steps = plan(args)
    task = progress.add_task("benchmarking", total=len(steps)) if progress else None
    broker = None

    def run(scenario: str, entry: Entry, spec: dict[str, Any], count: Any) -> None:
        if progress:
            progress.update(task, description=f"{entry.label} / {scenario}")
        status, out = run_child({**base, **dict(entry.extra), **spec, "contender": entry.kind}, args.timeout)
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
            results.append(result)
        else:
            results.append(Result(entry.label, scenario, status, note=str(out)))
        if progress:
            progress.advance(task)

    try:
        for scenario in dict.fromkeys(s for s, _ in steps):
            here = [e for s, e in steps if s == scenario]
            if scenario == REAL:
                for entry in here:
                    run(scenario, entry, {}, None)
                continue
            http = [e for e in here if not e.kafka]
            if http:
                with http_backend(scenario, args.latency, args.error_rate) as (url, sink):
                    for entry in http:
                        if sink is not None and entry is not http[0]:
                            sink.clear()
                        count = (
                            (lambda out, sink=sink: sink.received()) if sink is not None else (lambda out: 0)
                        )
                        run(scenario, entry, {"url": url}, count)
            for entry in [e for e in here if e.kafka]:
                if entry.kind == "openlineage-kafka" and not _has_confluent_kafka():
                    note = "needs confluent-kafka: pip install 'lineage-outbox[bench-kafka]'"
                    results.append(Result(entry.label, scenario, "skipped", note=note))
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

                    def count(out: dict[str, Any], bootstrap: str = bootstrap, topic: str = topic) -> int:
                        return _count_topic(bootstrap, topic, out["emitted"])

                    run(scenario, entry, {"bootstrap": bootstrap, "topic": topic}, count)
                else:
                    from .faultproxy import free_port

                    bootstrap = f"127.0.0.1:{free_port()}"
                    run(scenario, entry, {"bootstrap": bootstrap, "topic": topic}, lambda out: 0)
    finally:
        if broker is not None:
            broker.stop()
    return results


# -- output -----------------------------------------------------------------------------------

#: Tables are drawn this wide (cells wrap), so they read in a terminal and in a document.
WIDTH = 100


def _fmt(value: float | None, digits: int = 1) -> str:
    return (
        "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"
    )


def silent_loss(r: Result) -> int:
    """Events that neither arrived nor were reported lost by the contender."""
    return r.lost.get("not_delivered", 0)


def counted_loss(r: Result) -> dict[str, int]:
    """Losses the contender itself reported, by reason (raised into the handler included)."""
    return {k: v for k, v in r.lost.items() if k != "not_delivered"}


def _settings_title(args: argparse.Namespace) -> str:
    loop = f"open loop at {args.rate:g} calls/s" if args.rate else "closed loop"
    return f"{args.invocations} invocations of {args.work_us:g} µs, {args.model} model, {loop}"


def render(results: Sequence[Result], args: argparse.Namespace, console: Any = None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=WIDTH)
    if args.policies:
        render_policies(results, args, console)
        return
    events = 2 * args.invocations
    table = Table(
        title=f"What lineage costs the handler ({events:,} events per contender)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    # Headers on two lines, numbers never wrapped, the loss by reason wrapped: 100 columns.
    for column, justify in (
        ("contender", "left"),
        ("+lineage\nµs p50", "right"),
        ("emit µs\np99", "right"),
        ("handler p99\nms off/on", "right"),
        ("delivered", "right"),
        ("counted\nloss", "left"),
        ("silent\nloss", "right"),
    ):
        loss = column == "counted\nloss"
        table.add_column(
            column,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=not loss,
            min_width=16 if loss else None,
        )
    for scenario in dict.fromkeys(r.scenario for r in results):
        table.add_row(f"[bold]{scenario}[/]")
        for r in (r for r in results if r.scenario == scenario):
            if r.status != "ok":
                why = f"killed {r.note}" if r.status == "blocked" else r.note
                table.add_row(r.contender, f"[yellow]{r.status}[/]", "", "", "", why, "")
                continue
            counted = ", ".join(f"{k} {v:,}" for k, v in counted_loss(r).items()) or "0"
            silent = silent_loss(r)
            table.add_row(
                r.contender,
                _fmt(r.overhead_us),
                _fmt(r.emit_us.get("p99"), 0),
                f"{_fmt(r.baseline_us['p99'] / 1000, 1)}/{_fmt(r.invocation_us['p99'] / 1000, 1)}",
                f"{r.delivered:,}" + ("*" if r.note else ""),
                counted,
                f"[red]{silent:,}[/]" if silent else "0",
            )
        table.add_section()
    console.print(_settings_title(args))
    console.print(table)
    resources = Table(
        title="What lineage costs the process", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    columns = ("scenario", "contender", "CPU µs per\ndelivered event", "peak RSS\nMiB", "calls/s", "close s")
    for column in columns:
        resources.add_column(column, justify="left" if column in ("scenario", "contender") else "right")
    for r in results:
        if r.status == "ok":
            resources.add_row(
                r.scenario,
                r.contender,
                _fmt(r.cpu_us_per_delivered),
                _fmt(r.peak_rss_mib),
                _fmt(r.throughput_per_s, 0),
                _fmt(r.close_seconds, 2),
            )
    console.print(resources)
    console.print(
        "+lineage: the handler's median latency with lineage minus without, in the same process. "
        "blocked: killed after --timeout. counted loss: what the contender reported (raised_in_handler: "
        "exceptions the handler saw); silent loss: never arrived and never reported. "
        "*: delivered as the outbox reports it (its real backend was not counted)."
    )


def render_policies(results: Sequence[Result], args: argparse.Namespace, console: Any) -> None:
    from rich import box
    from rich.table import Table

    events = 2 * args.invocations
    table = Table(
        title=f"Overflow policies under overload: {_settings_title(args)}; the backend takes one event "
        f"per request and answers after {args.latency:g} s. Each row: delivered + dropped = the "
        f"{events:,} events sent",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    columns = (
        ("policy", "left"),
        ("max_events", "right"),
        ("handler ms\np50/p99", "right"),
        ("delivered", "right"),
        ("dropped by reason", "left"),
        ("at the\nsink", "right"),
        ("close s", "right"),
    )
    for column, justify in columns:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for r in results:
        policy, _, size = r.contender.partition(" ")
        if r.status != "ok":
            table.add_row(policy, size, f"[yellow]{r.status}[/]", "", r.note, "", "")
            continue
        dropped = ", ".join(f"{k} {v:,}" for k, v in r.lost.items()) or "0"
        unaccounted = r.emitted - r.delivered - sum(r.lost.values())
        if unaccounted:  # the outbox's own accounting broke: say so, loudly
            dropped += f", [red]unaccounted {unaccounted:,}[/]"
        table.add_row(
            policy,
            f"{int(size):,}",
            f"{_fmt(r.invocation_us['p50'] / 1000, 2)}/{_fmt(r.invocation_us['p99'] / 1000, 2)}",
            f"{r.delivered:,}",
            dropped,
            "-" if r.received is None else f"{r.received:,}",
            _fmt(r.close_seconds, 2),
        )
    console.print(table)
    console.print(
        "delivered and dropped: the outbox's own close report, each event once. at the sink: what the "
        "backend received; more than delivered when requests cut off at close's deadline arrived anyway "
        "(their events count as dropped_shutdown: delivery is at least once). drop_oldest and drop_newest "
        "never wait: a full buffer drops (dropped_full), the oldest queued event or the new one. block "
        "waits up to block_timeout for room, then drops: the handler pays for it. A bigger buffer absorbs "
        "a longer burst; what is still queued at close is dropped_shutdown."
    )


def plot(results: Sequence[Result], path: str) -> None:
    """One panel per scenario, one colour per contender: the handler's added median latency on
    a log axis; blocked contenders hatched to the top; above each bar, its loss: counted by the
    client (black) or silent (red, a colour no contender has)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    scenarios = list(dict.fromkeys(r.scenario for r in results))
    contenders = list(dict.fromkeys(r.contender for r in results))
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    palette += ["tab:cyan", "tab:gray"]
    colours = {c: palette[i % len(palette)] for i, c in enumerate(contenders)}
    floor = 0.1  # µs: what the log axis shows for "no measurable cost"
    shown = [max(r.overhead_us, floor) for r in results if r.status == "ok" and not math.isnan(r.overhead_us)]
    top = max([*shown, floor]) * 30
    columns = min(3, len(scenarios))
    rows = math.ceil(len(scenarios) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.8 * rows), squeeze=False, sharey=True)
    for ax in axes.flat[len(scenarios) :]:
        ax.set_visible(False)
    for ax, scenario in zip(axes.flat, scenarios, strict=False):
        ax.set_title(scenario)
        ax.set_yscale("log")
        ax.set_ylim(floor / 2, top)
        for i, contender in enumerate(contenders):
            r = next((r for r in results if r.scenario == scenario and r.contender == contender), None)
            if r is None:
                continue
            colour = colours[contender]
            if r.status == "blocked":
                ax.bar(i, top, color=colour, alpha=0.3, hatch="//", edgecolor=colour)
                ax.text(i, floor, "blocked", rotation=90, ha="center", va="bottom", fontsize=8)
                continue
            if r.status != "ok":
                ax.text(i, floor, r.status, rotation=90, ha="center", va="bottom", fontsize=8, color="grey")
                continue
            value = max(r.overhead_us, floor)
            ax.bar(i, value, color=colour)
            silent, counted = silent_loss(r), sum(counted_loss(r).values())
            if silent:
                label, tint, weight = f"silent {silent:,}", "red", "bold"
            elif counted:
                label, tint, weight = f"counted {counted:,}", "black", "normal"
            else:
                continue
            ax.text(
                i,
                value * 1.5,
                label,
                ha="center",
                va="bottom",
                fontsize=7,
                color=tint,
                rotation=90,
                weight=weight,
            )
        ax.set_xticks([])
    for ax in axes[:, 0]:
        ax.set_ylabel("added handler latency p50, µs (log)")
    handles: list[Any] = [Patch(color=colours[c], label=c) for c in contenders]
    handles += [
        Patch(facecolor="white", edgecolor="grey", hatch="//", label="blocked (killed)"),
        Patch(color="black", label="counted N: lost, reported by the client"),
        Patch(color="red", label="silent N: lost, never reported"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05 + 0.025 * math.ceil(len(handles) / 4), 1, 1))
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox bench",
        description="What lineage costs a handler, under a healthy, slow or dead backend, side by side "
        "with openlineage-python's own transports. Each contender runs in a process of its own against "
        "a backend started here on loopback; one that blocks is killed and shown as blocked.",
        epilog="Needs the bench extra (rich); --plot needs the plot extra (matplotlib); the "
        "openlineage-kafka contender needs confluent-kafka (the bench-kafka extra).",
    )
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
        type=int,
        default=[1000, 10_000],
        metavar="N",
        help="with --policies: the max_events values to compare (default 1000 10000)",
    )
    parser.add_argument(
        "--invocations", type=int, default=2000, help="handler calls per contender (default 2000)"
    )
    parser.add_argument(
        "--work-us", type=float, default=200.0, help="the handler's own work per call, µs (default 200)"
    )
    parser.add_argument(
        "--model",
        choices=["sync", "async"],
        default="sync",
        help="sync: a thread pool of 4 handlers (default); async: an asyncio handler",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open loop at this many calls/s (default: closed loop; 1000 with --policies)",
    )
    parser.add_argument(
        "--latency", type=float, default=0.5, help="the slow backends' answer delay in s (default 0.5)"
    )
    parser.add_argument(
        "--error-rate", type=float, default=0.5, help="the errors backend's share of 503s (default 0.5)"
    )
    parser.add_argument(
        "--close-timeout", type=float, default=5.0, help="the close() deadline given to contenders, s"
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
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="draw one panel per scenario to FILE.png (the plot extra)"
    )
    return parser


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
