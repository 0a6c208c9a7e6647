"""How attempts are paced: one bounded backoff, the circuit breaker, and the pacing of a close.
Pure (time is passed in): shared by the worker, ``outbox forward`` and ``outbox replay``."""

from __future__ import annotations

import enum
import random

__all__ = [
    "CLOSE_BACKOFF_CAP",
    "LAST_ATTEMPT_LEAD",
    "MIN_CLOSE_GAP",
    "NO_TIME_LEFT",
    "Breaker",
    "CircuitState",
    "backoff_delay",
    "close_paced",
]

#: Below this many seconds before the close deadline nothing more is sent.
NO_TIME_LEFT = 0.1
#: During close, the last paced attempt starts at least this long before the deadline, so that a
#: backend that came back gets the events in time.
LAST_ATTEMPT_LEAD = 0.25
#: During close, no retry waits longer than this (the server's Retry-After included).
CLOSE_BACKOFF_CAP = 1.0
#: During close, attempts pulled forward by the deadline stay at least this far apart.
MIN_CLOSE_GAP = 0.1
# Exponent cap of the backoff: 2**62 seconds is already far beyond any cap.
_MAX_EXPONENT = 62


def backoff_delay(attempt: int, base: float, cap: float, retry_after: float | None = None) -> float:
    """Seconds to wait before attempt ``attempt + 1``: exponential backoff with full jitter
    (uniform in ``[0, min(cap, base * 2**(attempt - 1))]``), and never less than what the
    server asked for (``retry_after``).  Defined for any attempt count, however large."""
    exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
    delay = random.uniform(0.0, min(cap, base * float(2**exponent)))
    if retry_after is not None and retry_after > delay:
        delay = retry_after
    return delay


def close_paced(delay: float, now: float, deadline: float) -> float:
    """``delay`` as a close allows it: bounded by a second and by the time left (the last
    attempt starts ``LAST_ATTEMPT_LEAD`` before the deadline), attempts at least
    ``MIN_CLOSE_GAP`` apart.  A close has a fixed deadline, and a backend that comes back
    before it must not wait out a long backoff."""
    latest = min(deadline - LAST_ATTEMPT_LEAD - now, CLOSE_BACKOFF_CAP)
    return max(latest, MIN_CLOSE_GAP) if delay > latest else delay


class CircuitState(enum.Enum):
    #: Sending normally.
    CLOSED = "closed"
    #: Several attempts in a row failed: waiting out the backoff before probing.
    OPEN = "open"
    #: A probe is in flight; its answer closes or reopens the circuit.
    HALF_OPEN = "half_open"


class Breaker:
    """Answers in a row in which the backend took nothing, the circuit they open, and when the
    next attempt may go.  While failures last, one request at a time, paced by the backoff.

    Args:
        threshold: failures in a row that open the circuit.
        base, cap: the backoff's first bound and its largest delay, in seconds.
        max_retry_after: the longest ``Retry-After`` honoured.
    """

    __slots__ = (
        "base",
        "cap",
        "circuit",
        "closing",
        "deadline",
        "failures",
        "last_chance",
        "retry_at",
        "threshold",
    )

    def __init__(self, threshold: int, base: float, cap: float) -> None:
        self.threshold, self.base, self.cap = threshold, base, cap
        self.failures = 0
        self.circuit = CircuitState.CLOSED
        self.retry_at = 0.0
        self.closing = False
        self.deadline = float("inf")
        self.last_chance = False

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def succeeded(self) -> None:
        """The backend took (or settled) events: send normally again."""
        self.failures = 0
        self.circuit = CircuitState.CLOSED
        self.retry_at = 0.0

    def failed(self, now: float, retry_after: float | None = None) -> float:
        """The backend took nothing.  Returns the delay until the next attempt."""
        self.failures += 1
        if self.failures >= self.threshold:
            self.circuit = CircuitState.OPEN
        delay = backoff_delay(self.failures, self.base, self.cap, retry_after)
        self.retry_at = now + delay
        return delay

    def begin_close(self, deadline: float) -> None:
        """A close began: one immediate attempt, then attempts paced within the deadline."""
        if not self.closing:
            self.closing = True
            self.last_chance = True
        self.deadline = min(self.deadline, deadline)

    def next_attempt(self, now: float) -> float:
        """When the next attempt may start (``now`` or earlier: at once)."""
        if not self.failures:
            return now
        if self.closing:
            if self.last_chance:
                return now
            self.retry_at = now + close_paced(self.retry_at - now, now, self.deadline)
        return self.retry_at

    def started(self, now: float) -> None:
        """An attempt starts (while failing: the probe)."""
        if self.failures:
            self.last_chance = False
            if self.circuit is CircuitState.OPEN:
                self.circuit = CircuitState.HALF_OPEN
