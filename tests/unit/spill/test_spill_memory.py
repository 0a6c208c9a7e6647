"""Reading the stretch back beside the overflow, with real parts stepped by hand: the read takes
what the buffer's bounds leave beside the overflow, never an event past its bytes, and waits
(without spinning) for room the overflow's write will free; only when nothing else could ever
free room (no queue, the overflow stuck on a failing disk) does it take one event past them."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections import deque

import orjson

from outbox._buffer._buffer import Buffer, Policy
from outbox._run._serde import serialize, weight
from outbox._spill import Spill
from outbox._spill._format import Event
from outbox._spill._ranges import Ranges
from outbox._spill._streams import Run

from support.helpers import run_event

RUN = "00000000-0000-4000-8000-000000000001"
SIZE = 1000


def text(n: int) -> bytes:
    body = orjson.dumps(run_event(run_id=RUN, n=n))
    return body[:-1] + b',"pad":"' + b"x" * (SIZE - len(body) - 9) + b'"}'


def held_bytes(buf: Buffer) -> int:
    held = buf.holdings
    return held.held_bytes_locked() + held.overflow.bytes(held.estimate)


def large_at_the_head(tmp_path, max_events: int) -> tuple[bytes, Buffer, Spill]:
    """An event of 48,000 bytes (0.6x max_bytes 80,000: more than the window's half), a
    buffer of ``max_events`` (drop_newest) and its spill."""
    big = orjson.dumps(run_event(run_id=RUN, n=-1))
    big = big[:-1] + b',"pad":"' + b"x" * (48_000 - len(big) - 9) + b'"}'
    buf = Buffer(max_events=max_events, max_bytes=80_000, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    spill = Spill(tmp_path, adopt=False)
    spill.attach(buf)
    return big, buf, spill


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
    assert window.disk == 3
    assert not window.events
    queued = len(held.queue)
    with buf.lock:  # the queue delivered: empty, nothing in flight
        taken = held.take_locked(100, 10**9)
        buf.settle_locked(len(taken), held.in_flight_bytes, float("inf"))
    assert not held.queue
    assert not held.in_flight
    spill.disk.retry_at = time.monotonic() + 60  # the disk fails: the overflow cannot be written
    for _ in range(7):  # the overflow leaves less than one read-back event's bytes
        assert buf.put(text(n), SIZE)
        n += 1
    assert 0 < 8_000 - held_bytes(buf) < each
    # Room by count, not for one event by bytes: nothing is read, and the read does not spin.
    window.refill(buf, spill.log)
    assert not held.queue
    assert window.waiting == each
    assert held_bytes(buf) <= 8_000
    assert window.readable(held) == (0, 0, False)  # (what ``Spill.due`` asks: no look at once)
    # The tick's write fails: the overflow is stuck, and nothing else could free room.  One event
    # is read past the bound, so that delivering it frees the disk.
    spill.tick(buf, None, 1.0, force=True)
    assert window.stuck
    window.refill(buf, spill.log)
    assert len(held.queue) == 1
    assert window.waiting == 0
    assert orjson.loads(held.queue[0].body)["n"] == queued  # the oldest of the stretch, in order
    spill.close(buf)


def overflowing_beside_what_is_in_flight(tmp_path) -> tuple[Buffer, Spill, int]:
    """A buffer of 64,000 bytes (drop_newest) with its spill, objects at a small estimate: the
    window filled, taken in flight, the overflow begun.  Returns them, and the next event's n."""
    buf = Buffer(max_events=1_000, max_bytes=64_000, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    spill = Spill(tmp_path, adopt=False)
    spill.attach(buf)
    assert buf.put(run_event(run_id=RUN, n=0), 0)
    spill.tick(buf, None, 0.0, force=True)  # the first object measured: the estimate is small
    n = 1
    while not spill.window.active:
        assert buf.put(run_event(run_id=RUN, n=n), 0)
        n += 1
    with buf.lock:  # the queue taken: in flight
        buf.holdings.take_locked(1_000, 10**9)
    return buf, spill, n


def written_at_the_next_turn(buf: Buffer, spill: Spill) -> None:
    """Memory past the bound asks for the overflow's write at once; the sidecar's next turn
    writes and releases it, and memory holds the bound again."""
    window = spill.window
    assert held_bytes(buf) > 64_000
    assert window.wants_write(buf.holdings)
    assert spill.due(buf, time.monotonic()) == 0.0
    spill.tick(buf, None, 0.01)  # the sidecar's turn: written, released
    assert not window.events
    assert held_bytes(buf) <= 64_000
    spill.close(buf)


def test_an_overflow_past_the_bound_once_what_is_in_flight_weighs_more_is_written_at_once(tmp_path):
    """Events in flight turned out larger than estimated (serialized for their request):
    only the queue can be shed, and the overflow, below every threshold of a write, would wait
    for the next interval's.  Past the bound, it asks to be written at the sidecar's next turn,
    and once written memory holds the bound again."""
    buf, spill, n = overflowing_beside_what_is_in_flight(tmp_path)
    window, held = spill.window, buf.holdings
    for _ in range(3):  # below every threshold of a write
        assert buf.put(run_event(run_id=RUN, n=n), 0)
        n += 1
    assert not window.wants_write(held)
    with buf.lock:
        held.reprice_in_flight_locked(64_000 - held_bytes(buf) + 1)  # they weigh more
    written_at_the_next_turn(buf, spill)


def test_an_overflow_object_measured_larger_than_its_estimate_past_the_bound_is_written_at_once(tmp_path):
    """An object came into the overflow at a small estimate; a sample (at a hand-off of the
    sidecar's) measures it at 20 KB.  Only the queue can be shed, and it is empty: memory is past
    the bound until the overflow is written, which the sidecar does at its next turn (chaos seed
    11 caught a check between the two: 3 events in flight and this one, 83,584 bytes of 65,536)."""
    buf, spill, n = overflowing_beside_what_is_in_flight(tmp_path)
    window, held = spill.window, buf.holdings
    spill.tick(buf, None, 0.0, force=True)  # the overflow's first on disk: it holds nothing
    assert window.active
    assert not window.events
    big = run_event(run_id=RUN, n=n)
    big["run"]["facets"]["pad"] = {"_producer": "p", "_schemaURL": "s", "x": "x" * 20_000}
    assert buf.put(big, 0)  # into the overflow, at the small estimate
    with buf.lock:
        held.reprice_in_flight_locked(64_000 - held_bytes(buf) - 10_000)  # near the bound, within it
    assert held_bytes(buf) <= 64_000
    assert not window.wants_write(held)
    with buf.lock:  # the sample measures it
        assert buf.serialized_in_place_locked([(held.next_seq - 1, big, serialize(big))]) == 1
    assert window.unmeasured() == 0
    written_at_the_next_turn(buf, spill)


def test_an_event_larger_than_the_window_is_read_back_beside_an_overflow_that_emits_keep_filling(tmp_path):
    """The stretch's head weighs 0.6x max_bytes: more than the queue's window (half the bound)
    will ever have room for, within the buffer's bound.  With the queue empty and nothing in
    flight, it is read back beside the overflow while that leaves room for it in the bound.  It
    used to wait for room the window can never give, read ("alone") only when the overflow
    happened to be empty at a read: while emits go on, hardly ever.  Nothing was delivered for
    12 s with eight threads emitting (293,253 events on disk behind it, the sidecar idle;
    /tmp/p4work/huge.py 0.6 8 12 in the session that found it)."""
    max_bytes = 80_000
    big, buf, spill = large_at_the_head(tmp_path, max_events=100)
    window, held = spill.window, buf.holdings
    assert buf.put(text(0), SIZE)  # queued
    assert buf.put(big, len(big))  # (more than the window's 40,000 bytes: it overflows)
    assert window.active
    assert len(window.events) == 1
    spill.tick(buf, None, 0.0, force=True)  # on disk, and held back: the queue leaves no room
    assert window.disk == 1
    assert not window.events
    assert window.waiting == weight(serialize(big))
    with buf.lock:  # the queue delivered: empty, nothing in flight
        taken = held.take_locked(100, 10**9)
        buf.settle_locked(len(taken), held.in_flight_bytes, float("inf"))
    assert not held.queue
    assert not held.in_flight
    assert buf.put(text(1), SIZE)  # an emit goes on: the overflow, on a healthy disk
    assert window.events
    assert not window.stuck
    assert window.usable
    window.refill(buf, spill.log)
    assert len(held.queue) == 1, f"waiting for {window.waiting} bytes, readable {window.readable(held)}"
    assert orjson.loads(held.queue[0].body)["n"] == -1
    assert held_bytes(buf) <= max_bytes
    spill.close(buf)


def test_an_event_a_read_stops_short_of_is_left_on_disk_not_kept_in_memory(tmp_path):
    """A read that stops short of an event for want of room leaves it where it was: the next
    read begins again at its record.  It used to keep that event (and the reader's chunk, up
    to 256 KiB) in memory for the next read, counted nowhere, while the overflow filled to
    max_bytes beside it: 1.60x max_bytes with an event of 0.6x (a helper's back.py)."""
    max_bytes = 80_000
    big, buf, spill = large_at_the_head(tmp_path, max_events=1000)
    window = spill.window
    assert buf.put(text(0), SIZE)  # queued, and never delivered: the backend is down
    assert buf.put(big, len(big))  # (more than the window's 40,000 bytes: it overflows)
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        spill.tick(buf, None, 0.0, force=True)  # on disk, and stopped short of: the queue's room
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert window.disk == 1
    assert window.waiting == weight(serialize(big))
    assert kept < len(big) // 2, f"{kept} bytes more in memory after the read"
    n = 1
    while buf.put(text(n), SIZE):  # emits fill the overflow up to the buffer's bound
        n += 1
    assert held_bytes(buf) <= max_bytes
    with buf.lock:  # the backend is back: the queue delivered
        taken = buf.holdings.take_locked(1000, 10**9)
        buf.settle_locked(len(taken), buf.holdings.in_flight_bytes, float("inf"))
    spill.tick(buf, None, 1.0, force=True)  # the overflow written; then the event read, in order
    assert orjson.loads(buf.holdings.queue[0].body)["n"] == -1
    spill.close(buf)


def test_a_read_of_kept_events_that_stops_short_puts_the_event_back_first(tmp_path):
    """The same for events a replay kept in memory (an adopted owner's, read once): the one a
    read stops short of goes back at the head of what is kept, and the next read hands the
    events out in their order, each once."""
    events = [Event(seq, 0.0, serialize(text(seq))) for seq in range(3)]
    run = Run(0, [], {"dead": Ranges([(0, 3)])}, kept=deque(("dead", True, e) for e in events))
    each = weight(events[0].event)
    first, _ = run.read(10, each + each // 2)
    assert [orjson.loads(e.body)["n"] for e in first] == [0]
    assert run.wants == each
    rest, origins = run.read(10, 10**6)
    assert [orjson.loads(e.body)["n"] for e in rest] == [1, 2]
    assert origins == [["dead", 1, 2]]
    assert run.wants == 0
