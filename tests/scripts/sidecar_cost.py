"""The sidecar's per-event work against a healthy backend, without threads or sockets: 50,000 runs
of the run helpers (START + COMPLETE, one input each) queued in a buffer, then taken by the intake
(serialized), added to the backlog, taken in lanes of 1,000 and settled as delivered, as the worker
does.  Thread CPU per event, best of REPEATS (the machine's load does not add to it).  Needs the
worker in parts (intake, backlog); to compare two trees, run it from outside any checkout with
each on PYTHONPATH:

    PYTHONPATH=/tmp/before python tests/scripts/sidecar_cost.py [RUNS [REPEATS]]
"""

import sys
import time

from outbox import s3_dataset
from outbox._buffer._buffer import Buffer
from outbox._observability._log import RateLimitedLog
from outbox._run._run import Run
from outbox._run._serde import serialize
from outbox._runtime._slices import Slicer
from outbox._worker._backlog import Backlog
from outbox._worker._intake import Intake
from outbox.tools.benchmarks import throughput
from outbox.transports import DELIVERED

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5


class Recorder:
    """An emitter that keeps what the run helpers emit."""

    def __init__(self) -> None:
        self.events: list[object] = []

    def emit(self, event: object) -> bool:
        self.events.append(event)
        return True

    async def emit_async(self, event: object) -> bool:
        return self.emit(event)


recorder = Recorder()
job = throughput._job()
for i in range(runs):
    with Run(recorder, job, inputs=[s3_dataset("bench-src", f"in/{i}.csv")]):
        pass
events = recorder.events


def once() -> float:
    buf = Buffer(max_events=len(events) + 1, max_bytes=2**31, policy="drop_newest", block_timeout=0.0)
    for event in events:
        buf.put(event, 0)
    slicer = Slicer(buf, enabled=False)
    backlog = Backlog(5)
    intake = Intake(
        buf,
        max_batch_events=1000,
        max_batch_bytes=1 << 20,
        linger=0.1,
        slicer=slicer,
        log=RateLimitedLog(60),
        dead_letter=None,
        lowest_held=backlog.lowest_seq,
    )
    slicer.on_handoff = intake.sample
    started = time.thread_time()
    while buf.holdings.queue:
        backlog.add(intake.take(1000, 1 << 20, 1 << 20))
        lane = backlog.take_lane(0.0, 1000, 1 << 20)
        settled = backlog.settle(lane, [DELIVERED] * len(lane), 0.0, lambda *_: 0.0)
        with buf.lock:
            buf.settle_locked(len(settled.delivered), settled.size, backlog.lowest_seq())
    return (time.thread_time() - started) / len(events)


def serialize_only() -> float:
    started = time.thread_time()
    for event in events:
        serialize(event)
    return (time.thread_time() - started) / len(events)


print(
    f"sidecar's work per event: {min(once() for _ in range(repeats)) * 1e6:.2f} us "
    f"(serialize alone {min(serialize_only() for _ in range(repeats)) * 1e6:.2f} us), best of {repeats}"
)
