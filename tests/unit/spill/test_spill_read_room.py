"""Reading the stretch back beside the overflow, with real parts stepped by hand: the read takes
what the buffer's bounds leave beside the overflow, never an event past its bytes, and waits
(without spinning) for room the overflow's write will free; only when nothing else could ever
free room (no queue, the overflow stuck on a failing disk) does it take one event past them."""

from __future__ import annotations

import time

import orjson

from outbox._buffer._buffer import Buffer, Policy
from outbox._run._serde import serialize, weight
from outbox._spill import Spill

from support.helpers import run_event

RUN = "00000000-0000-4000-8000-000000000001"
SIZE = 1000


def text(n: int) -> bytes:
    body = orjson.dumps(run_event(run_id=RUN, n=n))
    return body[:-1] + b',"pad":"' + b"x" * (SIZE - len(body) - 9) + b'"}'


def held_bytes(buf: Buffer) -> int:
    held = buf.holdings
    return held.held_bytes_locked() + held.overflow.bytes(held.estimate)


def test_a_read_waits_for_room_beside_the_overflow_and_takes_one_past_it_only_when_stuck(tmp_path):
    assert len(text(0)) == SIZE
    each = weight(serialize(text(0)))  # what a read-back event counts for (its key too)
    buf = Buffer(max_events=100, max_bytes=8_000, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    spill = Spill(tmp_path, adopt=False)
    spill.attach(buf)
    window, held = spill.window, buf.holdings
    n = 0
    while not window.active:  # the queue's window (4,000 bytes), then the overflow
        assert buf.put(text(n), SIZE)
        n += 1
    for _ in range(2):
        assert buf.put(text(n), SIZE)
        n += 1
    spill.tick(buf, None, 0.0, force=True)  # the queue and the overflow on disk: a stretch
    assert window.disk == 3 and not window.events
    queued = len(held.queue)
    with buf.lock:  # the queue delivered: empty, nothing in flight
        taken = held.take_locked(100, 10**9)
        buf.settle_locked(len(taken), held.in_flight_bytes, float("inf"))
    assert not held.queue and not held.in_flight
    spill.disk.retry_at = time.monotonic() + 60  # the disk fails: the overflow cannot be written
    for _ in range(7):  # the overflow leaves less than one read-back event's bytes
        assert buf.put(text(n), SIZE)
        n += 1
    assert 0 < 8_000 - held_bytes(buf) < each
    # Room by count, not for one event by bytes: nothing is read, and the read does not spin.
    window.refill(buf, spill.log)
    assert not held.queue and window.waiting == each
    assert held_bytes(buf) <= 8_000
    assert window.readable(held) == (0, 0, False)  # (what ``Spill.due`` asks: no look at once)
    # The tick's write fails: the overflow is stuck, and nothing else could free room.  One event
    # is read past the bound, so that delivering it frees the disk.
    spill.tick(buf, None, 1.0, force=True)
    assert window.stuck
    window.refill(buf, spill.log)
    assert len(held.queue) == 1 and window.waiting == 0
    assert orjson.loads(held.queue[0].body)["n"] == queued  # the oldest of the stretch, in order
    spill.close(buf)
