"""The contract between the outbox's worker and a transport."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .._run._serde import SerializedEvent

__all__ = ["DELIVERED", "About", "Outcome", "OutcomeKind", "SerializedEvent", "Transport"]


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


class About(enum.Enum):
    """What a RETRY is about, as the transport that got the answer knows it."""

    #: The backend (or the way to it): down, overloaded, slow, refusing connections (429, 502,
    #: 503, 504, timeouts, network errors, a broker away).  Every event would fare the same:
    #: the outbox slows down, with fewer requests in flight.
    BACKEND = "backend"
    #: Maybe this very event: the backend refused it, alone in its request or named in a
    #: per-event answer, while it may take others (Marquez, OpenMetadata and DataHub answer 500
    #: to an event they cannot map; Kafka's invalid or corrupt record).  A poison suspect: settled
    #: as ``poison`` if the backend keeps refusing it while it takes other events.
    EVENT = "event"
    #: Maybe one of the events of the request it travelled in, not saying which (a 500 to a
    #: batch): the outbox bisects the request to find the event the backend cannot take.
    REQUEST = "request"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one event of a batch.

    Build them with :meth:`delivered`, :meth:`retry`, :meth:`deferred` and :meth:`rejected`.
    """

    kind: OutcomeKind
    #: For REJECTED: the loss reason counted in ``Stats.dropped`` (``rejected_by_backend``,
    #: ``too_large``, ...).  For RETRY: a short word for what went wrong (``http_503``).
    reason: str = ""
    #: A human-readable explanation, kept as ``Stats.last_error``.  Never put secrets here.
    detail: str = ""
    #: For RETRY: the delay the server asked for, in seconds (``Retry-After``), if any.
    retry_after: float | None = None
    #: For RETRY: whether the answer is about the backend (the default) or about this event.
    about: About = About.BACKEND

    @staticmethod
    def delivered() -> Outcome:
        return DELIVERED

    @staticmethod
    def retry(
        reason: str, detail: str = "", retry_after: float | None = None, *, about: About = About.BACKEND
    ) -> Outcome:
        """Not delivered this time; ``about`` says whether the backend or this very event is
        the trouble (``About.EVENT``: a poison suspect)."""
        return Outcome(OutcomeKind.RETRY, reason, detail, retry_after, about)

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

    The worker calls ``send`` from the outbox's event loop, with several batches
    in flight at once (its lanes, up to ``max_concurrency``); a run's events are
    in one of them at a time.  Implementations must not raise for backend
    trouble: they return one :class:`Outcome` per event, in the batch's order,
    and say what a RETRY is about (:class:`About`).  (If ``send`` raises anyway,
    the worker treats the whole batch as RETRY about the backend and logs the
    error.)  ``deadline`` is a ``time.monotonic()`` value: return by then;
    the worker cancels ``send`` at the deadline if it has not returned.

    Keep each run's events in order: if an event of a run is RETRY or DEFERRED,
    a later event of the same run in the batch must not be delivered before it
    (send them in order, or return the same outcome for the later ones too).
    Return a little before ``deadline`` rather than be cancelled at it: a
    cancelled call's outcomes are lost, and its events count as undelivered.

    Optional: ``begin_close(deadline)``, called from any thread when the outbox's close
    begins, with its deadline (a ``time.monotonic()`` value), which may be earlier than the
    ``deadline`` of a ``send`` under way: a transport whose ``send`` may run long answers by
    then what it did (the openlineage-python adapter does).
    """

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]: ...

    async def aclose(self) -> None: ...
