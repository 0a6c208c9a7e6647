"""``python -m outbox.tools.benchmarks tail``: what lineage adds to a handler's invocation, at the
tail, whatever the backend does.

Each row is a fresh process (``_tail_child.py``) whose handler thread(s) run ``--invocations``
invocations, each emitting a START and a COMPLETE through ``Outbox.from_env()`` with only the
backend's address set, as a user's function does; between invocations the handler waits on its own
I/O (``--work-us``). Per invocation, the lineage calls are timed: p50, p99, p99.9 (and the first,
cold invocation apart). Each kind of event (openlineage-python objects, dicts, the run helpers:
each invocation in a span of its own trace, as a DataEngine handler runs) runs against HTTP
healthy, slow (every answer after 0.5 s), down (connection refused), black-holed (accepts, never
answers), Kafka healthy and Kafka down; beside the same handler with lineage off (the machine's own
floor), with the sidecar idle (it sleeps while we measure), and with a minimal Python emitter in
the outbox's place (``floor``: a method that checks the event's class, takes a lock and appends to
a deque, nothing else): what any pure-Python ``emit`` with a bound costs at the tail on this
machine, so that a target can be judged against it.

Three more groups of rows (``--rows``): ``full``, two emits against the refused backend into an
outbox whose buffer is empty and into one full of an outage's backlog (nearly full under ``block``,
which would wait), in turn invocation by invocation in one process, under each overflow policy;
``whole``, the whole invocation (the handler's own
computing, ``--whole`` µs at a rate, plus the run helpers) while the sidecar ships to the healthy
sink, beside the same loop with lineage off; ``busy``, a handler that computes without pause
(``--busy`` µs per invocation) against the healthy sink, counting what is dropped.

Every row is printed as a ratio to the minimal emitter of the same run, and every target is a
ratio to a figure of the same run (the floor, two emits, the empty buffer, lineage off): issue
#37's, printed at the end, met or not.

``--library PATH`` runs the rows against another checkout's ``outbox`` (an earlier release), so
that two versions are compared in one run. The figures depend on the machine and on what else runs
on it: compare within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from outbox.tools.benchmarks import throughput

CHILD = Path(__file__).with_name("_tail_child.py")
KINDS = ("objects", "dicts", "helpers")
SCENARIOS = ("http-healthy", "http-slow", "http-down", "http-blackhole", "kafka-healthy", "kafka-down")
#: The sidecar asleep while the handler emits: linger and batch limits beyond the run.
IDLE_ENV = {
    "OUTBOX_LINGER": "600",
    "OUTBOX_MAX_EVENTS": "200000",
    "OUTBOX_MAX_BATCH_EVENTS": "200000",
    "OUTBOX_MAX_BYTES": "2GiB",
    "OUTBOX_MAX_BATCH_BYTES": "1GiB",
}
POLICIES = ("drop_oldest", "drop_newest", "block")
ROW_GROUPS = ("lineage", "full", "whole", "busy")
# The targets (issue #37), each against a figure of the same run.
FLOOR_P99, FLOOR_P999 = 2.0, 4.0  # every emit row against the minimal emitter of its kind
HELPERS_P50, HELPERS_P99, HELPERS_P999 = 1.5, 2.0, 4.0  # helpers against two emits (p999: the floor)
FULL_RATIO = 1.5  # a full buffer's p50 and p99 against the empty buffer's
SPILL_P99 = 1.2  # issue #36: a row with a spill directory against the same row without one
WHOLE_P99, WHOLE_P99_PLUS, WHOLE_P999, WHOLE_P999_PLUS = 1.25, 10.0, 1.5, 20.0
#: The whole-invocation rows: (µs of the handler's own computing, invocations a second).
WHOLE = ((50.0, 5000.0), (50.0, 10000.0))
#: The busy rows: µs of computing per invocation, back to back (never a pause).
BUSY = (50.0, 200.0)
BUSY_INVOCATIONS = 10_000
WHOLE_INVOCATIONS = 20_000


@contextlib.contextmanager
def backends(scenarios: Sequence[str]) -> Iterator[dict[str, dict[str, str]]]:
    """The environment that points ``Outbox.from_env()`` at each scenario's backend."""
    from outbox.tools.faultproxy import FaultProxy, free_port

    with contextlib.ExitStack() as stack:
        env: dict[str, dict[str, str]] = {}
        need = set(scenarios)
        # Always: the idle and floor rows' outboxes point there too, whatever the scenarios
        # (without an address, from_env would print to stdout, where the row's figures go).
        env["http-healthy"] = {"OPENLINEAGE_URL": stack.enter_context(throughput.Server(*throughput.SINK))}
        if "http-slow" in need:
            slow = stack.enter_context(throughput.Server(*throughput.SINK, "--delay", "0.5"))
            env["http-slow"] = {"OPENLINEAGE_URL": slow}
        env["http-down"] = {"OPENLINEAGE_URL": f"http://127.0.0.1:{free_port()}"}
        if "http-blackhole" in need:
            proxy = FaultProxy("127.0.0.1", free_port(), mode="blackhole")
            proxy.start()
            stack.callback(proxy.stop)
            env["http-blackhole"] = {"OPENLINEAGE_URL": proxy.url}
        if "kafka-healthy" in need:
            from outbox.tools.broker import EmbeddedBroker

            broker = stack.enter_context(EmbeddedBroker())
            env["kafka-healthy"] = _kafka_env(broker.bootstrap_servers)
        env["kafka-down"] = _kafka_env(f"127.0.0.1:{free_port()}")
        env["idle"] = {**env.get("http-healthy", {}), **IDLE_ENV}
        yield env


def _kafka_env(bootstrap: str) -> dict[str, str]:
    return {
        "OPENLINEAGE__TRANSPORT__TYPE": "kafka",
        "OPENLINEAGE__TRANSPORT__TOPIC": "bench-tail",
        "OPENLINEAGE__TRANSPORT__CONFIG": json.dumps({"bootstrap.servers": bootstrap}),
    }


def run_row(spec: dict[str, Any], library: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    # Nothing of the caller's own lineage configuration leaks into a row.
    for var in list(env):
        if var.startswith(("OPENLINEAGE", "OUTBOX_")):
            del env[var]
    if library:
        env["PYTHONPATH"] = os.pathsep.join([library, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run(
        [sys.executable, str(CHILD), json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if out.returncode != 0:
        raise RuntimeError(f"tail row {spec['kind']}/{spec.get('label')} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {
        key: statistics.median([r[key] for r in runs]) for key in ("p50", "p99", "p99.9", "max", "first")
    }
    row["runs"] = runs
    if all("waited" in r for r in runs):
        row["waited"] = {key: statistics.median([r["waited"][key] for r in runs]) for key in ("p99", "p99.9")}
    row["delivered"] = runs[-1].get("delivered")
    row["lost"] = runs[-1].get("lost")
    return row


def _spec(
    args: argparse.Namespace, label: str, kind: str, threads: int, env: dict[str, str]
) -> dict[str, Any]:
    return {
        "kind": "off" if label == "off" else kind,
        "label": label,
        "floor": label == "floor",
        "threads": threads,
        "invocations": args.invocations,
        "work": args.work,
        "work_us": args.work_us,
        "env": env,
    }


def measure(
    args: argparse.Namespace, library: str | None = None, print_rows: bool = True
) -> dict[str, dict[str, Any]]:
    """Every row, ``args.repeat`` times; the median of each percentile.  Keys: ``threads/kind/label``
    (the lineage calls), ``1/kind/full-POLICY``, ``1/helpers/whole-on|off-WORK-RATE``,
    ``1/helpers/busy-WORK``."""
    rows: dict[str, dict[str, Any]] = {}
    groups = set(args.rows)
    with backends(args.scenarios) as envs:
        if "lineage" in groups:
            _measure_lineage(args, library, envs, rows, print_rows)
        if "full" in groups:
            _measure_full(args, library, envs, rows, print_rows)
        if "whole" in groups:
            _measure_whole(args, library, envs, rows, print_rows)
        if "busy" in groups:
            _measure_busy(args, library, envs, rows, print_rows)
    return rows


Envs = dict[str, dict[str, str]]
Rows = dict[str, dict[str, Any]]


def _measure_lineage(
    args: argparse.Namespace, library: str | None, envs: Envs, rows: Rows, show: bool
) -> None:
    for threads in args.threads:
        for kind in args.kinds:
            for label in ["off", "floor", "idle", *args.scenarios]:
                if label == "floor" and kind == "helpers":
                    continue  # (the helpers build their events: set beside the objects' floor)
                # With --spill, each outbox row also with a spill directory, interleaved.
                spills = (
                    (False, True)
                    if getattr(args, "spill", False) and label not in ("off", "floor")
                    else (False,)
                )
                runs: dict[bool, list[dict[str, Any]]] = {spill: [] for spill in spills}
                for _ in range(args.repeat):
                    for spill in spills:
                        env = dict(envs.get("idle" if label == "floor" else label, {}))
                        directory = tempfile.mkdtemp(prefix="outbox-tail-spill-") if spill else None
                        if directory is not None:
                            env["OUTBOX_SPILL_DIR"] = directory
                        try:
                            runs[spill].append(run_row(_spec(args, label, kind, threads, env), library))
                        finally:
                            if directory is not None:
                                shutil.rmtree(directory, ignore_errors=True)
                for spill in spills:
                    name = f"{label}+spill" if spill else label
                    row = rows[f"{threads}/{kind}/{name}"] = _median_row(runs[spill])
                    if show:
                        print_row(threads, kind, name, row, rows)


def _measure_full(args: argparse.Namespace, library: str | None, envs: Envs, rows: Rows, show: bool) -> None:
    for kind in [k for k in args.kinds if k != "helpers"]:
        for policy in POLICIES:
            env = {**envs["http-down"], "OUTBOX_POLICY": policy}
            spec = {**_spec(args, "full", kind, 1, env), "mode": "full"}
            spec["fill"] = "nearly" if policy == "block" else "full"
            runs = [run_row(spec, library) for _ in range(args.repeat)]
            row: dict[str, Any] = {
                phase: {
                    key: statistics.median([r[phase][key] for r in runs])
                    for key in ("p50", "p99", "p99.9", "max")
                }
                for phase in ("empty", "full")
            }
            row.update(runs=runs, held=runs[-1]["held_before"], fill=spec["fill"])
            rows[f"1/{kind}/full-{policy}"] = row
            if show:
                print_full(kind, policy, row)


def _measure_whole(args: argparse.Namespace, library: str | None, envs: Envs, rows: Rows, show: bool) -> None:
    for work_us, rate in args.whole:
        for on in (False, True):
            spec = _spec(args, "whole", "helpers" if on else "off", 1, dict(envs["http-healthy"]))
            spec.update(mode="whole", work="cpu", work_us=work_us, rate=rate)
            spec["invocations"] = args.whole_invocations
            runs = [run_row(spec, library) for _ in range(args.repeat)]
            key = f"1/helpers/whole-{'on' if on else 'off'}-{work_us:g}-{rate:g}"
            row = rows[key] = _median_row(runs)
            if show:
                print_whole(work_us, rate, on, row, rows)


def _measure_busy(args: argparse.Namespace, library: str | None, envs: Envs, rows: Rows, show: bool) -> None:
    with ordinary_scheduling(), throughput.Server(*throughput.SINK) as sink:
        for work_us in args.busy:
            _measure_busy_row(args, library, {"OPENLINEAGE_URL": sink}, work_us, rows, show)


@contextlib.contextmanager
def ordinary_scheduling() -> Iterator[None]:
    """The busy rows, their sink included, under Linux's ordinary scheduler, even with
    ``--realtime``.  Under SCHED_FIFO a thread that computes without pause keeps its CPU from
    every thread of its priority (there are no time slices), and a sink at that priority takes a
    CPU from the handler's process whenever it answers: 1 to 3 runs in 10 dropped the whole
    buffer, with the sidecar's first wait lasting 400-475 ms where it lasts 30 ms otherwise; under
    the ordinary scheduler, none in 10 (#37).  No production handler runs under SCHED_FIFO, and
    what these rows count (events dropped) needs no shelter from the machine's neighbours."""
    if not hasattr(os, "sched_getscheduler") or os.sched_getscheduler(0) == os.SCHED_OTHER:
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # (inherited by what starts now)
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


def _measure_busy_row(
    args: argparse.Namespace, library: str | None, env: dict[str, str], work_us: float, rows: Rows, show: bool
) -> None:
    spec = _spec(args, "busy", "helpers", 1, env)
    spec.update(mode="busy", work="cpu", work_us=work_us, invocations=args.busy_invocations)
    spec["warmup"] = 0
    spec["close_timeout"] = 30.0
    runs = [run_row(spec, library) for _ in range(args.repeat)]
    row = _median_row(runs)
    row["seconds"] = statistics.median([r["seconds"] for r in runs])
    row["dropped"] = [sum(r["lost"].values()) for r in runs]
    rows[f"1/helpers/busy-{work_us:g}"] = row
    if show:
        print_busy(work_us, row)


def print_header(args: argparse.Namespace) -> None:
    repeat = f", median of {args.repeat} runs" if args.repeat > 1 else ""
    realtime = "; under SCHED_FIFO (--realtime)" if args.realtime else ""
    print(
        f"lineage per invocation (START + COMPLETE), {args.invocations:,} invocations per handler thread,"
        f" {args.work} work of {args.work_us:g} µs between them{repeat}{realtime}"
    )
    print(
        f"  {'threads':<8}{'events':<9}{'backend':<16}{'p50 µs':>9}{'p99 µs':>9}{'p99.9 µs':>10}"
        f"{'first µs':>10}  {'x floor p99 / p99.9':<21}delivered / lost at close"
    )


def _floor_of(rows: dict[str, dict[str, Any]], threads: int, kind: str) -> dict[str, Any] | None:
    """The minimal emitter's row an outbox row is measured against (the helpers: the objects')."""
    return rows.get(f"{threads}/{'objects' if kind == 'helpers' else kind}/floor")


def print_row(
    threads: int, kind: str, label: str, row: dict[str, Any], rows: dict[str, dict[str, Any]] | None = None
) -> None:
    events = "-" if label == "off" else kind
    name = {"off": "lineage off", "idle": "sidecar idle", "floor": "python floor"}.get(label, label)
    lost = row.get("lost")
    fate = "" if row.get("delivered") is None else f"{row['delivered']:,} / {sum((lost or {}).values()):,}"
    floor = _floor_of(rows or {}, threads, kind)
    ratio = ""
    if floor is not None and label not in ("off", "floor"):
        ratio = f"{row['p99'] / floor['p99']:.2f}x / {row['p99.9'] / floor['p99.9']:.2f}x"
    print(
        f"  {threads:<8}{events:<9}{name:<16}{row['p50']:>9.2f}{row['p99']:>9.2f}{row['p99.9']:>10.1f}"
        f"{row['first']:>10.1f}  {ratio:<21}{fate}"
    )


def print_full(kind: str, policy: str, row: dict[str, Any]) -> None:
    full, empty = row["full"], row["empty"]
    state = "full" if row["fill"] == "full" else "nearly full"
    print(
        f"  1       {kind:<9}{'http-down':<16}{full['p50']:>9.2f}{full['p99']:>9.2f}{full['p99.9']:>10.1f}"
        f"{'':>10}  {full['p50'] / empty['p50']:.2f}x / {full['p99'] / empty['p99']:.2f}x the empty buffer's"
        f" p50 / p99 ({empty['p50']:.2f} / {empty['p99']:.2f} µs): {policy}, {state} ({row['held']:,} held)"
    )


def print_whole(work_us: float, rate: float, on: bool, row: dict[str, Any], rows: dict[str, Any]) -> None:
    name = "helpers" if on else "-"
    what = f"whole {'on' if on else 'off'}"
    extra = ""
    off = rows.get(f"1/helpers/whole-off-{work_us:g}-{rate:g}")
    if on and off is not None:
        extra = f"{row['p99'] / off['p99']:.2f}x / {row['p99.9'] / off['p99.9']:.2f}x lineage off"
    print(
        f"  1       {name:<9}{what:<16}{row['p50']:>9.2f}{row['p99']:>9.2f}{row['p99.9']:>10.1f}"
        f"{row['first']:>10.1f}  {extra}  ({work_us:g} µs computing, {rate:,.0f} invocations/s,"
        f" {2 * rate:,.0f} events/s)"
    )
    if "waited" in row:  # (the part of each sample spent waiting for the GIL once due)
        waited = row["waited"]
        print(
            f"{'':>26}of which waiting to start, once due: p99 {waited['p99']:.1f} µs,"
            f" p99.9 {waited['p99.9']:.1f} µs"
        )


def print_busy(work_us: float, row: dict[str, Any]) -> None:
    runs = row["runs"]
    events = 2 * sum(r["samples"] for r in runs) / len(runs)
    rate = events / row["seconds"]
    print(
        f"  1       helpers  busy {work_us:g} µs{'':<{6 - len(f'{work_us:g}')}}"
        f"  {len(runs)} run(s) of {events:,.0f} events back to back ({rate:,.0f} events/s): "
        f"dropped {', '.join(f'{d:,}' for d in row['dropped'])}; delivered {row['delivered']:,}"
    )


def _check(name: str, met: bool, detail: str) -> bool:
    print(f"  target {name}: {'met' if met else 'NOT met'} ({detail})")
    return met


def verdicts(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> bool:
    """Print each target and whether it is met; True if all are.  Every target is a ratio to a
    figure measured in the same run."""
    ok = _verdict_emits(rows)
    ok &= _verdict_helpers(rows)
    ok &= _verdict_rest(rows, args)
    ok &= _verdict_spill(rows)
    return ok


def _verdict_spill(rows: Rows) -> bool:
    """Issue #36's: each row with a spill directory (``--spill``), p99 against the same row
    without one, measured in the same run (an outage: ``http-down`` with more events than half
    of ``max_events``, the spill's memory window, so that it overflows to disk)."""
    ok = True
    for key, row in rows.items():
        if key.endswith("+spill") and (off := rows.get(key.removesuffix("+spill"))) is not None:
            ratio = row["p99"] / off["p99"]
            ok &= _check(f"{key} p99 <= {SPILL_P99:g}x without a spill", ratio <= SPILL_P99, f"{ratio:.2f}x")
    return ok


def _verdict_emits(rows: Rows) -> bool:
    ok = True
    emit_rows = {
        k: v for k, v in rows.items() if k.count("/") == 2 and k.split("/")[1] in ("objects", "dicts")
    }
    emit_rows = {k: v for k, v in emit_rows.items() if k.split("/")[2] not in ("off", "floor")}
    emit_rows = {k: v for k, v in emit_rows.items() if not k.split("/")[2].startswith("full-")}
    worst99 = worst999 = (0.0, "")
    for key, row in emit_rows.items():
        threads, kind, _ = key.split("/")
        floor = _floor_of(rows, int(threads), kind)
        if floor is None:
            continue
        worst99 = max(worst99, (row["p99"] / floor["p99"], key))
        worst999 = max(worst999, (row["p99.9"] / floor["p99.9"], key))
    if worst99[1]:
        ok &= _check(
            f"every emit row p99 <= {FLOOR_P99:g}x the floor's",
            worst99[0] <= FLOOR_P99,
            f"worst {worst99[0]:.2f}x, {worst99[1]}",
        )
        ok &= _check(
            f"every emit row p99.9 <= {FLOOR_P999:g}x the floor's",
            worst999[0] <= FLOOR_P999,
            f"worst {worst999[0]:.2f}x, {worst999[1]}",
        )
    return ok


def _verdict_helpers(rows: Rows) -> bool:
    ok = True
    helper_rows = {k: v for k, v in rows.items() if k.count("/") == 2 and k.split("/")[1] == "helpers"}
    helper_rows = {k: v for k, v in helper_rows.items() if k.split("/")[2] not in ("off",)}
    helper_rows = {
        k: v for k, v in helper_rows.items() if not k.split("/")[2].startswith(("whole-", "busy-"))
    }
    worst: dict[str, tuple[float, str]] = {}
    for key, row in helper_rows.items():
        threads, _, label = key.split("/")
        emits, floor = rows.get(f"{threads}/objects/{label}"), rows.get(f"{threads}/objects/floor")
        if emits is None or floor is None:
            continue
        for name, ratio in (
            ("p50", row["p50"] / emits["p50"]),
            ("p99", row["p99"] / emits["p99"]),
            ("p99.9", row["p99.9"] / floor["p99.9"]),
        ):
            worst[name] = max(worst.get(name, (0.0, "")), (ratio, key))
    if not worst and helper_rows:
        print("  (the run helpers' targets need the objects rows: --kinds objects helpers)")
    for name, limit, against in (
        ("p50", HELPERS_P50, "two emits of objects'"),
        ("p99", HELPERS_P99, "two emits of objects'"),
        ("p99.9", HELPERS_P999, "floor's"),
    ):
        if name in worst:
            ratio, key = worst[name]
            ok &= _check(
                f"run helpers {name} <= {limit:g}x the {against}",
                ratio <= limit,
                f"worst {ratio:.2f}x, {key}",
            )
    return ok


def _verdict_rest(rows: Rows, args: argparse.Namespace) -> bool:
    """The full buffer's, the whole invocation's and the busy handler's targets."""
    ok = True
    for key, row in rows.items():
        if "/full-" in key:
            full, empty = row["full"], row["empty"]
            r50, r99 = full["p50"] / empty["p50"], full["p99"] / empty["p99"]
            ok &= _check(
                f"{key} p50 and p99 <= {FULL_RATIO:g}x the empty buffer's",
                r50 <= FULL_RATIO and r99 <= FULL_RATIO,
                f"{r50:.2f}x, {r99:.2f}x",
            )
    for work_us, rate in args.whole if "whole" in args.rows else ():
        on = rows.get(f"1/helpers/whole-on-{work_us:g}-{rate:g}")
        off = rows.get(f"1/helpers/whole-off-{work_us:g}-{rate:g}")
        if on is None or off is None:
            continue
        for name, times, plus in (("p99", WHOLE_P99, WHOLE_P99_PLUS), ("p99.9", WHOLE_P999, WHOLE_P999_PLUS)):
            limit = times * off[name] + plus
            ok &= _check(
                f"whole invocation at {2 * rate:,.0f} events/s, {name} <= {times:g}x lineage off"
                f" + {plus:g} µs",
                on[name] <= limit,
                f"{on[name]:.1f} µs against {limit:.1f}",
            )
    for key, row in rows.items():
        if "/busy-" in key:
            ok &= _check(
                f"{key}: a busy handler against a healthy sink loses nothing",
                max(row["dropped"]) == 0,
                f"dropped {', '.join(f'{d:,}' for d in row['dropped'])}",
            )
    return ok


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m outbox.tools.benchmarks tail", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--invocations", type=int, default=2000, help="invocations per handler thread")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1, 4], help="handler thread counts to run (default: 1 4)"
    )
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="event kinds to emit")
    parser.add_argument(
        "--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), help="backend states"
    )
    parser.add_argument(
        "--work",
        choices=("io", "cpu"),
        default="io",
        help="the handler's own work between invocations: io waits (sleeps), cpu computes (default: io)",
    )
    parser.add_argument(
        "--work-us", type=float, default=200.0, help="microseconds of the handler's own work per invocation"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the median is printed")
    parser.add_argument(
        "--library",
        metavar="PATH",
        help="a checkout whose outbox package the rows import instead of this one (an earlier release)",
    )
    _row_arguments(parser)
    parser.add_argument("--no-shipping", action="store_true", help=argparse.SUPPRESS)  # (retired)
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="run the benchmark's processes under SCHED_FIFO (needs root or CAP_SYS_NICE), so that "
        "other work on a shared machine does not preempt the handler while it is measured",
    )
    parser.add_argument(
        "--spill",
        action="store_true",
        help="measure each outbox row also with a spill directory (OUTBOX_SPILL_DIR, a fresh temporary "
        "one per run), interleaved, and compare their p99 (issue #36's target)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    return parser


def _row_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=ROW_GROUPS,
        default=list(ROW_GROUPS),
        help="which rows: lineage (the lineage calls in every backend state), full (emit with the "
        "buffer full of an outage), whole (the whole invocation while the sidecar ships), busy (a "
        "handler that never pauses, against a healthy sink)",
    )
    parser.add_argument(
        "--whole",
        type=_work_rate,
        nargs="+",
        default=list(WHOLE),
        metavar="WORK_US:RATE",
        help="the whole-invocation rows: µs of computing per invocation, invocations a second "
        "(default: 50:5000 50:10000)",
    )
    parser.add_argument(
        "--whole-invocations", type=int, default=WHOLE_INVOCATIONS, help="invocations per whole row"
    )
    parser.add_argument(
        "--busy", type=float, nargs="+", default=list(BUSY), metavar="WORK_US", help="the busy rows"
    )
    parser.add_argument(
        "--busy-invocations", type=int, default=BUSY_INVOCATIONS, help="invocations per busy row"
    )


def _work_rate(text: str) -> tuple[float, float]:
    work, _, rate = text.partition(":")
    try:
        return float(work), float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WORK_US:RATE, got {text!r}") from None


#: The most ``--invocations`` the full rows take: under ``block`` the full outbox's timed events
#: stay held (the backend is down) beside its fill, in the default buffer of 10,000 events.
FULL_INVOCATIONS_MOST = (10_000 - 64) // 2 - 10


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if "full" in args.rows and args.invocations > FULL_INVOCATIONS_MOST:
        parser.error(
            f"--invocations {args.invocations}: the full rows take at most {FULL_INVOCATIONS_MOST:,} "
            "(the full outbox's events stay held in a buffer of 10,000); lower it, or leave out --rows full"
        )
    if args.realtime:
        # This process and every one it starts (each row's handler and its sidecar thread, the
        # simulated backends) ahead of every ordinary process: on a shared machine, what is
        # measured is then this code, not its neighbours.
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        except PermissionError:
            print("--realtime needs root or CAP_SYS_NICE (SCHED_FIFO)", file=sys.stderr)
            return 1
    print_header(args)
    rows = measure(args, args.library)
    ok = verdicts(rows, args)
    print(f"  every target met: {'yes' if ok else 'NO'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "all_met": ok}, f, indent=2)
    return 0
