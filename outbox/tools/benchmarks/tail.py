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
# Targets of issue #20, for the single-thread rows.
P99_TARGET, P999_TARGET, SHIPPING_P99_TARGET, IDLE_RATIO_TARGET = 10.0, 50.0, 15.0, 2.0


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


def measure(
    args: argparse.Namespace, library: str | None = None, print_rows: bool = True
) -> dict[str, dict[str, Any]]:
    """Every row, ``args.repeat`` times; the median of each percentile."""
    rows: dict[str, dict[str, Any]] = {}
    labels = ["off", "floor", "idle", *args.scenarios]
    with backends(args.scenarios) as envs:
        for threads in args.threads:
            for kind in args.kinds:
                for label in labels:
                    if label == "floor" and kind == "helpers":
                        continue  # (the helpers build their events: no minimal emitter to set beside)
                    runs = []
                    for _ in range(args.repeat):
                        env = dict(envs.get("idle" if label == "floor" else label, {}))
                        spill = None
                        if getattr(args, "spill", False) and label not in ("off", "floor"):
                            spill = tempfile.mkdtemp(prefix="outbox-tail-spill-")
                            env["OUTBOX_SPILL_DIR"] = spill
                        spec = {
                            "kind": "off" if label == "off" else kind,
                            "label": label,
                            "floor": label == "floor",
                            "threads": threads,
                            "invocations": args.invocations,
                            "work": args.work,
                            "work_us": args.work_us,
                            "env": env,
                        }
                        try:
                            runs.append(run_row(spec, library))
                        finally:
                            if spill is not None:
                                shutil.rmtree(spill, ignore_errors=True)
                    row = {
                        key: statistics.median([r[key] for r in runs])
                        for key in ("p50", "p99", "p99.9", "max", "first")
                    }
                    row["runs"] = runs
                    row["delivered"] = runs[-1].get("delivered")
                    row["lost"] = runs[-1].get("lost")
                    key = f"{threads}/{kind}/{label}"
                    rows[key] = row
                    if print_rows:
                        print_row(threads, kind, label, row)
    return rows


def print_header(args: argparse.Namespace) -> None:
    repeat = f", median of {args.repeat} runs" if args.repeat > 1 else ""
    realtime = "; under SCHED_FIFO (--realtime)" if args.realtime else ""
    print(
        f"lineage per invocation (START + COMPLETE), {args.invocations:,} invocations per handler thread,"
        f" {args.work} work of {args.work_us:g} µs between them{repeat}{realtime}"
    )
    print(
        f"  {'threads':<8}{'events':<9}{'backend':<16}{'p50 µs':>9}{'p99 µs':>9}{'p99.9 µs':>10}"
        f"{'first µs':>10}  delivered / lost at close"
    )


def print_row(threads: int, kind: str, label: str, row: dict[str, Any]) -> None:
    events = "-" if label == "off" else kind
    name = {"off": "lineage off", "idle": "sidecar idle", "floor": "python floor"}.get(label, label)
    lost = row.get("lost")
    fate = "" if row.get("delivered") is None else f"  {row['delivered']:,} / {sum((lost or {}).values()):,}"
    print(
        f"  {threads:<8}{events:<9}{name:<16}{row['p50']:>9.2f}{row['p99']:>9.2f}{row['p99.9']:>10.1f}"
        f"{row['first']:>10.1f}{fate}"
    )


def verdicts(
    rows: dict[str, dict[str, Any]], args: argparse.Namespace, shipping: dict[str, Any] | None
) -> bool:
    """Print each target and whether it is met; True if all are."""
    ok = True
    single = {k: v for k, v in rows.items() if k.startswith("1/") and not k.endswith(("/off", "/floor"))}
    worst99 = max(single.values(), key=lambda r: r["p99"]) if single else None
    worst999 = max(single.values(), key=lambda r: r["p99.9"]) if single else None
    if worst99 is not None and worst999 is not None:
        name99 = next(k for k, v in single.items() if v is worst99)
        name999 = next(k for k, v in single.items() if v is worst999)
        met = worst99["p99"] <= P99_TARGET
        ok &= met
        print(
            f"  target p99 <= {P99_TARGET:g} µs in every single-thread row: {'met' if met else 'NOT met'}"
            f" (worst {worst99['p99']:.2f} µs, {name99})"
        )
        met = worst999["p99.9"] <= P999_TARGET
        ok &= met
        print(
            f"  target p99.9 <= {P999_TARGET:g} µs in every single-thread row: {'met' if met else 'NOT met'}"
            f" (worst {worst999['p99.9']:.1f} µs, {name999})"
        )
    for kind in args.kinds:
        floor = rows.get(f"1/{kind}/floor")
        outbox_rows = [v["p99"] for k, v in single.items() if k.startswith(f"1/{kind}/")]
        if floor and outbox_rows:
            # Not a target: what the machine allows any pure-Python emit, beside what ours costs.
            print(
                f"  floor, {kind}: a minimal Python emit (class check, lock, append) "
                f"p99 {floor['p99']:.2f} µs, p99.9 {floor['p99.9']:.1f} µs; "
                f"the outbox's rows p99 {min(outbox_rows):.2f} to "
                f"{max(outbox_rows):.2f} µs ({min(outbox_rows) / floor['p99']:.1f}x to "
                f"{max(outbox_rows) / floor['p99']:.1f}x the floor)"
            )
        idle, busy = rows.get(f"1/{kind}/idle"), rows.get(f"1/{kind}/http-healthy")
        if idle and busy:
            ratio = busy["p99"] / idle["p99"]
            met = ratio <= IDLE_RATIO_TARGET
            ok &= met
            print(
                f"  target p99 shipping (HTTP healthy) <= {IDLE_RATIO_TARGET:g}x p99 idle, {kind}: "
                f"{'met' if met else 'NOT met'} ({busy['p99']:.2f} / {idle['p99']:.2f} µs = {ratio:.2f}x)"
            )
    if shipping is not None:
        met = shipping["p99_us"] <= SHIPPING_P99_TARGET and shipping["shipped_per_s"] >= 0.95 * 50_000
        ok &= met
        print(
            f"  target p99 <= {SHIPPING_P99_TARGET:g} µs while shipping 50,000 events/s: "
            f"{'met' if met else 'NOT met'} (p99 {shipping['p99_us']:.2f} µs, "
            f"shipped {shipping['shipped_per_s']:,.0f} events/s)"
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
    parser.add_argument(
        "--no-shipping", action="store_true", help="skip the 50,000 events/s shipping measurement"
    )
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="run the benchmark's processes under SCHED_FIFO (needs root or CAP_SYS_NICE), so that "
        "other work on a shared machine does not preempt the handler while it is measured",
    )
    parser.add_argument(
        "--spill",
        action="store_true",
        help="give every outbox a spill directory (OUTBOX_SPILL_DIR, a fresh temporary one per row)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
    shipping = None
    if not args.no_shipping and not args.library:
        shipping = throughput.bench_tail(50_000, 5.0)
        print(
            f"  while shipping 50,000 events/s over HTTP (run helpers, 1 thread, I/O between 1 ms ticks): "
            f"p50 {shipping['p50_us']:.2f}  p99 {shipping['p99_us']:.2f}  p99.9 {shipping['p999_us']:.1f} µs"
        )
    ok = verdicts(rows, args, shipping)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "shipping": shipping, "all_met": ok}, f, indent=2)
    return 0
