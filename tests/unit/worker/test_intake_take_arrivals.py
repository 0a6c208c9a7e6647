"""A batch taken in pieces (#37 item 3) against what arrives while it is taken.

The sidecar hands the GIL over between two pieces; an application thread emits meanwhile (a
piece that took what it emitted let objects nobody measured go on past the look: it found this).
Objects that grew past the estimate must still stay within the by-construction bound of
docs/operations.md: "Objects therefore hold beyond
``max_bytes`` at most 1,024 of them with one emitting thread ... whatever they weigh".

Each checkpoint here is a hand-off, as the real ``Slicer`` makes one once a slice has lasted its
budget: the worker's sample first (``on_handoff``), then the waiting emitter thread runs (it
emits as ``Outbox.emit`` does: ``Buffer.put``, and the measure on its own thread when it is due).
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from outbox._buffer._buffer import UNLOOKED_MOST, WAKE, Buffer, Policy
from outbox._buffer._holdings import Measure
from outbox._observability._log import RateLimitedLog
from outbox._runtime._slices import Slicer
from outbox._worker._intake import Intake, measure_here

_PAD = "x" * 40_000


def _event(n: int, pad: str | None = None) -> dict[str, Any]:
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
    intake = Intake(
        buf,
        max_batch_events=1000,
        max_batch_bytes=1 << 20,
        linger=0.0,
        slicer=slicer,
        log=RateLimitedLog(60),
        dead_letter=None,
        lowest_held=lambda: float("inf"),
    )
    slicer.on_handoff = intake.sample
    # Small objects: the sidecar has measured one (the estimate a few hundred bytes), 64 queued.
    buf.put(_event(0), 0)
    intake.sample(fresh=True)
    for i in range(1, 64):
        buf.put(_event(i), 0)
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
                    buf.put(_Grown(_event(n[0], _PAD)), 0) == WAKE
                    and buf.holdings.measure_here is Measure.DUE
                ):
                    measure_here(buf)  # (as Outbox.emit does)

        return emitter

    return emitter_of


def test_objects_that_grew_while_a_batch_is_taken_stay_within_the_bound_by_construction():
    """An emitter thread emits 64 objects of 40 KB at each hand-off (the estimate ~300 bytes).  The
    pieces must not re-arm the look over objects nobody measured: whatever they weigh, objects
    hold beyond max_bytes at most UNLOOKED_MOST of them (one emitting thread)."""
    size = len(orjson.dumps(_event(1, _PAD)))
    for policy in (Policy.DROP_NEWEST, Policy.DROP_OLDEST, Policy.BLOCK):
        buf, slicer, intake = _setup(policy, _emits(64))
        assert buf.holdings.estimate < 1000
        intake.take(1000, 1 << 20, 1 << 20)
        bound = buf.holdings.max_bytes // size + UNLOOKED_MOST
        assert slicer.peak <= bound, (policy, slicer.peak, bound)
