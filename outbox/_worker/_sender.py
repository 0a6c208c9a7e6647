"""One attempt: a lane's events handed to the transport, its answer checked against the
contract, and what the answer says classified into a :class:`Verdict`.  Values in, a value out:
the sender keeps no state."""

from __future__ import annotations

import asyncio
import operator
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from .._observability._log import RateLimitedLog, described
from ..transports._base import DELIVERED, About, Outcome, OutcomeKind, Transport
from ._held import Held

__all__ = ["Verdict", "attempt", "checked", "classify"]

_EVENT = operator.attrgetter("event")


async def attempt(
    transport: Transport, items: Sequence[Held], deadline: float, log: RateLimitedLog, give_up: float
) -> list[Outcome]:
    """Send ``items`` once: the transport is asked to answer by ``deadline`` (a
    ``time.monotonic()`` value), and given up on at ``give_up`` (its ``send_timeout``: a close
    deadline, if earlier, cancels the attempt instead, and what it carried is counted at
    shutdown).  One Outcome per event, whatever the transport does (it may raise, hang, or
    answer out of contract)."""
    events = list(map(_EVENT, items))
    timeout = max(0.0, give_up - time.monotonic())
    try:
        answer = await asyncio.wait_for(transport.send(events, deadline), timeout)
    except TimeoutError:
        return [Outcome.retry("timeout", f"send took longer than {timeout:.3g} s")] * len(events)
    except Exception as exc:  # the transport broke its contract; keep the events
        said = f"{type(exc).__name__}: {described(exc)}"
        log.error("transport-raised", "%r.send raised; the events stay buffered: %s", transport, said)
        return [Outcome.retry("transport_error", said)] * len(events)
    return checked(answer, len(events), transport, log)


def checked(answer: Any, count: int, transport: Any, log: RateLimitedLog) -> list[Outcome]:
    """The transport's answer if it keeps the contract (one Outcome per event); else RETRY for
    the whole batch and an error naming what was wrong."""
    problem = None
    try:
        outcomes = list(answer)
    except TypeError:
        outcomes, problem = [], f"returned {type(answer).__name__}, not a sequence of Outcomes"
    if problem is None and len(outcomes) != count:
        problem = f"returned {len(outcomes)} outcomes for {count} events"
    if problem is None and outcomes.count(DELIVERED) == count:
        return outcomes  # all delivered (the common case): nothing to check, at C speed
    if problem is None:
        for index, outcome in enumerate(outcomes):
            if type(outcome) is not Outcome or not isinstance(outcome.kind, OutcomeKind):
                problem = f"returned {outcome!r} for event {index}, not an Outcome"
                break
            if not isinstance(outcome.about, About):
                outcomes[index] = Outcome(outcome.kind, outcome.reason, outcome.detail, outcome.retry_after)
                outcome = outcomes[index]
            wait = outcome.retry_after
            if wait is not None and not (
                isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait >= 0
            ):
                # Not a usable delay: ignore it (the backoff applies), keep the outcome.
                log.error(
                    "bad-retry-after",
                    "%r returned retry_after=%r; expected seconds as a number >= 0",
                    transport,
                    wait,
                )
                outcomes[index] = Outcome(outcome.kind, outcome.reason, outcome.detail, None, outcome.about)
    if problem is None:
        return outcomes
    detail = f"{transport!r}.send {problem}"
    log.error("bad-outcomes", "%s; the events stay buffered (a bug in the transport)", detail)
    return [Outcome.retry("transport_error", detail)] * count


class Verdict(NamedTuple):
    """What one answer says, as a whole."""

    #: Events the backend took.
    delivered: int
    #: Events settled for good (REJECTED), by loss reason.
    lost: dict[str, int]
    #: RETRY outcomes (DEFERRED are not counted: not a failure).
    retries: int
    #: RETRY outcomes about the backend.
    backend_retries: int
    #: The largest Retry-After asked for, if any.
    retry_after: float | None
    #: The outcome to show as the last error (the first failure), if any.
    error: Outcome | None

    @property
    def moved(self) -> bool:
        """Something was settled: the backend answered about these events."""
        return bool(self.delivered or self.lost)

    @property
    def about_backend(self) -> bool:
        """Nothing was settled and a RETRY was about the backend: it is down or overloaded."""
        return not self.moved and self.backend_retries > 0


_ALL_DELIVERED_LOST: dict[str, int] = {}


def classify(outcomes: Sequence[Outcome]) -> Verdict:
    """The answer as a whole."""
    if outcomes.count(DELIVERED) == len(outcomes):  # the common case, at C speed
        return Verdict(len(outcomes), _ALL_DELIVERED_LOST, 0, 0, None, None)
    delivered = retries = backend = 0
    lost: dict[str, int] = {}
    retry_after: float | None = None
    error: Outcome | None = None
    for outcome in outcomes:
        kind = outcome.kind
        if kind is OutcomeKind.DELIVERED:
            delivered += 1
        elif kind is OutcomeKind.RETRY:
            retries += 1
            if outcome.about is About.BACKEND:
                backend += 1
            if outcome.retry_after is not None:
                retry_after = max(retry_after or 0.0, outcome.retry_after)
            error = error or outcome
        elif kind is OutcomeKind.REJECTED:
            reason = outcome.reason or "rejected_by_backend"
            lost[reason] = lost.get(reason, 0) + 1
            error = error or outcome
    return Verdict(delivered, lost, retries, backend, retry_after, error)
