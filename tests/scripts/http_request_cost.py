"""What one HTTP request costs the sidecar's thread, by batch size: ``HttpTransport.send`` of a
batch of N serialized events to the does-no-work null server (its own process), one request at a
time.  Prints, per size, the thread CPU per request (best of REPEATS) and the longest steps of the
loop's callbacks meanwhile (the Python that runs between two awaits, which the sidecar's slices
cannot cut: a handler that wants the GIL then waits it out); for the transport's own HTTP/1.1
client (what a plain ``http://`` URL gets) and, in the same run, httpx's (what ``https://`` and
proxies get).  To compare two trees, run it from outside any checkout with each on PYTHONPATH:

    PYTHONPATH=/tmp/before python tests/scripts/http_request_cost.py [REQUESTS [REPEATS]]
"""

import asyncio
import asyncio.events
import statistics
import subprocess
import sys
import time

import orjson

from outbox import SerializedEvent
from outbox.transports import HttpTransport
from outbox.transports import http as http_module
from outbox.transports._http import _settings

requests = int(sys.argv[1]) if len(sys.argv) > 1 else 200
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
steps: list[int] = []
_run = asyncio.events.Handle._run


def _timed_run(self: asyncio.events.Handle) -> None:
    started = time.thread_time_ns()
    try:
        _run(self)
    finally:
        steps.append(time.thread_time_ns() - started)


asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]
body = orjson.dumps({"eventType": "START", "eventTime": "2026-12-06T00:00:00Z", "pad": "x" * 500})


async def main(url: str, client: str) -> None:
    transport = HttpTransport(url)
    print(f"{client}: {requests} requests per run, best of {repeats} (thread CPU, µs)")
    print("  events/request   CPU/request   steps/request   step p50   step p99   step max")
    for size in (1, 100, 1000):
        batch = [SerializedEvent(body, f"run-{i}", None) for i in range(size)]
        await transport.send(batch, time.monotonic() + 30)  # the connection made
        best = float("inf")
        for _ in range(repeats):
            steps.clear()
            began = time.thread_time_ns()
            for _ in range(requests):
                await transport.send(batch, time.monotonic() + 30)
            best = min(best, (time.thread_time_ns() - began) / requests)
        q = statistics.quantiles(steps, n=100)
        print(
            f"  {size:14,d} {best / 1e3:13,.0f} {len(steps) / requests:15.1f}"
            f" {q[49] / 1e3:10,.0f} {q[98] / 1e3:10,.0f} {max(steps) / 1e3:10,.0f}"
        )
    await transport.aclose()


server = subprocess.Popen(
    [sys.executable, "-m", "outbox.tools.benchmarks.nullserver", "--port", "0"],
    stdout=subprocess.PIPE,
    text=True,
)
try:
    assert server.stdout is not None
    address = server.stdout.readline().split()[-1]
    asyncio.run(main(address, "the transport's own client"))
    httpx_client = getattr(_settings, "httpx_client", None)  # (absent from a tree before it)
    if httpx_client is not None:
        http_module.new_client = lambda *args, posts_to=(): httpx_client(*args)  # type: ignore[attr-defined]
        asyncio.run(main(address, "httpx"))
finally:
    server.terminate()
    server.wait()
