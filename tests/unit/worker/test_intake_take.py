"""The intake takes a batch from the buffer in pieces, the lock let go of between two: a handler's
emit waits for one piece at most, not for a whole batch (#37 item 3).  Only what was queued when
the take began is taken: what comes meanwhile waits for the next batch (and the next look)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest

from outbox import SerializedEvent
from outbox._buffer._buffer import UNLOOKED_MOST, WAKE, Buffer, Policy
from outbox._buffer._holdings import Measure
from outbox._observability._log import RateLimitedLog
from outbox._runtime._slices import Slicer
from outbox._worker._intake import TAKE_PIECE, Intake, measure_here


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


def _intake(buf: Buffer, slicer: Slicer, events: int = 10_000, nbytes: int = 1 << 30) -> Intake:
    return Intake(
        buf,
        max_batch_events=events,
        max_batch_bytes=nbytes,
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


# -- what arrives while a batch is taken ----------------------------------------------------
#
# The sidecar hands the GIL over between two pieces, and an application thread emits meanwhile.
# A piece that took what it emitted let objects nobody measured go on past the look (a hostile
# review found it): objects that grew past the estimate must stay within the bound of
# docs/operations.md, "at most 1,024 of them [beyond max_bytes] with one emitting thread".
# Each checkpoint here is a hand-off, as the real ``Slicer`` makes one once a slice has lasted its
# budget: the worker's sample first (``on_handoff``), then the waiting emitter thread runs (it
# emits as ``Outbox.emit`` does: ``Buffer.put``, and the measure on its own thread when it is due).

_PAD = "x" * 40_000


def _dict_event(n: int, pad: str | None = None) -> dict[str, Any]:
    event = {
        "eventType": "START",
        "eventTime": "2026-12-02T10:00:00.000000+00:00",
        "producer": "https://example.com/tests",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": str(uuid.UUID(int=n)), "facets": {}},
        "job": {"namespace": "tests", "name": "job", "facets": {}},
        "inputs": [],
        "outputs": [],
        "n": n,
    }
    if pad is not None:
        event["run"]["facets"]["pad"] = {"_producer": "p", "_schemaURL": "s", "x": pad}
    return event


class _Grown(dict):
    """An event that grew (40 KB), counted while anything holds it."""

    live = 0

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        type(self).live += 1

    def __del__(self) -> None:
        type(self).live -= 1


class _HandsOver(Slicer):
    """Every checkpoint a hand-off: the sample, then ``emitter`` (a thread waiting for the GIL)."""

    def __init__(self, buf: Buffer, emitter) -> None:
        super().__init__(buf, enabled=False)
        self.calls = 0
        self.emitter = emitter
        self.peak = 0

    def checkpoint(self) -> None:
        assert not self.buffer.owned()
        self.calls += 1
        self.peak = max(self.peak, _Grown.live)
        if self.on_handoff is not None:
            self.on_handoff()
        self.emitter(self.calls)
        self.peak = max(self.peak, _Grown.live)


def _setup(policy: Policy, emitter_of):
    buf = Buffer(max_events=10_000, max_bytes=4 * 1024 * 1024, policy=policy, block_timeout=0.0)
    slicer = _HandsOver(buf, emitter_of(buf))
    intake = _intake(buf, slicer, 1000, 1 << 20)
    slicer.on_handoff = intake.sample
    # Small objects: the sidecar has measured one (the estimate a few hundred bytes), 64 queued.
    buf.put(_dict_event(0), 0)
    intake.sample(fresh=True)
    for i in range(1, 64):
        buf.put(_dict_event(i), 0)
    return buf, slicer, intake


def _emits(burst: int, *, first: int = 2):
    """An emitter thread that emits ``burst`` grown objects at each hand-off from the ``first``."""

    def emitter_of(buf: Buffer):
        n = [1000]

        def emitter(call: int) -> None:
            if call < first:
                return
            for _ in range(burst):
                n[0] += 1
                if (
                    buf.put(_Grown(_dict_event(n[0], _PAD)), 0) == WAKE
                    and buf.holdings.measure_here is Measure.DUE
                ):
                    measure_here(buf)  # (as Outbox.emit does)

        return emitter

    return emitter_of


def test_objects_that_grew_while_a_batch_is_taken_stay_within_the_bound_by_construction():
    """An emitter thread emits 64 objects of 40 KB at each hand-off (the estimate ~300 bytes).  The
    pieces must not re-arm the look over objects nobody measured: whatever they weigh, objects
    hold beyond max_bytes at most UNLOOKED_MOST of them (one emitting thread)."""
    size = len(orjson.dumps(_dict_event(1, _PAD)))
    for policy in (Policy.DROP_NEWEST, Policy.DROP_OLDEST, Policy.BLOCK):
        buf, slicer, intake = _setup(policy, _emits(64))
        assert buf.holdings.estimate < 1000
        intake.take(1000, 1 << 20, 1 << 20)
        bound = buf.holdings.max_bytes // size + UNLOOKED_MOST
        assert slicer.peak <= bound, (policy, slicer.peak, bound)
