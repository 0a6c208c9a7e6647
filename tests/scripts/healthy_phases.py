"""Where the wall-clock of the healthy scenario goes (``healthy_cpu.py``'s runs, a server per
process): for the emitting phase and the close, the sidecar thread's time on a CPU, waiting in the
run queue (other work on the machine), and waiting otherwise (for the GIL, or for an answer), from
Linux's /proc/<pid>/task/<tid>/schedstat.  Run from outside any checkout with a tree on PYTHONPATH:

    PYTHONPATH=/tmp/before python tests/scripts/healthy_phases.py [RUNS [LANES [REPEATS]]]
"""

import sys
import threading
import time

from outbox import Outbox
from outbox._worker import _sidecar
from outbox.tools.benchmarks import throughput
from outbox.transports import HttpTransport

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
lanes = int(sys.argv[2]) if len(sys.argv) > 2 else 1
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 1
ended: list[tuple[float, tuple[float, float]]] = []
thread_main = _sidecar.Sidecar._thread_main


def sched(path: str) -> tuple[float, float]:
    """Seconds on a CPU, and waiting in the run queue."""
    with open(path) as f:
        on, queued, _ = map(int, f.read().split())
    return on / 1e9, queued / 1e9


def _ended(self, loop, worker):  # type: ignore[no-untyped-def]
    try:
        thread_main(self, loop, worker)
    finally:
        ended.append((time.perf_counter(), sched("/proc/thread-self/schedstat")))


def row(before: tuple[float, float], after: tuple[float, float], wall: float) -> str:
    cpu, queued = after[0] - before[0], after[1] - before[1]
    return f"{wall:.2f}s = cpu {cpu:.2f} + run queue {queued:.2f} + waiting {wall - cpu - queued:.2f}"


_sidecar.Sidecar._thread_main = _ended  # type: ignore[method-assign]
with throughput.Server(*throughput.NULL_SERVER) as url:
    for _ in range(repeats):
        outbox = Outbox(
            HttpTransport(url, mode="batch"),
            max_events=2 * runs,
            max_bytes=2**31,
            max_concurrency=lanes,
            close_at_exit=False,
        )
        outbox.emit({"eventType": "START", "run": {"runId": "warm-up"}})
        outbox.flush(30)  # the sidecar's thread runs
        (sidecar,) = [t for t in threading.enumerate() if t.name == "outbox-sidecar"]
        path = f"/proc/self/task/{sidecar.native_id}/schedstat"
        t0, s0 = time.perf_counter(), sched(path)
        throughput._emit_runs(outbox, throughput._job(), runs)
        t1, s1 = time.perf_counter(), sched(path)
        delivered = outbox.close(300).delivered - 1
        t2, s2 = ended[-1]
        print(
            f"max_concurrency={lanes} {delivered / (t2 - t0):,.0f} events/s; the sidecar's thread: "
            f"emitting {row(s0, s1, t1 - t0)} | closing {row(s1, s2, t2 - t1)}",
            flush=True,
        )
