"""Floods an outbox whose backend is down with 100 KB events of one kind; prints how much the
process grew (peak RSS) and what the outbox holds.  Used by tests/integration/buffer/test_memory.py:

    python tests/scripts/flood.py dict 20000 [HOLD]

With HOLD, it waits (up to 60 s: the sidecar may get little CPU on a loaded machine) until the
outbox holds at most HOLD events before it reports what it holds: objects are counted at an
estimate that the sidecar keeps true by sampling the newest ones, so when they grow, the byte
bound is enforced within the sampling interval.
"""

import resource
import socket
import sys
import time
import uuid

import orjson

from outbox import Outbox
from outbox.transports import HttpTransport

kind, count = sys.argv[1], int(sys.argv[2])
hold = int(sys.argv[3]) if len(sys.argv) > 3 else None


class Text(str):
    pass


class Blob(bytes):
    pass


def rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


with socket.socket() as probe:  # a port nothing listens on: the backend is down
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
outbox = Outbox(HttpTransport(f"http://127.0.0.1:{port}"), max_bytes=64 * 1024 * 1024, close_at_exit=False)
if kind == "object":
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
before = rss()
started = time.monotonic()
pad = "x" * 100_000
for i in range(count):
    body = pad[:-8] + f"{i:08d}"  # distinct 100 KB each
    if kind == "growing" and i < 2000:
        body = body[-200:]  # small ones first: the estimate learnt from them is short
    if kind == "mix" and i % 4:
        body = body[-200:]  # three small ones for each large one
    if kind == "textafter" and i < 500:
        body = body[-200:]  # small objects first (measured: the estimate is short), then text
    run = {"runId": str(uuid.uuid4()), "facets": {"p": {"_producer": "p", "_schemaURL": "s", "x": body}}}
    event = {
        "eventType": "START",
        "eventTime": "2026-12-02T10:00:00+00:00",
        "producer": "p",
        "schemaURL": "s",
        "run": run,
        "job": {"namespace": "n", "name": "j"},
    }
    if kind in ("dict", "growing", "mix") or (kind == "textafter" and i < 500):
        outbox.emit(event)
    elif kind in ("str", "strsub", "textafter"):
        text = orjson.dumps(event).decode()
        outbox.emit(text if kind == "str" else Text(text))
    elif kind in ("bytes", "bytessub"):
        raw = orjson.dumps(event)
        outbox.emit(raw if kind == "bytes" else Blob(raw))
    elif kind == "object":
        outbox.emit(
            RunEvent(
                eventType=RunState.START,
                eventTime="2026-12-02T10:00:00+00:00",
                run=Run(runId=str(uuid.uuid4())),
                job=Job(namespace="n", name=body),
            )
        )
took = time.monotonic() - started
if hold is not None:
    wait_until = time.monotonic() + 60
    while time.monotonic() < wait_until:
        st = outbox.stats()
        if st.queued_events + st.in_flight <= hold:
            break
        time.sleep(0.01)
grown = rss() - before
st = outbox.stats()
held = st.queued_events + st.in_flight
print(grown, held, st.dropped)
print(
    f"{kind}: grew {grown:.0f} MiB in {took:.1f} s; holds {held} events; dropped {st.dropped}",
    file=sys.stderr,
)
outbox.close(0)
