"""outbox bench's figures and how they are shown: one contender's :class:`Result` from its
child's raw samples, the tables (rich) and the plot (matplotlib), apart from the running."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: µs: what the plot's log axis shows for "no measurable cost".
_FLOOR = 0.1
#: A handler call is slow when it takes this much (ns) longer than the median call without
#: lineage: a stall (a request waited for, the GIL held elsewhere, the scheduler).
SLOW_NS = 1_000_000


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
    #: The share of handler calls (%) that were slow (``SLOW_NS`` beyond the median call
    #: without lineage), ``off`` (without lineage) and ``on`` (with it), in the same process.
    slow_pct: dict[str, float] = field(default_factory=dict)
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
    slow = baseline["p50"] * 1000 + SLOW_NS

    def slow_pct(ns: Sequence[int]) -> float:
        return 100 * sum(n > slow for n in ns) / len(ns) if ns else math.nan

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
        slow_pct={"off": slow_pct(child["baseline_invocation_ns"]), "on": slow_pct(child["invocation_ns"])},
        emitted=emitted,
        delivered=delivered,
        lost=lost,
        close_seconds=child["close_seconds"],
        cpu_us_per_delivered=child["lineage_cpu_s"] * 1e6 / delivered if delivered else math.nan,
        peak_rss_mib=child["peak_rss_mib"],
        throughput_per_s=len(child["invocation_ns"]) / child["seconds"] if child["seconds"] else math.nan,
        reported_delivered=child.get("delivered_reported"),
    )


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
    from rich.console import Console

    console = console or Console(width=WIDTH)
    if args.policies:
        render_policies(results, args, console)
        return
    console.print(_settings_title(args))
    console.print(_cost_table(results, 2 * args.invocations))
    console.print(_resources_table(results))
    console.print(
        "+lineage: the handler's median latency with lineage minus without, in the same process. "
        "slow calls: the share of the handler's calls that took more than 1 ms longer than its median "
        "call without lineage, without and with lineage (the rate at which something stalled it: a "
        "request waited for, the GIL held elsewhere, the machine). "
        "blocked: killed after --timeout. counted loss: what the contender reported (raised_in_handler: "
        "exceptions the handler saw); silent loss: never arrived and never reported. "
        "*: delivered as the outbox reports it (its real backend was not counted)."
    )


def _cost_table(results: Sequence[Result], events: int) -> Any:
    """What lineage costs the handler: a section per scenario, a row per contender."""
    from rich import box
    from rich.table import Table

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
        ("slow calls\n% off/on", "right"),
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
                f"{_fmt(r.slow_pct.get('off'))}/{_fmt(r.slow_pct.get('on'))}",
                f"{r.delivered:,}" + ("*" if r.note else ""),
                counted,
                f"[red]{silent:,}[/]" if silent else "0",
            )
        table.add_section()
    return table


def _resources_table(results: Sequence[Result]) -> Any:
    """What lineage costs the process: CPU, memory, throughput, close."""
    from rich import box
    from rich.table import Table

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
    return resources


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
    floor = _FLOOR
    shown = [max(r.overhead_us, floor) for r in results if r.status == "ok" and not math.isnan(r.overhead_us)]
    top = max([*shown, floor]) * 30
    columns = min(3, len(scenarios))
    rows = math.ceil(len(scenarios) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.8 * rows), squeeze=False, sharey=True)
    for ax in axes.flat[len(scenarios) :]:
        ax.set_visible(False)
    for ax, scenario in zip(axes.flat, scenarios, strict=False):
        _plot_panel(ax, scenario, [r for r in results if r.scenario == scenario], contenders, colours, top)
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


def _plot_panel(
    ax: Any,
    scenario: str,
    results: Sequence[Result],
    contenders: list[str],
    colours: dict[str, str],
    top: float,
) -> None:
    """One scenario's bars (``results`` are its own), each with its loss above it."""
    floor = _FLOOR
    ax.set_title(scenario)
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, top)
    for i, contender in enumerate(contenders):
        r = next((r for r in results if r.contender == contender), None)
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
