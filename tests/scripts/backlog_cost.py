"""The backlog's own bookkeeping per event, on this thread's CPU clock: runs of two events added in
batches of 1,000, taken in lanes of 1,000 and delivered (what the sidecar does with them against a
healthy backend, without serializing or sending).  Prints the best of REPEATS.  To compare two
trees, run it with each on PYTHONPATH:

    PYTHONPATH=/tmp/before python tests/scripts/backlog_cost.py [RUNS [LANES [REPEATS]]]
"""

import sys
import time
import uuid

from outbox._run._serde import SerializedEvent
from outbox._worker._backlog import Backlog
from outbox._worker._held import Held
from outbox.transports import DELIVERED

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
lanes = int(sys.argv[2]) if len(sys.argv) > 2 else 1
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 5
items = [
    Held(2 * run + n, SerializedEvent(b"{}", run_id, "job:ns/name"), 300)
    for run, run_id in enumerate(str(uuid.uuid4()) for _ in range(runs))
    for n in range(2)
]


def once() -> float:
    backlog = Backlog(5)
    delay = lambda *_: 0.0  # noqa: E731
    on_wire: list[list[Held]] = []
    position = 0
    started = time.thread_time()
    while position < len(items) or len(backlog):
        if position < len(items):
            backlog.add(items[position : position + 1000])
            position += 1000
        while len(on_wire) < lanes:
            lane = backlog.take_lane(0.0, 1000, 1 << 30)
            if not lane:
                break
            on_wire.append(lane)
        if on_wire:
            lane = on_wire.pop(0)
            backlog.settle(lane, [DELIVERED] * len(lane), 0.0, delay)
    return (time.thread_time() - started) / len(items)


best = min(once() for _ in range(repeats))
print(f"backlog bookkeeping, {lanes} lane(s): {best * 1e6:.2f} us per event (best of {repeats})")
