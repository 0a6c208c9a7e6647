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
from typing import TYPE_CHECKING

from . import _args

__all__ = ["main"]

if TYPE_CHECKING:  # what add_subparsers() returns (typeshed names it so)
    from .forward import Forwarder
    from .sink import Sink

    Commands = argparse._SubParsersAction[argparse.ArgumentParser]


def _demo_file(raw: str | None) -> tuple[Path, int] | str:
    """Where the demo (or the sink's --store) writes, and how many lines it held before; or
    why it cannot write there."""
    path = Path(raw) if raw else Path(tempfile.mkdtemp(prefix="outbox-demo-")) / "lineage.jsonl"
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        return f"{path} is a folder; give a file to write the events to"
    if not folder.is_dir():
        return f"the folder of {path} does not exist; create it, or give a path in one"
    if path.exists() and not path.is_file():  # (a FIFO would hang the count, /dev/zero never end it)
        return f"{path} is not a regular file; give a file to write the events to"
    try:
        before = len(path.read_bytes().splitlines()) if path.exists() else 0
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    try:  # (tried, not judged by os.access: root may "write" /proc, and no file appears there)
        with open(path, "ab"):
            pass
    except OSError as exc:
        return f"cannot write {path} ({exc.strerror or exc}); give a path you can write"
    return path, before


def _demo(args: argparse.Namespace) -> int:
    where = _demo_file(args.file)  # refused before openlineage-python's client is loaded
    if isinstance(where, str):
        print(f"outbox demo: --file: {where}", file=sys.stderr)
        return 2
    from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState

    from .. import Outbox
    from ..transports import FileTransport

    path, before = where
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
    lines = path.read_text().splitlines()[before:]  # this run's (the file is appended to)
    print(
        f"emitted {len(costs)} events for {args.runs} runs; "
        f"emit() median {costs[len(costs) // 2] / 1000:.1f} µs, max {costs[-1] / 1000:.1f} µs"
    )
    print(
        f"close(): delivered {report.delivered}, lost {dict(report.undelivered) or 'none'}, "
        f"in {report.duration * 1000:.1f} ms"
    )
    earlier = f" (after {before} lines already there)" if before else ""
    print(f"{len(lines)} events written to {path}{earlier}; the first:")
    print(json.dumps(json.loads(lines[0]), indent=2) if lines else "(none)")
    return 0 if report.complete and len(lines) == len(costs) else 1


def _sink(args: argparse.Namespace) -> int:
    from .._toolkit import header_problem
    from .sink import Sink, SinkBehaviour

    tables = tuple(t.strip() for spec in args.openmetadata_tables or () for t in spec.split(",") if t.strip())
    behaviour = SinkBehaviour(
        flavor=args.flavor,
        openmetadata_all_failed_status=args.openmetadata_all_failed_status,
        openmetadata_tables=tables,
        delay=args.delay,
        fail_status=args.fail_status,
        fail_rate=args.fail_rate,
        retry_after=args.retry_after,
        single_only=args.single_only,
        api_key=args.api_key,
        max_body=args.max_body,
    )
    unsendable = header_problem(args.api_key, tabs=False) if args.api_key is not None else None
    if unsendable is not None:
        print(
            f"outbox sink: --api-key contains {unsendable}; no client could send it (the value is not shown)",
            file=sys.stderr,
        )
        return 2
    if args.store:
        store = _demo_file(args.store)
        if isinstance(store, str):
            print(f"outbox sink: --store: {store}", file=sys.stderr)
            return 2
    try:
        sink = Sink(
            args.host,
            args.port,
            store=args.store,
            echo=not args.quiet,
            behaviour=behaviour,
            log_requests="all" if args.verbose else "refused",
        )
    except OSError as exc:  # the port is taken, the host is not this machine's
        print(
            f"outbox sink: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; give another "
            "--port (0 for a free one) or --host",
            file=sys.stderr,
        )
        return 1
    routes = ", ".join(f"POST {route}" for route in sink.served_routes())
    print(f"outbox sink ({args.flavor}) on {sink.url}: {routes}, GET /api/v1/events", flush=True)
    _serve_until_stopped(sink)
    print(f"received {len(sink.events)} events", flush=True)
    return 0


def _serve_until_stopped(sink: Sink) -> None:
    """Serve until Ctrl-C or SIGTERM (a service manager, a container's stop): either ends it,
    and the summary follows.  The server's shutdown waits for serve_forever to return, so
    SIGTERM's handler runs it on a thread of its own."""
    import signal
    import threading

    previous = signal.signal(
        signal.SIGTERM, lambda signum, frame: threading.Thread(target=sink._server.shutdown).start()
    )
    try:
        sink._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        sink._server.server_close()


def _forward(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from .forward import BrokersUnreachable

    forwarder = _forwarder(args)
    if isinstance(forwarder, str):
        print(f"outbox forward: {forwarder}", file=sys.stderr)
        return 2

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, forwarder.stop)
        await forwarder.run()

    try:
        asyncio.run(run())
    except BrokersUnreachable as exc:
        print(f"outbox forward: {exc}", file=sys.stderr)
        return 1
    return 0


def _forwarder(args: argparse.Namespace) -> Forwarder | str:
    """The forwarder ``outbox forward``'s arguments ask for, or what is wrong with them."""
    import os

    from .. import ConfigError
    from .._toolkit import checked_url, secret_text
    from ..transports import HttpTransport
    from .forward import Forwarder

    url = args.url or os.environ.get("OPENLINEAGE_URL")
    if not url:
        return "give --url or set OPENLINEAGE_URL (the HTTP backend to post to)"
    kafka_config = _kafka_config(args.kafka_config)
    if isinstance(kafka_config, str):
        return kafka_config
    kafka_config.setdefault("bootstrap.servers", args.bootstrap_servers)
    try:
        # Named as the user gave them (HttpTransport's own messages name the variables).
        checked_url(url, "--url" if args.url else "OPENLINEAGE_URL")
        api_key = secret_text(
            "--api-key" if args.api_key else "OPENLINEAGE_API_KEY",
            args.api_key or os.environ.get("OPENLINEAGE_API_KEY"),
            header=True,
        )
        transport = HttpTransport(
            url,
            endpoint=args.endpoint,
            batch_endpoint=args.batch_endpoint,
            mode=args.mode,
            batch_format=args.batch_format,
            api_key=api_key,
        )
        return Forwarder(
            kafka_config,
            args.topic,
            transport,
            group_id=args.group_id,
            dead_letter_topic=args.dead_letter_topic,
            progress_interval=args.progress_interval,
            drain_timeout=args.drain_timeout,
            session_timeout=args.session_timeout,
            wait_for_brokers=args.wait_for_brokers,
            print_line=lambda line: print(line, flush=True),
        )
    except ConfigError as exc:
        return str(exc)


def _kafka_config(raw: str | None) -> dict[str, object] | str:
    """``--kafka-config``'s JSON object, or what is wrong with it."""
    try:
        config = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        config = f"is not JSON ({exc.msg} at character {exc.pos + 1})"
    if isinstance(config, dict):
        from ..transports.kafka import SUPPORTED_KEYS, with_suggestion, without_effect

        ignored = without_effect(config)
        if not ignored:
            return config
        return (
            f"--kafka-config: {', '.join(with_suggestion(key) for key in ignored)} would have no effect "
            f"(aiokafka has no equivalent); the keys it reads: {', '.join(sorted(SUPPORTED_KEYS))}"
        )
    why = config if isinstance(config, str) else "is not a JSON object"
    return (
        f"--kafka-config {why}; give an object such as "
        '\'{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}\''
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # its own parser: outbox bench --help
        return _bench_passthrough(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    code: int = args.func(args)
    return code


def build_parser() -> argparse.ArgumentParser:
    """The ``outbox`` command's parser (``bench`` is listed; its own parser is in bench.py)."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="outbox",
        description="lineage-outbox's tools. Each command has its own --help.",
        epilog="The library itself is the Python package outbox: see README.md.",
    )
    parser.add_argument("--version", action="version", version=f"outbox (lineage-outbox) {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_check(commands)
    _add_demo(commands)
    _add_sink(commands)
    _add_forward(commands)
    _add_replay(commands)
    # Listed in --help; parsed by its own parser (outbox bench --help), above.
    commands.add_parser(
        "bench",
        help="load-test what lineage costs a handler, side by side with openlineage-python",
        add_help=False,
    )
    return parser


def _add_check(commands: Commands) -> None:
    """``outbox check``: the configuration in force, and the backend reached once."""
    check = commands.add_parser(
        "check",
        help="check this environment's lineage configuration and reach its backend once",
        description="Resolves the configuration as Outbox.from_env() does (OPENLINEAGE_URL, "
        "OPENLINEAGE__TRANSPORT__*, openlineage.yml, OUTBOX_*), prints the transport and every setting "
        "in force with secrets redacted (nothing configured fails, naming what to set), then reaches the "
        "backend without writing lineage: HTTP, a connection, TLS and the endpoint's answer to an empty "
        "event; Kafka, the brokers' metadata and the topic. DataHub and OpenMetadata are judged by what "
        "they need of the events, on a sample given with --events. One line per check; exits 0 when all "
        "pass, 1 otherwise.",
    )
    check.add_argument(
        "--timeout",
        type=_args.positive_seconds,
        default=5.0,
        help="seconds each check may take (default 5)",
    )
    check.add_argument(
        "--events",
        metavar="FILE",
        help="a sample of the events the pipeline sends (a JSON event, a JSON array, JSON lines or a "
        "dead-letter file), judged against what the backend needs; read here, never sent",
    )
    check.set_defaults(func=_check)


def _add_demo(commands: Commands) -> None:
    """``outbox demo``: a few runs through an outbox into a JSON-lines file."""
    demo = commands.add_parser(
        "demo",
        help="emit a few runs through the outbox into a JSON-lines file, and show what it cost",
        description="Emits START and COMPLETE for a few runs through an Outbox with the file "
        "transport, closes it, and prints emit()'s cost, the close report and the first event.",
    )
    demo.add_argument(
        "--runs",
        type=_args.run_count,
        default=3,
        help="runs to emit, 1 or more (START and COMPLETE each; default 3)",
    )
    demo.add_argument("--file", help="where to write the events (default: a new temporary folder)")
    demo.set_defaults(func=_demo)


def _add_sink(commands: Commands) -> None:
    """``outbox sink``: a local OpenLineage HTTP backend (or one playing Marquez, ...)."""
    sink = commands.add_parser(
        "sink",
        help="run a local OpenLineage HTTP backend that prints what it receives",
        description="Serves the OpenLineage HTTP API on a local port (or as Marquez, OpenMetadata or "
        "DataHub answer it, --flavor), prints one line per accepted event and one per refused request "
        "(its status and reason), and lists what it accepted at GET /api/v1/events.",
    )
    sink.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    sink.add_argument("--port", type=_args.port, default=5000, help="port (default 5000; 0 for a free one)")
    sink.add_argument("--store", metavar="FILE", help="also append accepted events to this JSON-lines file")
    sink.add_argument(
        "--flavor",
        choices=["spec", "marquez", "openmetadata", "datahub"],
        default="spec",
        help="spec (default), or answer as Marquez 0.51.1, OpenMetadata 2.0.7 or DataHub (released) do",
    )
    sink.add_argument(
        "--openmetadata-all-failed-status",
        type=_args.status,
        default=200,
        help="openmetadata: the status of a batch whose events all failed (default 200, as 2.0.7 answers; "
        "newer: 400)",
    )
    sink.add_argument(
        "--openmetadata-tables",
        action="append",
        metavar="FQNS",
        help="openmetadata: the tables the server has, comma-separated service.db.schema.table names "
        "(repeatable); lineageEdgesCreated counts an edge only where both ends resolve to one",
    )
    sink.add_argument(
        "--delay",
        type=_args.seconds_or_zero,
        default=0.0,
        help="seconds to wait before each answer (default 0)",
    )
    sink.add_argument("--fail-status", type=_args.status, help="answer this HTTP status instead of accepting")
    sink.add_argument(
        "--fail-rate", type=_args.fraction, default=1.0, help="fraction of requests that fail (default 1)"
    )
    sink.add_argument("--retry-after", help="Retry-After value sent with --fail-status")
    sink.add_argument("--single-only", action="store_true", help="answer 404 on the batch route")
    sink.add_argument("--api-key", help="require Authorization: Bearer API_KEY")
    sink.add_argument("--max-body", type=_args.byte_count, help="answer 413 to larger bodies (bytes)")
    sink.add_argument("--quiet", action="store_true", help="do not print a line per event")
    sink.add_argument(
        "--verbose",
        action="store_true",
        help="print a line per request (status and reason), not only per refused request",
    )
    sink.set_defaults(func=_sink)


def _add_forward(commands: Commands) -> None:
    """``outbox forward``: Kafka to HTTP, at least once."""
    fwd = commands.add_parser(
        "forward",
        help="consume OpenLineage events from Kafka and post them over HTTP, at least once",
        description="Consumes TOPIC in a consumer group and posts its events through HttpTransport. "
        "At least once: a partition's offsets are committed only after its events were delivered or "
        "rejected, so a forwarder that dies (or is stopped while the backend is down) leaves them to "
        "be sent again. Retries are paced by the outbox's bounded backoff, for as long as the backend "
        "fails; SIGTERM drains for --drain-timeout seconds and exits 0. Exits 1 when the brokers "
        "cannot be reached (unless --wait-for-brokers), 2 for bad input.",
    )
    fwd.add_argument(
        "--bootstrap-servers", default="localhost:9092", help="Kafka brokers (default localhost:9092)"
    )
    fwd.add_argument("--topic", required=True, help="the topic to read")
    fwd.add_argument("--group-id", default="outbox-forward", help="consumer group (default outbox-forward)")
    fwd.add_argument("--kafka-config", help="librdkafka-style JSON settings (security, client.id, ...)")
    fwd.add_argument("--dead-letter-topic", help="where records that are not events go (default: skip them)")
    _add_http_backend_arguments(fwd)
    fwd.add_argument(
        "--progress-interval",
        type=_args.seconds_or_zero,
        default=10.0,
        help="seconds between progress lines (default 10; 0: none)",
    )
    fwd.add_argument(
        "--drain-timeout",
        type=_args.seconds_or_zero,
        default=10.0,
        help="seconds to finish the batch at SIGTERM (default 10)",
    )
    fwd.add_argument(
        "--session-timeout",
        type=_args.positive_seconds,
        default=10.0,
        help="consumer group session in seconds (default 10; Kafka brokers take 6 or more unless "
        "their group.min.session.timeout.ms is lower)",
    )
    fwd.add_argument(
        "--wait-for-brokers",
        action="store_true",
        help="brokers unreachable at start: retry, with a progress line, until they answer or "
        "SIGTERM (default: exit 1 at once, naming them)",
    )
    fwd.set_defaults(func=_forward)


def _add_http_backend_arguments(fwd: argparse.ArgumentParser) -> None:
    """``outbox forward``'s HTTP side: where and how it posts (HttpTransport's settings)."""
    fwd.add_argument("--url", help="the HTTP backend (default $OPENLINEAGE_URL)")
    fwd.add_argument(
        "--endpoint", default="api/v1/lineage", help="single-event path (default api/v1/lineage)"
    )
    fwd.add_argument(
        "--batch-endpoint", default="api/v1/lineage/batch", help="batch path (default api/v1/lineage/batch)"
    )
    fwd.add_argument(
        "--mode", choices=["auto", "batch", "single"], default="auto", help="HTTP mode (default auto)"
    )
    fwd.add_argument(
        "--batch-format",
        choices=["array", "openmetadata"],
        default="array",
        help="batch body: the spec's JSON array (default), or OpenMetadata's {\"events\": [...]}",
    )
    fwd.add_argument("--api-key", help="bearer token (default $OPENLINEAGE_API_KEY)")


def _add_replay(commands: Commands) -> None:
    """``outbox replay``: a dead-letter file sent again, resumable."""
    replay = commands.add_parser(
        "replay",
        help="send a dead-letter file (or any JSON-lines file of events) to the configured backend "
        "again, at least once",
        description="Sends the events of FILE through the transport Outbox.from_env() configures "
        "(OPENLINEAGE_URL, OPENLINEAGE__TRANSPORT__*, openlineage.yml, OUTBOX_*), at least once: "
        "what the backend acknowledges is recorded in FILE.replayed as it goes, so a second run "
        "sends only the rest; an event whose acknowledgement was not seen (the deadline, a crash) "
        "goes again next time. Torn records (a writer cut off mid-record) are skipped with one "
        "warning. Prints one summary line (what was delivered, and what is left in FILE for the "
        "next run, by reason); exits 0 when nothing is left to send, 1 when events remain (run it "
        "again), 2 for bad input or no configured backend (unless --console).",
    )
    replay.add_argument(
        "file", metavar="FILE", help="a dead-letter file, or JSON lines of OpenLineage events"
    )
    replay.add_argument(
        "--timeout",
        type=_args.positive_seconds,
        default=30.0,
        help="seconds the whole replay may take, whatever the file's size (default 30); what is "
        "not delivered by then is left for the next run",
    )
    replay.add_argument(
        "--console",
        action="store_true",
        help="print the events to standard output instead of sending them (records nothing; "
        "the summary goes to standard error)",
    )
    replay.add_argument(
        "--progress",
        metavar="PATH",
        help="where to record what was delivered (default FILE.replayed)",
    )
    replay.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    from .replay import replay

    return replay(
        args.file,
        timeout=args.timeout,
        console=args.console,
        progress=args.progress,
        out=sys.stdout,
        err=sys.stderr,
    )


def _check(args: argparse.Namespace) -> int:
    import os

    from .check import run

    return run(os.environ, timeout=args.timeout, events_file=args.events)


def _bench_passthrough(argv: Sequence[str]) -> int:
    from .bench import main as bench_main

    return bench_main(argv)


if __name__ == "__main__":
    sys.exit(main())
