"""One count of ``python -m outbox.tools.benchmarks instructions``: ``CASE CALLS``.

Run by path (under valgrind) so that ``PYTHONPATH`` can put another checkout's ``outbox``
first; it uses only the public API every release has had.  Builds the outbox and the events,
lets the sidecar settle, makes ``CALLS`` calls, and leaves with ``os._exit`` (so that the
close, which differs with the number of events, is not counted).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any


def main() -> None:
    case, calls = sys.argv[1], int(sys.argv[2])
    from outbox import LineageJob, Outbox, s3_dataset
    from outbox.transports import MemoryTransport

    # The sidecar idle for the whole run: nothing it does is counted against the caller.  Nor
    # its sampling of the queued objects (every 10 ms of wall time while new ones come: under
    # valgrind, thousands of instructions a call that vary from run to run), where the tree has it.
    try:
        from outbox import _intake

        _intake.SAMPLE_INTERVAL = 3600.0
    except (ImportError, AttributeError):
        pass
    outbox = Outbox(
        MemoryTransport(),
        linger=3600,
        max_events=10 * calls + 10,
        max_batch_events=10 * calls + 10,
        max_bytes=1 << 34,
        max_batch_bytes=1 << 30,
    )
    emit = outbox.emit
    event: Any
    if case == "object":
        from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

        event = RunEvent(
            eventType=RunState.START,
            eventTime="2026-12-03T10:00:00.000000+00:00",
            run=Run(runId="01934a57-8d6f-7c5e-9a3b-123456789abc"),
            job=Job(namespace="vast-dataengine://my-tenant", name="lineage-demo.lineagefn"),
            producer="https://example.com/lineage-outbox/benchmarks",
        )
    elif case == "dict":
        event = {"eventType": "START", "run": {"runId": "01934a57-8d6f-7c5e-9a3b-123456789abc"}}
    else:
        event = b'{"eventType":"START","run":{"runId":"01934a57-8d6f-7c5e-9a3b-123456789abc"}}'
    job = LineageJob("vast-dataengine://my-tenant", "lineage-demo.lineagefn")
    # The first event of each kind takes the slow path once (the sidecar measures objects).
    emit(event)
    with outbox.run(job, inputs=[s3_dataset("bench-src", "warm.csv")]):
        pass
    # The sidecar started, and done with them, before counting: under valgrind its start-up
    # takes seconds, and what of it ran in one count and not in the other was counted as calls'.
    outbox.flush(300)
    time.sleep(0.5)
    gc.disable()
    if case == "helpers":
        run = outbox.run
        for _ in range(calls):
            with run(job, inputs=[s3_dataset("bench-src", "object.csv")]):
                pass
    elif case in ("helpers-span", "span-only"):
        in_spans(outbox, job, case == "helpers-span", calls)
    else:
        for _ in range(calls):
            emit(event)
    print(f"accepted {outbox.stats().accepted}", flush=True)  # (what the tests check)
    os._exit(0)


def in_spans(outbox: Any, job: Any, runs: bool, calls: int) -> None:
    """What a DataEngine handler does: each call in a span of its own trace, once 5,000
    traces have run (a container that has served a while).  ``span-only`` enters and leaves
    the same spans without a run: the runtime's part, taken off the helpers' figure."""
    from opentelemetry import context, trace

    from outbox import s3_dataset

    def contexts(count: int, first: int) -> list[Any]:
        ids = range(first, first + count)
        spans = [trace.NonRecordingSpan(trace.SpanContext(i, 1, is_remote=False)) for i in ids]
        return [trace.set_span_in_context(span) for span in spans]

    run = outbox.run
    for ctx in contexts(5000, 1 << 100):
        token = context.attach(ctx)
        run(job)
        context.detach(token)
    counted = contexts(calls, 1 << 101)
    gc.collect()
    for ctx in counted:
        token = context.attach(ctx)
        if runs:
            with run(job, inputs=[s3_dataset("bench-src", "object.csv")]):
                pass
        context.detach(token)


if __name__ == "__main__":
    main()
