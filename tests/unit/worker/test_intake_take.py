"""The intake takes a batch from the buffer in pieces, the lock let go of between two: a handler's
emit waits for one piece at most, not for a whole batch (#37 item 3).  Only what was queued when
the take began is taken: what comes meanwhile waits for the next batch (and the next look)."""

from __future__ import annotations

import pytest

from outbox import SerializedEvent
from outbox._buffer._buffer import Buffer, Policy
from outbox._observability._log import RateLimitedLog
from outbox._runtime._slices import Slicer
from outbox._worker._intake import TAKE_PIECE, Intake


def _event(i: int) -> SerializedEvent:
    return SerializedEvent(b'{"i":%d}' % i, f"run-{i}", None)


class _Checkpoints(Slicer):
    """A slicer whose checkpoint runs ``during`` (what a handler would do with the GIL)."""

    def __init__(self, buf: Buffer, during) -> None:
        super().__init__(buf, enabled=False)
        self.calls = 0
        self.during = during

    def checkpoint(self) -> None:
        assert not self.buffer.owned()  # (let go of: a handler could take it now)
        self.calls += 1
        self.during(self.calls)


def _intake(buf: Buffer, slicer: Slicer) -> Intake:
    return Intake(
        buf,
        max_batch_events=10_000,
        max_batch_bytes=1 << 30,
        linger=0.0,
        slicer=slicer,
        log=RateLimitedLog(60),
        dead_letter=None,
        lowest_held=lambda: float("inf"),
    )


def test_a_batch_is_taken_in_pieces_and_emits_between_them_are_kept():
    buf = Buffer(max_events=10_000, max_bytes=1 << 30, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    count = 3 * TAKE_PIECE + 10
    for i in range(count):
        buf.put(_event(i), len(_event(i).body))
    emitted = []

    def emit(call: int) -> None:
        event = _event(100_000 + call)
        buf.put(event, len(event.body))
        emitted.append(event)

    slicer = _Checkpoints(buf, emit)
    taken = _intake(buf, slicer).take(count, 1 << 30, 1 << 30)
    pieces = -(-count // TAKE_PIECE)
    # (the serializing loop checkpoints too: at least one per piece but the last is the take's)
    assert slicer.calls >= pieces - 1 + count
    assert [held.event.body for held in taken] == [_event(i).body for i in range(count)]
    assert [held.seq for held in taken] == list(range(count))
    assert list(buf.holdings.queue) == emitted  # what came meanwhile waits for the next batch
    assert buf.holdings.in_flight == count


def test_the_events_evicted_between_two_pieces_are_counted_and_the_rest_taken_in_order():
    buf = Buffer(max_events=2 * TAKE_PIECE, max_bytes=1 << 30, policy=Policy.DROP_OLDEST, block_timeout=0.0)
    for i in range(2 * TAKE_PIECE):
        buf.put(_event(i), len(_event(i).body))
    arrived = []

    def emit_into_a_full_buffer(call: int) -> None:
        # Once, after the first piece (the buffer full again: each emit evicts the oldest queued).
        if buf.holdings.in_flight == TAKE_PIECE and not arrived:
            for j in range(5):
                event = _event(100_000 + j)
                buf.put(event, len(event.body))
                arrived.append(event)

    slicer = _Checkpoints(buf, emit_into_a_full_buffer)
    taken = _intake(buf, slicer).take(2 * TAKE_PIECE, 1 << 30, 1 << 30)
    bodies = [held.event.body for held in taken]
    assert bodies[:TAKE_PIECE] == [_event(i).body for i in range(TAKE_PIECE)]
    # The second piece: the rest of what was queued when the take began, after the 5 the emits
    # evicted; what they brought waits for the next batch.
    assert bodies[TAKE_PIECE:] == [_event(i).body for i in range(TAKE_PIECE + 5, 2 * TAKE_PIECE)]
    assert [held.seq for held in taken] == [*range(TAKE_PIECE), *range(TAKE_PIECE + 5, 2 * TAKE_PIECE)]
    assert list(buf.holdings.queue) == arrived
    assert buf.dropped.get("dropped_full", 0) == 5
    assert buf.holdings.in_flight == len(taken) == 2 * TAKE_PIECE - 5


@pytest.mark.parametrize("room", [1, TAKE_PIECE * 20 + 7])
def test_the_byte_bound_holds_across_pieces(room):
    buf = Buffer(max_events=10_000, max_bytes=1 << 30, policy=Policy.DROP_NEWEST, block_timeout=0.0)
    for _ in range(3 * TAKE_PIECE):
        event = SerializedEvent(b"x" * 20, None, None)
        buf.put(event, 20)
    taken = _intake(buf, _Checkpoints(buf, lambda call: None)).take(10_000, room, 1 << 30)
    assert len(taken) == max(1, room // 20)  # at least one, then only what fits
