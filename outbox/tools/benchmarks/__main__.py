"""``python -m outbox.tools.benchmarks``: what emitting costs the caller, measured here and now.

Prints:
  * emit latency per event (p50, p99, p99.9, max) with the sidecar idle, and while it
    is saturated shipping to a slow transport (serializing and sending in the
    background, competing for the GIL);
  * serializer throughput against openlineage-python's ``Serde.to_json``, as a ratio
    measured in the same run;
  * peak RSS of a process that emits 1,000,000 events into a transport that never
    succeeds, against the same process idle.

Figures depend on the machine and on what else runs on it: compare ratios from one
run, not numbers across machines.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from outbox.tools.benchmarks import throughput
from outbox.tools.benchmarks.emit_cost import (
    bench_emit_idle,
    bench_emit_saturated,
    bench_flood,
    bench_handler,
    bench_kafka,
    bench_serializer,
    timer_overhead_ns,
)
from outbox.tools.benchmarks.http_rates import (
    bench_http_slow,
    bench_http_throughput,
    bench_sink_capacity,
    report_lanes,
)
from outbox.tools.benchmarks.spill import report_spill

SECTIONS: dict[str, Callable[[], Any]] = {
    "lanes": report_lanes,
    "healthy": throughput.report_healthy,
    "cpu": throughput.report_cpu,
    "tail": throughput.report_tail,
    "kafka": throughput.report_kafka,
    "spill": report_spill,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["tail"]:
        # A handler's tail in every backend state: a command of its own (its own options).
        from outbox.tools.benchmarks import tail

        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        return tail.main(argv[1:])
    if argv[:1] == ["forward"]:
        # outbox forward at scale on Apache Kafka: a command of its own (its own options).
        from outbox.tools.benchmarks import forward

        return forward.main(argv[1:])
    if argv[:1] == ["instructions"]:
        # The caller's cost in instructions (callgrind): repeatable on a busy machine.
        from outbox.tools.benchmarks import instructions

        return instructions.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.only:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        figures = SECTIONS[args.only]()
        if args.json:
            with open(args.json, "w") as out:
                json.dump({args.only: figures}, out, indent=2)
        return 0
    # The broker-down measurement makes aiokafka log connection errors; they are expected here.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)

    results: dict[str, Any] = {"python": sys.version.split()[0]}
    overhead = timer_overhead_ns()
    results["timer_overhead_us"] = overhead / 1000
    print(f"lineage-outbox benchmarks (Python {results['python']}; timer overhead {overhead / 1000:.3f} µs,")
    print("included in every emit figure below)\n")
    _report_emit(args, results)
    _report_serializer(results)
    _report_handler(results)
    results["cpu"] = throughput.report_cpu()
    print()
    if args.flood:
        _report_flood(args, results)
    if args.http_events:
        _report_http(args, results)
    if args.kafka_events:
        _report_kafka(args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m outbox.tools.benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--events", type=int, default=200_000, help="emits per latency measurement")
    parser.add_argument(
        "--slow-delay", type=float, default=0.005, help="seconds the slow transport takes per batch"
    )
    parser.add_argument("--flood", type=int, default=1_000_000, help="emits into a dead backend for peak RSS")
    parser.add_argument(
        "--http-events", type=int, default=100_000, help="events per HTTP throughput run (0: skip)"
    )
    parser.add_argument(
        "--kafka-events", type=int, default=100_000, help="events per Kafka throughput run (0: skip)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument(
        "--only",
        choices=sorted(SECTIONS),
        help="run one section: lanes (batches in flight against a slow sink), healthy (a healthy "
        "backend, lanes against one batch in flight), cpu (process CPU per delivered event against "
        "the floor), tail (a handler's invocation latency while the sidecar ships), kafka "
        "(against the raw aiokafka producer), spill (events written to a spill directory per second, "
        "bytes on disk per event); 'python -m outbox.tools.benchmarks tail --help' for "
        "the tail in every backend state; 'python -m outbox.tools.benchmarks instructions --help' for "
        "the caller's cost in instructions (repeatable on a busy machine); "
        "'python -m outbox.tools.benchmarks forward --help' for outbox forward at scale on Apache Kafka",
    )
    return parser


def _report_emit(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """emit() per event with the sidecar idle, and saturated shipping to a slow transport."""
    idle = bench_emit_idle(args.events)
    saturated, sat_info = bench_emit_saturated(args.events, args.slow_delay)
    results["emit_idle_us"] = idle
    results["emit_saturated_us"] = saturated
    results["saturated"] = sat_info
    print(f"emit() per event, {args.events:,} pre-built RunEvents     p50      p99    p99.9       max")
    for label, p in (
        ("sidecar idle", idle),
        (f"sidecar saturated ({args.slow_delay * 1000:g} ms/batch)", saturated),
    ):
        print(f"  {label:<44}{p['p50']:>7.2f}µs{p['p99']:>7.2f}µs{p['p99.9']:>8.1f}µs{p['max']:>9.0f}µs")
    print(
        f"  (saturated run: {sat_info['delivered_while_measuring']:,} delivered while measuring, "
        f"dropped {sat_info['dropped'] or 'none'})"
    )
    verdict = "met" if idle["p50"] <= 2 and idle["p99"] <= 10 else "NOT met"
    print(f"  target p50 <= 2 µs and p99 <= 10 µs (sidecar idle): {verdict}\n")


def _report_serializer(results: dict[str, Any]) -> None:
    """The serializer against openlineage-python's Serde.to_json, as a ratio."""
    ser = bench_serializer(20_000)
    results["serializer"] = ser
    print("serializer, the same FAIL event                     events/s")
    print(f"  openlineage-python Serde.to_json               {ser['serde_per_s']:>12,.0f}")
    print(f"  outbox (in the sidecar)                        {ser['outbox_per_s']:>12,.0f}")
    print(f"  ratio {ser['ratio']:.1f}x (target >= 3x: {'met' if ser['ratio'] >= 3 else 'NOT met'})\n")


def _report_handler(results: dict[str, Any]) -> None:
    """A handler's lineage per invocation, three ways."""
    handler = bench_handler(5000)
    results["handler_us"] = handler
    print("a handler's lineage per invocation (START + COMPLETE, building the events included), median")
    print(f"  run helpers (outbox.run, LineageJob, s3_dataset)      {handler['helpers']:>8.1f} µs")
    print(
        f"  hand-built RunEvents + outbox.emit                    {handler['hand_built']:>8.1f} µs"
        f"  ({handler['hand_built'] / handler['helpers']:.1f}x the helpers)"
    )
    print(
        f"  unchanged OpenLineageClient + OutboxTransport         {handler['drop_in']:>8.1f} µs"
        f"  ({handler['drop_in'] / handler['helpers']:.1f}x the helpers)"
    )


def _report_flood(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Peak RSS of a flood into a backend that never succeeds."""
    flood = bench_flood(args.flood)
    results["flood"] = flood
    print(f"{args.flood:,} emits into a backend that never succeeds (defaults: max_events 10,000, 64 MiB)")
    print(
        f"  peak RSS idle process {flood['idle_mib']:.1f} MiB, after the flood {flood['flood_mib']:.1f} MiB"
    )
    print(f"  events held at the end: {flood['held_events']:,.0f}")


def _report_http(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """HTTP to ``outbox sink``: throughput, the sink's capacity, a slow sink at close, lanes."""
    print("\nHTTP to `outbox sink` on loopback (its own process)          events/s")
    http_rates: dict[str, Any] = {}
    for mode in ("batch", "single"):
        count = args.http_events if mode == "batch" else max(1, args.http_events // 10)
        runs = [bench_http_throughput(mode, count) for _ in range(3 if mode == "batch" else 1)]
        rates = sorted(r["per_s"] for r in runs)
        figures = {**runs[0], "runs_per_s": rates, "per_s": statistics.median(rates)}
        http_rates[mode] = figures
        spread = f"  (runs: {', '.join(f'{r:,.0f}' for r in rates)})" if len(rates) > 1 else ""
        delivered = min(r["delivered"] for r in runs)
        print(
            f"  {mode:<7} mode, {figures['events']:>7,} events, {delivered:>7,} delivered"
            f"{figures['per_s']:>20,.0f}{spread}"
        )
    capacity = bench_sink_capacity()
    http_rates["sink_capacity_per_s"] = capacity
    results["http_throughput"] = http_rates
    print(f"  the sink alone (pre-built 1000-event batches, no outbox){capacity:>19,.0f}")
    batch_rate = float(http_rates["batch"]["per_s"])
    print(f"  batch mode delivers at {batch_rate / capacity:.0%} of what the sink can take")
    verdict = "met" if batch_rate >= 50_000 else "NOT met"
    print(f"  target >= 50,000 events/s in batch mode (median of 3 runs): {verdict}")
    print("\n2,000 invocations (START + COMPLETE) against a sink answering every request after 0.5 s,")
    print("then close(5):")
    slow = {}
    for mode in ("auto", "batch"):
        figures = bench_http_slow(mode, 2000, 0.5, 5.0)
        slow[mode] = figures
        print(
            f"  {mode:<5} mode: {figures['arrived']:,} of {figures['events']:,} events arrived "
            f"({figures['delivered']:,} acknowledged), close took {figures['close_s']:.2f} s, "
            f"lost {figures['lost'] or 'none'}"
        )
    results["http_slow"] = slow
    results["lanes"] = report_lanes()
    results["healthy"] = throughput.report_healthy()
    results["tail"] = throughput.report_tail()


def _report_kafka(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Kafka to the embedded broker: throughput, emit healthy and down, against raw aiokafka."""
    kafka = bench_kafka(args.kafka_events, min(args.events, 100_000))
    results["kafka"] = kafka
    t = kafka["throughput"]
    print("\nKafka to the embedded broker (Tansu, its own process)")
    print(
        f"  {t['delivered']:,} of {t['events']:,} events delivered, {t['per_s']:,.0f} events/s "
        f"(target >= 50,000: {'met' if t['per_s'] >= 50_000 else 'NOT met'})"
    )
    print("  emit() per event                                p50      p99    p99.9       max")
    for label, key in (
        ("broker healthy", "emit_healthy_us"),
        ("broker down (connection refused)", "emit_down_us"),
    ):
        p = kafka[key]
        print(f"  {label:<44}{p['p50']:>7.2f}µs{p['p99']:>7.2f}µs{p['p99.9']:>8.1f}µs{p['max']:>9.0f}µs")
    worst = max(kafka["emit_healthy_us"]["p99"], kafka["emit_down_us"]["p99"])
    print(f"  target p99 <= 10 µs in both states: {'met' if worst <= 10 else 'NOT met'}")
    results["kafka_vs_raw"] = throughput.report_kafka(args.kafka_events)


if __name__ == "__main__":
    sys.exit(main())
