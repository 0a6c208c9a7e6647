"""What a failing run costs the handler: ``with outbox.run(job):`` around a body that raises from
DEPTH frames down, timed from the ``with`` to the exception caught (the raise and unwinding
included, as a handler feels it), 3,000 times per depth against the memory transport.  Prints
p50 and p99 per depth.  To compare two trees, run it from outside any checkout with each on
PYTHONPATH:

    PYTHONPATH=/tmp/before python tests/scripts/fail_cost.py
"""

import statistics
import time

from outbox import LineageJob, Outbox
from outbox.transports import MemoryTransport

outbox = Outbox(MemoryTransport(), close_at_exit=False)
job = LineageJob("ns", "job")


def deep(n: int) -> None:
    if n == 0:
        raise ValueError("cannot process bucket/key")
    deep(n - 1)


for depth in (3, 10, 30, 300):
    samples = []
    for i in range(3000):
        began = time.perf_counter_ns()
        try:
            with outbox.run(job):
                deep(depth)
        except ValueError:
            pass
        samples.append(time.perf_counter_ns() - began)
        if i % 500 == 0:
            outbox.flush(10)
    q = statistics.quantiles(samples[200:], n=100)
    print(f"raised {depth:3d} frames down: p50 {q[49] / 1e3:6.1f} µs, p99 {q[98] / 1e3:6.1f} µs")
outbox.close(5)
