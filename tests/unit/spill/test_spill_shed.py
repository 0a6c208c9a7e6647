"""The spill and a shed from the newest that happens between the worker's last write and its
take: the write itself serializes objects accepted at a short estimate, learns what they
weigh, and ``drop_newest`` sheds the newest, just written.  Their numbers are retired (settled
``dropped_full`` in the log), and the events an emitter queues before the take get new ones:
the successor hands on those, never the shed ones."""

from __future__ import annotations

import orjson

from outbox import Outbox
from outbox._buffer._buffer import Buffer, Policy
from outbox._observability._log import RateLimitedLog
from outbox._runtime._slices import Slicer
from outbox._spill import Spill
from outbox._worker._intake import Intake

from support import parts
from support.helpers import ScriptedTransport, run_event, wait_until
from support.spill_log import waiting

RUN = "00000000-0000-4000-8000-000000000001"


def big(n: int, pad: int) -> dict[str, object]:
    return {**run_event(run_id=RUN, n=n), "pad": "x" * pad}


def text(n: int) -> bytes:
    return orjson.dumps(run_event(run_id=RUN, n=n))


def test_events_queued_between_a_shed_and_the_take_get_new_numbers_and_are_written(tmp_path):
    """The worker's step (write, then take, then cover) with real parts, the emitter's events
    put between the write and the take, after the write shed its newest: they get new numbers
    (the shed ones' are retired), the close counts on disk exactly what is there, and the next
    owner hands on the new events, not the shed ones."""
    buf = Buffer(max_events=100, max_bytes=80_000, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    spill = Spill(tmp_path, adopt=False)
    spill.attach(buf)
    intake = Intake(
        buf,
        max_batch_events=100,
        max_batch_bytes=10**6,
        linger=0.0,
        slicer=Slicer(buf),
        log=RateLimitedLog(30.0),
        dead_letter=None,
        lowest_held=lambda: float("inf"),
    )
    assert buf.put(run_event(run_id=RUN, n=0), 0)
    spill.tick(buf, None, 0.0, force=True)  # measured: the estimate is what a small event weighs
    for n in range(1, 6):  # objects 100 times larger, accepted at that estimate
        assert buf.put(big(n, 30_000), 0)
    spill.tick(buf, None, 1.0, force=True)  # written, measured, over max_bytes: the newest shed
    shed = buf.dropped.get("dropped_full", 0)
    assert 0 < shed < 5, buf.dropped
    kept = list(range(6 - shed))
    fresh = [20, 30]  # an emitter gets in before the take
    for n in fresh:
        assert buf.put(text(n), len(text(n)))
    assert buf.holdings.next_seq == 6 + len(fresh)  # (the shed ones' numbers are not given again)
    items = intake.take(100, 10**7, 10**7)
    assert [item.seq for item in items][: len(kept)] == list(range(len(kept)))
    spill.cover(buf, items)
    on_disk = spill.close(buf)
    handed_on = [orjson.loads(event.body)["n"] for _, _, event in waiting(tmp_path)]
    assert handed_on == kept + fresh, (handed_on, shed)
    assert on_disk == len(handed_on)


def test_a_close_hands_on_the_events_queued_between_a_shed_and_the_take(tmp_path):
    """The same through a real outbox: the sidecar's write before a take finds objects larger
    than estimated and sheds the newest, one that was just written; emits get in before the
    take.  The close counts ``spilled_at_close`` exactly what the next outbox delivers, and
    the shed event (``dropped_full``) is not among it."""
    spill_dir = str(tmp_path / "spill")
    transport = ScriptedTransport(open_gate=False)
    box = Outbox(
        transport,
        spill_dir=spill_dir,
        max_events=1000,
        max_bytes=64 * 1024,
        max_batch_events=50,
        max_batch_bytes=16 * 1024,  # (below max_bytes: the worker takes ahead of its one lane)
        max_concurrency=1,
        policy="drop_newest",
        linger=0.0,
    )
    spill = parts.spill(box)
    assert spill is not None
    tick = spill.tick
    armed, fired = [False], [False]
    small = list(range(1, 6))
    huge = 9  # measured, over max_bytes: shed at once, the newest
    fresh = [20, 21]

    def tick_then_emit(buf, slicer, now, force=False):  # type: ignore[no-untyped-def]
        if not armed[0]:
            return tick(buf, slicer, now, force)
        armed[0] = False
        for n in small:  # objects, queued behind the sidecar's back (it is here)
            assert box.emit(run_event(run_id=RUN, n=n))
        assert box.emit(big(huge, 100 * 1024))
        tick(buf, None, now, True)  # (no hand-offs: the intake's sampling does not get in)
        for n in fresh:  # a handler's emits, between this write and the take
            assert box.emit(text(n))
        fired[0] = True

    spill.tick = tick_then_emit  # type: ignore[method-assign]
    try:
        assert box.emit(run_event(run_id=RUN, n=0))
        assert wait_until(lambda: box.stats().spill["written"] >= 1), box.stats().spill
        armed[0] = True
        assert box.emit(run_event(run_id=RUN, n=100))  # wakes the worker for a take
        assert wait_until(lambda: fired[0])
        assert wait_until(lambda: box.stats().queued_events == 0), box.stats()
        assert box.stats().dropped == {"dropped_full": 1}, box.stats()
        report = box.close(0.3)
    finally:
        transport.gate.set()
    assert set(report.undelivered) == {"spilled_at_close", "dropped_full"}, report
    held = report.undelivered["spilled_at_close"]
    assert held == 1 + 1 + len(small) + len(fresh), report

    successor_transport = ScriptedTransport()
    successor = Outbox(successor_transport, spill_dir=spill_dir, shutdown_timeout=5)
    try:
        assert successor_transport.wait_delivered(held, 10), successor.stats()
        assert successor.flush(5)
    finally:
        final = successor.close(5)
    assert final.undelivered == {}, final
    delivered = sorted(event["n"] for event in successor_transport.delivered)
    assert huge not in delivered, delivered
    assert delivered == sorted([0, 100, *small, *fresh]), delivered
