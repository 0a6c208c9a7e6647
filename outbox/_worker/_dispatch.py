"""What goes on the wire next, and what an answer changes: the backlog, the breaker and the lanes,
decided together.  Pure (time and answers are passed in), so that a test can drive exactly the
worker's decisions with scripted answers and a clock of its own, without threads or sockets.

The worker owns the rest: taking events from the buffer, the transport calls, the buffer's
accounts, dead letters and logs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..transports._base import Outcome
from ._backlog import Backlog, Settled
from ._held import Held, order_key
from ._lanes import Lanes, lane_size
from ._retry import NO_TIME_LEFT, Breaker, backoff_delay, close_paced
from ._sender import Verdict, classify

__all__ = ["Answer", "Dispatch", "Lane"]

_INF = float("inf")
# A transport that only defers: the pause before its events go again.
_DEFER_PAUSE = 0.05


class Lane:
    """A lane on the wire: its events, when it left, and whether more work waited then."""

    __slots__ = ("items", "sent_at", "waiting")

    def __init__(self, items: list[Held], sent_at: float) -> None:
        self.items = items
        self.sent_at = sent_at
        self.waiting = False


class Answer(NamedTuple):
    """What an answer changed, for the worker to account and report."""

    verdict: Verdict
    settled: Settled
    #: When the breaker counted the answer as the backend's failure: the delay until the next
    #: attempt, and whether the circuit opened with it.
    failed_for: float | None
    opened: bool


def _one_key(items: Sequence[Held]) -> bool:
    first = order_key(items[0].event, items[0].seq)
    return all(order_key(item.event, item.seq) == first for item in items)


class Dispatch:
    """The worker's decisions.

    Args:
        max_batch_events, max_batch_bytes: a lane's limits.
        max_concurrency: the most lanes.
        lane_events: the fewest events worth a lane of their own, where each request carries
            one event (a transport's hint); None: lanes carry full batches.
        backoff_base, backoff_cap, circuit_threshold, poison_attempts, max_retry_after: as the
            ``Outbox`` keywords.
    """

    def __init__(
        self,
        *,
        max_batch_events: int,
        max_batch_bytes: int,
        max_concurrency: int,
        backoff_base: float,
        backoff_cap: float,
        circuit_threshold: int,
        poison_attempts: int,
        max_retry_after: float,
        lane_events: int | None = None,
    ) -> None:
        self.backlog = Backlog(poison_attempts)
        self.breaker = Breaker(circuit_threshold, backoff_base, backoff_cap)
        self.lanes = Lanes(max_concurrency)
        self.max_batch_events, self.max_batch_bytes = max_batch_events, max_batch_bytes
        self.backoff_base, self.backoff_cap, self.max_retry_after = backoff_base, backoff_cap, max_retry_after
        if lane_events is not None and lane_events > 0:
            # Each request carries one event: a lane of a few requests' worth, so that a lane's
            # call stays short (its keys muted meanwhile) and the work spreads over the lanes.
            self.smallest, self.largest = lane_events, min(max_batch_events, 2 * lane_events)
        else:
            self.smallest = self.largest = max_batch_events
        self.closing = False
        self.deadline = _INF
        #: Retry-After answers longer than max_retry_after, capped (for the worker to log).
        self.capped: list[float] = []

    # -- close -----------------------------------------------------------------------------

    def begin_close(self, deadline: float) -> None:
        if not self.closing:
            self.closing = True
            self.backlog.pull_forward()  # one immediate last attempt for every key
        self.deadline = min(self.deadline, deadline)
        self.breaker.begin_close(self.deadline)

    # -- out -------------------------------------------------------------------------------

    def next_lanes(self, now: float, in_flight: int, more_queued: bool) -> list[Lane]:
        """The lanes to put on the wire now, given ``in_flight`` lanes already there: up to
        the lanes in use, or one at a time while the backend fails, paced by the breaker.
        ``more_queued``: a batch's worth still waits in the buffer (work for more lanes)."""
        backlog, breaker = self.backlog, self.breaker
        backlog.promote(now)
        if self.deadline - now <= NO_TIME_LEFT or not backlog.ready:
            return []
        failing = breaker.failing
        if failing and (in_flight or now < breaker.next_attempt(now)):
            return []
        limit = 1 if failing else self.lanes.current
        started: list[Lane] = []
        while in_flight + len(started) < limit:
            most = lane_size(backlog.ready, limit, self.smallest, self.largest)
            items = backlog.take_lane(now, most, self.max_batch_bytes, fair=failing)
            if not items:
                break
            breaker.started(now)
            started.append(Lane(items, now))
        if started and (backlog.ready or more_queued):
            for lane in started:
                lane.waiting = True  # more work than lanes: the lanes could grow
        return started

    def next_wake(self, now: float, in_flight: int) -> float:
        """Seconds until a lane may go (a key that waits out a backoff is ready, and the
        breaker lets an attempt go); inf while the lanes are full (an answer wakes the worker)
        or nothing waits."""
        backlog, breaker = self.backlog, self.breaker
        if in_flight >= (1 if breaker.failing else self.lanes.current):
            return _INF
        if self.deadline - now <= NO_TIME_LEFT:
            return _INF  # nothing goes any more (the worker ends at the deadline)
        if backlog.can_send(now):
            at = now
        else:
            ready_at = backlog.next_ready_at(now)
            if ready_at is None:
                return _INF
            at = ready_at
        if breaker.failing:
            at = max(at, breaker.next_attempt(now))
        return max(0.0, at - now)

    # -- answers ---------------------------------------------------------------------------

    def release(self, lane: Lane, now: float) -> None:
        """A lane whose answer is lost (cut by the close deadline, or our own error)."""
        self.backlog.release(lane.items, now)

    def answer(self, lane: Lane, outcomes: Sequence[Outcome], now: float, cpu: float) -> Answer:
        """Apply one answer.  ``cpu``: the sending thread's CPU time now (for the lanes)."""
        verdict = classify(outcomes)
        breaker, backlog = self.breaker, self.backlog
        # The breaker first: a key refused because the backend is down waits for the breaker,
        # not on a backoff of its own.  An answer about the events is the backend's failure
        # only for one key's events while the backend has taken nothing else since they were
        # first refused: a request of several keys refused as a whole is being bisected (each
        # half goes again soon), and one refused while others go through is a poison suspect,
        # not a backend in trouble.
        failed_for: float | None = None
        opened = False
        if verdict.moved:
            breaker.succeeded()
        elif verdict.retries and (
            verdict.about_backend or (_one_key(lane.items) and not backlog.taken_since_refused(lane.items[0]))
        ):
            was_open = breaker.circuit.value == "open"
            failed_for = breaker.failed(now, self._capped(verdict.retry_after))
            opened = breaker.circuit.value == "open" and not was_open
        settled = backlog.settle(lane.items, outcomes, now, self._delay_at(now))
        # The lanes: fewer when the backend is overloaded or this thread is the bottleneck.
        if verdict.backend_retries:
            self.lanes.overloaded(now, lane.sent_at)
        elif verdict.delivered and not self.lanes.busy(now, cpu):
            self.lanes.answered(now - lane.sent_at, waiting=lane.waiting)
        return Answer(verdict, settled, failed_for, opened)

    def _delay_at(self, now: float) -> Callable[[int, float | None, bool], float]:
        def delay(refusals: int, retry_after: float | None, about_event: bool) -> float:
            """How long a key waits after a refusal (``refusals`` in a row), by the backoff; 0
            for one about the backend while the breaker paces every attempt."""
            if not refusals:
                wait = min(self.backoff_base, _DEFER_PAUSE)
            elif not about_event and self.breaker.failing:
                return 0.0
            else:
                attempt = refusals if about_event else 1
                wait = backoff_delay(attempt, self.backoff_base, self.backoff_cap, self._capped(retry_after))
            if self.closing:
                wait = close_paced(wait, now, self.deadline)
            return wait

        return delay

    def _capped(self, retry_after: float | None) -> float | None:
        if retry_after is not None and retry_after > self.max_retry_after:
            self.capped.append(retry_after)
            return self.max_retry_after
        return retry_after
