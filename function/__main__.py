"""``python -m function``: run lineagefn locally, the way DataEngine runs it.

It plays the platform: sets the ``VASTPIPELINE_*`` variables, installs an OpenTelemetry
SDK tracer so each call runs inside a real span (whose trace id becomes the run id),
calls ``init`` once and ``handler`` for each object, then shuts down. With no backend in
the environment it starts ``outbox sink`` on a free loopback port and shows what arrived.

    python -m function                              # the two demo objects
    python -m function docs-src/lineage-src/a.csv   # or bucket/key of your own
    python -m function bundle                       # put the library's wheel in function/wheels

Exit status 0 when everything behaved as expected (the .bad object fails on purpose).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

DEFAULT_OBJECTS = ("docs-src/lineage-src/orders.csv", "docs-src/lineage-src/orders.bad")
PLATFORM_ENV = {
    "VASTPIPELINE_PIPELINE_NAME": "lineage-demo",
    "VASTPIPELINE_FUNCTION_DEPLOYMENT_NAME": "lineagefn",
    "LINEAGE_NAMESPACE": "vast-dataengine://my-tenant",
}
BACKEND_VARIABLES = (
    "OPENLINEAGE_URL",
    "OPENLINEAGE__TRANSPORT__TYPE",
    "OPENLINEAGE__TRANSPORT",
    "OPENLINEAGE_CONFIG",
)


@dataclass
class Invocation:
    """One handler call as the platform saw it."""

    bucket: str
    key: str
    trace_id: str  # 32 hex digits
    run_id: str | None
    error: str | None
    seconds: float  # the whole handler call
    lineage_seconds: float  # what lineage cost inside it


_tracer_provider: Any = None


def tracer() -> Any:
    """A tracer from an OpenTelemetry SDK provider, installed once per process as the
    platform's runtime would."""
    global _tracer_provider
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    if _tracer_provider is None:
        _tracer_provider = TracerProvider()
        trace.set_tracer_provider(_tracer_provider)
    return trace.get_tracer("dataengine-local")


def simulate(objects: Sequence[str], module: Any = None) -> tuple[Any, list[Invocation]]:
    """``init`` once, then one traced ``handler`` call per ``bucket/key``; returns the
    function module and what each call did.  The caller shuts the function down."""
    if module is None:
        from function import main as module
    ctx = SimpleNamespace(logger=logging.getLogger("lineagefn"), function_name="lineagefn-7c66f295")
    module.init(ctx)
    job = getattr(module, "job", None)
    if job is not None:
        job.timed = True  # (what each run's lineage cost the handler: run.overhead)
    spans = tracer()
    invocations = []
    for item in objects:
        bucket, _, key = item.partition("/")
        event = SimpleNamespace(bucket=bucket, object_key=key)
        with spans.start_as_current_span("lineagefn") as span:
            trace_id = f"{span.get_span_context().trace_id:032x}"
            error = None
            started = time.perf_counter()
            try:
                module.handler(ctx, event)
            except Exception as exc:  # the platform records it; so do we
                error = f"{type(exc).__name__}: {exc}"
            seconds = time.perf_counter() - started
        run = getattr(getattr(module, "job", None), "last_run", None)
        invocations.append(
            Invocation(
                bucket,
                key,
                trace_id,
                run.run_id if run else None,
                error,
                seconds,
                run.overhead if run else 0.0,
            )
        )
    return module, invocations


@contextmanager
def platform_environment(environ: Mapping[str, str] | None = None) -> Iterator[Any]:
    """Set the platform's variables (keeping any already set); start ``outbox sink`` when the
    environment names no backend. Yields the sink, or None."""
    for name, value in {**PLATFORM_ENV, **(environ or {})}.items():
        os.environ.setdefault(name, value)
    if any(os.environ.get(name) for name in BACKEND_VARIABLES):
        yield None
        return
    from outbox.tools.sink import Sink

    with Sink(echo=True) as sink:
        os.environ["OPENLINEAGE_URL"] = sink.url
        try:
            yield sink
        finally:
            del os.environ["OPENLINEAGE_URL"]


def expected(invocations: Sequence[Invocation]) -> list[str]:
    """What went wrong, compared with what the demo promises (empty: all as expected)."""
    problems = []
    for call in invocations:
        should_fail = call.key.endswith(".bad")
        if should_fail != (call.error is not None):
            problems.append(
                f"{call.key}: expected {'a failure' if should_fail else 'success'}, got {call.error}"
            )
        if call.run_id != _as_uuid(call.trace_id):
            problems.append(f"{call.key}: run id {call.run_id} is not trace {call.trace_id}")
    return problems


def _as_uuid(trace_id: str) -> str:
    return f"{trace_id[:8]}-{trace_id[8:12]}-{trace_id[12:16]}-{trace_id[16:20]}-{trace_id[20:]}"


def run(objects: Sequence[str]) -> int:
    # The function's own log at INFO, as the platform shows it; libraries (httpx logs every
    # request at INFO) and the outbox only from WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s [%(name)s] %(message)s")
    logging.getLogger("lineagefn").setLevel(logging.INFO)
    with platform_environment() as sink:
        where = f"outbox sink on {sink.url}" if sink else "the backend named by the environment"
        print(
            f"DataEngine (local): pipeline {os.environ['VASTPIPELINE_PIPELINE_NAME']}, function "
            f"{os.environ['VASTPIPELINE_FUNCTION_DEPLOYMENT_NAME']}, lineage to {where}",
            flush=True,
        )
        module, invocations = simulate(objects)
        report = module.outbox.close()  # what SIGTERM or exit does on the platform
        received = sink.events if sink else []
    problems = expected(invocations)
    print(
        "\nobject                              outcome   trace id                          "
        "lineage run id                        handler   of which lineage"
    )
    for call in invocations:
        outcome = "FAIL" if call.error else "ok"
        print(
            f"{call.bucket + '/' + call.key:<36}{outcome:<10}{call.trace_id}  {call.run_id}  "
            f"{call.seconds * 1e6:>7.0f} µs  {call.lineage_seconds * 1e6:>7.1f} µs"
        )
    print(f"\nclose(): delivered {report.delivered}, lost {dict(report.undelivered) or 'none'}")
    if sink is not None:
        print(f"the sink received {len(received)} events:")
        for event in received:
            facets = event["run"].get("facets", {})
            error = (
                f"  errorMessage={facets['errorMessage']['message']!r}" if "errorMessage" in facets else ""
            )
            print(
                f"  {event['eventType']:<9}{event['inputs'][0]['namespace']}/{event['inputs'][0]['name']:<24}"
                f"run {event['run']['runId']}{error}"
            )
        kinds = sorted((e["inputs"][0]["name"], e["eventType"]) for e in received)
        want = sorted(
            (call.key, state)
            for call in invocations
            for state in ("START", "FAIL" if call.error else "COMPLETE")
        )
        if kinds != want:
            problems.append(f"the sink received {kinds}, expected {want}")
    last_error = module.outbox.stats().last_error
    unreached = sink is None and report.delivered == 0 and set(report.undelivered) == {"dropped_shutdown"}
    if unreached and last_error is not None and " answered " in last_error:
        # It answered, and took nothing: credentials, an endpoint, a server error; not a backend
        # that is down, which the outbox is there to ride out.
        problems.append(
            f"the backend answered and took none of the events ({last_error}); see `outbox check`"
        )
    elif unreached:
        # The backend took nothing by close()'s deadline (down, unreachable, or refusing all for
        # now): the point of the outbox is that the handler went on regardless, and said so.
        print(
            f"\nexpected: the backend ({module.outbox.transport!r}) took none of the "
            f"{report.undelivered['dropped_shutdown']} events by close()'s deadline "
            f"({last_error or 'no answer'}); they are counted as dropped_shutdown, "
            "and the handlers above were neither slowed nor failed by it"
        )
    elif not report.complete:
        problems.append(f"undelivered: {dict(report.undelivered)}")
    for problem in problems:
        print(f"UNEXPECTED: {problem}")
    print("\nall as expected" if not problems else f"\n{len(problems)} unexpected result(s)")
    return 0 if not problems else 1


def bundle() -> int:
    """Build lineage-outbox's wheel into function/wheels, for the platform's builder."""
    here = Path(__file__).resolve().parent
    wheels = here / "wheels"
    wheels.mkdir(exist_ok=True)
    for old in wheels.glob("lineage_outbox-*.whl"):
        old.unlink()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(here.parent)],
        check=True,
    )
    built = sorted(wheels.glob("lineage_outbox-*.whl"))
    print(f"built {built[-1].relative_to(here)}; function/requirements.txt installs it from ./wheels")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m function", description=__doc__.split("\n")[0])
    parser.add_argument(
        "objects",
        nargs="*",
        help="bucket/key of each object (default: the two demo objects), "
        "or 'bundle' to build the wheel for deployment",
    )
    args = parser.parse_args(argv)
    if args.objects == ["bundle"]:
        return bundle()
    return run(args.objects or DEFAULT_OBJECTS)


if __name__ == "__main__":
    sys.exit(main())
