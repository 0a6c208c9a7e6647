"""The contract between the outbox's worker and a transport."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .._serde import SerializedEvent

__all__ = ["DELIVERED", "Outcome", "OutcomeKind", "SerializedEvent", "Transport"]


class OutcomeKind(enum.Enum):
    #: The backend has the event; the outbox forgets it.
    DELIVERED = "delivered"
    #: Not delivered this time; the outbox keeps it and tries again after a backoff.
    RETRY = "retry"
    #: Never deliverable (bad event, too large, ...); counted under ``Outcome.reason``.
    REJECTED = "rejected"
    #: Not sent this time, by the transport's choice (it used the time it allows one call);
    #: the outbox sends it again at once, ahead of anything newer. Not a failure.
    DEFERRED = "deferred"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one event of a batch.

    Build them with :meth:`delivered`, :meth:`retry` and :meth:`rejected`.
    """

    kind: OutcomeKind
    #: For REJECTED: the loss reason counted in ``Stats.dropped`` (``rejected_by_backend``,
    #: ``too_large``, ...).  For RETRY: a short word for what went wrong (``http_503``).
    reason: str = ""
    #: A human-readable explanation, kept as ``Stats.last_error``.  Never put secrets here.
    detail: str = ""
    #: For RETRY: the delay the server asked for, in seconds (``Retry-After``), if any.
    retry_after: float | None = None

    @staticmethod
    def delivered() -> Outcome:
        return DELIVERED

    @staticmethod
    def retry(reason: str, detail: str = "", retry_after: float | None = None) -> Outcome:
        return Outcome(OutcomeKind.RETRY, reason, detail, retry_after)

    @staticmethod
    def deferred() -> Outcome:
        return _DEFERRED

    @staticmethod
    def rejected(reason: str = "rejected_by_backend", detail: str = "") -> Outcome:
        return Outcome(OutcomeKind.REJECTED, reason, detail)


DELIVERED = Outcome(OutcomeKind.DELIVERED)
_DEFERRED = Outcome(OutcomeKind.DEFERRED)


@runtime_checkable
class Transport(Protocol):
    """Ships batches of serialized events to a backend.

    The worker calls ``send`` with at most one batch at a time, from the
    outbox's event loop.  Implementations must not raise for backend trouble:
    they return one :class:`Outcome` per event, in the batch's order.  (If
    ``send`` raises anyway, the worker treats the whole batch as RETRY and logs
    the error.)  ``deadline`` is a ``time.monotonic()`` value: return by then;
    the worker cancels ``send`` at the deadline if it has not returned.

    Keep each run's events in order: if an event of a run is RETRY or DEFERRED,
    a later event of the same run in the batch must not be delivered before it
    (send them in order, or return the same outcome for the later ones too).
    Return a little before ``deadline`` rather than be cancelled at it: a
    cancelled call's outcomes are lost, and its events count as undelivered.
    """

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]: ...

    async def aclose(self) -> None: ...
