"""The process's CPU per delivered event against a backend that does no work (the `--only healthy`
scenario of `python -m outbox.tools.benchmarks`, batch mode, runs of START + COMPLETE emitted at
once, then close), with the wall-clock split into emitting and closing.  CPU time, unlike the
events/s of the benchmark, holds on a machine shared with other work.  To compare two trees, run it
from outside any checkout with each on PYTHONPATH, interleaved:

    PYTHONPATH=/tmp/before python tests/scripts/healthy_cpu.py [RUNS [LANES [REPEATS]]]

It also prints the sidecar thread's own CPU per delivered event (its whole life, on its thread
clock): the part that bounds events/s once the handler has emitted everything.
"""

import sys
import time

from outbox import Outbox
from outbox._worker import _sidecar
from outbox.tools.benchmarks import throughput
from outbox.transports import HttpTransport

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
lanes = int(sys.argv[2]) if len(sys.argv) > 2 else 1
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
sidecar_cpu: list[float] = []
thread_main = _sidecar.Sidecar._thread_main


def _counted(self, loop, worker):  # type: ignore[no-untyped-def]
    try:
        thread_main(self, loop, worker)
    finally:
        sidecar_cpu.append(time.thread_time())


_sidecar.Sidecar._thread_main = _counted  # type: ignore[method-assign]
with throughput.Server(*throughput.NULL_SERVER) as url:
    for _ in range(repeats):
        outbox = Outbox(
            HttpTransport(url, mode="batch"),
            max_events=2 * runs,
            max_bytes=2**31,
            max_concurrency=lanes,
            close_at_exit=False,
        )
        job = throughput._job()
        cpu, started = time.process_time(), time.perf_counter()
        throughput._emit_runs(outbox, job, runs)
        emitted = time.perf_counter()
        report = outbox.close(300)
        ended = time.perf_counter()
        cpu = time.process_time() - cpu
        print(
            f"max_concurrency={lanes} emit {emitted - started:.2f} s, close {ended - emitted:.2f} s: "
            f"{report.delivered / (ended - started):,.0f} events/s; "
            f"CPU {cpu / report.delivered * 1e6:.1f} us per delivered event "
            f"(the sidecar's thread {sidecar_cpu[-1] / report.delivered * 1e6:.1f})"
        )
