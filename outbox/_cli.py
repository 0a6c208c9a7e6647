"""The ``outbox`` command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState

    from . import Outbox
    from .transports import FileTransport

    path = Path(args.file) if args.file else Path(tempfile.mkdtemp(prefix="outbox-demo-")) / "lineage.jsonl"
    job = Job(namespace="vast-dataengine://my-tenant", name="lineage-demo.lineagefn")
    outbox = Outbox(FileTransport(path, append=True), name="demo")
    costs = []
    for i in range(args.runs):
        run = Run(runId=str(uuid.uuid4()))
        inputs = [InputDataset(namespace="s3://docs-src", name=f"lineage-src/orders-{i}.csv")]
        for state in (RunState.START, RunState.COMPLETE):
            event = RunEvent(
                eventType=state,
                eventTime=datetime.now(UTC).isoformat(),
                run=run,
                job=job,
                producer="https://example.com/outbox-demo",
                inputs=inputs,
            )
            started = time.perf_counter_ns()
            outbox.emit(event)
            costs.append(time.perf_counter_ns() - started)
    report = outbox.close(5)
    costs.sort()
    lines = path.read_text().splitlines()
    print(
        f"emitted {len(costs)} events for {args.runs} runs; "
        f"emit() median {costs[len(costs) // 2] / 1000:.1f} µs, max {costs[-1] / 1000:.1f} µs"
    )
    print(
        f"close(): delivered {report.delivered}, lost {dict(report.undelivered) or 'none'}, "
        f"in {report.duration * 1000:.1f} ms"
    )
    print(f"{len(lines)} events in {path}; the first:")
    print(json.dumps(json.loads(lines[0]), indent=2) if lines else "(none)")
    return 0 if report.complete and len(lines) == len(costs) else 1


def _sink(args: argparse.Namespace) -> int:
    from .sink import Sink, SinkBehaviour

    behaviour = SinkBehaviour(
        flavor=args.flavor,
        delay=args.delay,
        fail_status=args.fail_status,
        fail_rate=args.fail_rate,
        retry_after=args.retry_after,
        single_only=args.single_only,
        api_key=args.api_key,
        max_body=args.max_body,
    )
    sink = Sink(args.host, args.port, store=args.store, echo=not args.quiet, behaviour=behaviour)
    single, batch = sink.routes()
    print(
        f"outbox sink ({args.flavor}) on {sink.url}: POST {single}, POST {batch}, GET /api/v1/events",
        flush=True,
    )
    try:
        sink._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sink._server.server_close()
    print(f"received {len(sink.events)} events", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="outbox", description="lineage-outbox tools")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="emit a few runs through the outbox into a JSON-lines file")
    demo.add_argument("--runs", type=int, default=3, help="runs to emit (START and COMPLETE each)")
    demo.add_argument("--file", help="where to write the events (default: a new temporary folder)")
    demo.set_defaults(func=_demo)

    sink = commands.add_parser(
        "sink", help="run a local OpenLineage HTTP backend that prints what it receives"
    )
    sink.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    sink.add_argument("--port", type=int, default=5000, help="port (default 5000; 0 for a free one)")
    sink.add_argument("--store", metavar="FILE", help="also append accepted events to this JSON-lines file")
    sink.add_argument(
        "--flavor",
        choices=["spec", "marquez", "openmetadata"],
        default="spec",
        help="spec (default), marquez (201, no batch route) or openmetadata (its routes and bodies)",
    )
    sink.add_argument("--delay", type=float, default=0.0, help="seconds to wait before each answer")
    sink.add_argument("--fail-status", type=int, help="answer this HTTP status instead of accepting")
    sink.add_argument(
        "--fail-rate", type=float, default=1.0, help="fraction of requests that fail (default 1)"
    )
    sink.add_argument("--retry-after", help="Retry-After value sent with --fail-status")
    sink.add_argument("--single-only", action="store_true", help="answer 404 on the batch route")
    sink.add_argument("--api-key", help="require Authorization: Bearer API_KEY")
    sink.add_argument("--max-body", type=int, help="answer 413 to larger bodies (bytes)")
    sink.add_argument("--quiet", action="store_true", help="do not print a line per event")
    sink.set_defaults(func=_sink)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
