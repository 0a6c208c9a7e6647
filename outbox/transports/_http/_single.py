"""Single mode: one event per request, each order key's events one after another, keys side by
side within the transport's places; the backend probed by one request while unreachable; a call
that sends for at most a slice and defers the rest."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..._run._serde import Key, order_key
from .._base import DELIVERED, Outcome, OutcomeKind, SerializedEvent
from ._answers import STOP_REASONS

if TYPE_CHECKING:
    from ..http import HttpTransport

__all__ = ["send_single"]


async def send_single(
    transport: HttpTransport, batch: Sequence[SerializedEvent], deadline: float, slice_seconds: float
) -> list[Outcome]:
    """Send ``batch`` one event per request; what was not sent within ``slice_seconds`` (or
    waited for a place until then) comes back DEFERRED, and a key's events after a refused or
    deferred one come back as it did."""
    outcomes: list[Outcome | None] = [None] * len(batch)
    # Each key's events (a run's, a job's) in order, one after another, a chain per key;
    # chains side by side.  (Not the worker's lanes: a lane is one request of the worker's.)
    chains: dict[Key, list[int]] = {}
    for index, event in enumerate(batch):
        key = order_key(event, index)
        chains.setdefault(key, []).append(index)
    # After the backend was unreachable, one request probes it before the others follow:
    # a backend that is down costs one connection attempt per retry, not one per chain.
    probing = transport._unreachable
    gate = asyncio.Semaphore(1 if probing else transport.max_concurrent_requests)
    stop: list[Outcome] = []  # set when the backend is unreachable or misconfigured
    # One call sends for at most slice_seconds seconds and defers the rest, so that a close()
    # that begins meanwhile soon gets a call whose deadline is its own.
    slice_end = time.monotonic() + slice_seconds

    async def run_chain(indexes: list[int]) -> None:
        nonlocal probing
        for position, index in enumerate(indexes):
            if stop:
                outcome: Outcome = stop[0]
            elif time.monotonic() >= slice_end:
                for later in indexes[position:]:
                    outcomes[later] = Outcome.deferred()
                return
            else:
                async with gate:
                    if time.monotonic() >= slice_end:  # the slice ended while we queued
                        for later in indexes[position:]:
                            outcomes[later] = Outcome.deferred()
                        return
                    # The backend may have been found unreachable while we queued.
                    send = transport._send_one
                    outcome = stop[0] if stop else await send(batch[index], deadline, slice_end)
                if outcome.kind is OutcomeKind.RETRY and outcome.reason in STOP_REASONS:
                    # Every other request would fail the same way: keep the rest for later.
                    stop.append(outcome)
                    transport._unreachable = True
                elif probing and outcome.kind is not OutcomeKind.DEFERRED:
                    probing = False  # it answers: open the gate to the others
                    transport._unreachable = False
                    for _ in range(transport.max_concurrent_requests - 1):
                        gate.release()
            outcomes[index] = outcome
            if outcome.kind in (OutcomeKind.RETRY, OutcomeKind.DEFERRED):
                # Later events of this run must not overtake this one.
                for later in indexes[position + 1 :]:
                    outcomes[later] = outcome
                return

    await asyncio.gather(*(run_chain(indexes) for indexes in chains.values()))
    return [o if o is not None else DELIVERED for o in outcomes]
