"""Snapshots of what the outbox did: :class:`Stats` and :class:`CloseReport`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["CloseReport", "Stats"]


@dataclass(frozen=True, slots=True)
class Stats:
    """A consistent snapshot of the outbox's counters (``Outbox.stats()``).

    Every event handed to ``emit`` is in exactly one place::

        emitted == delivered + sum(dropped.values()) + queued_events + in_flight

    (``emit`` after close, or with lineage disabled, is counted in
    ``dropped["after_close"]`` or ``dropped["disabled"]`` but not in ``emitted``, so
    that equation reads :attr:`offered` on its left side: ``emitted`` plus those two.)
    """

    #: Events handed to ``emit``/``emit_async`` while the outbox was open, and with a spill
    #: the events it adopted from processes that are gone (``spill["recovered"]``).
    emitted: int
    #: Of those, how many ``emit`` accepted (returned True for).
    accepted: int
    #: Events the backend acknowledged.
    delivered: int
    #: Event deliveries attempted again after a retriable failure (one per event per retry).
    retried: int
    #: Events lost, by reason: ``dropped_full``, ``after_close``, ``dropped_shutdown``,
    #: ``rejected_by_backend``, ``too_large``, ``invalid_event``, ``disabled``,
    #: ``dropped_reentrant``, ``worker_stopped``; with a spill also ``spilled_at_close`` (handed
    #: on to the next outbox, not lost), ``dropped_spill_full`` and ``spill_lost``.
    dropped: Mapping[str, int]
    #: Events waiting in the buffer.
    queued_events: int
    #: Their size in bytes (exact for pre-serialized events, estimated for objects).
    queued_bytes: int
    #: Events taken by the worker and not yet settled (being sent, or waiting to retry).
    in_flight: int
    #: The most recent delivery problem, if any (never contains credentials).
    last_error: str | None
    #: ``closed``, ``open`` or ``half_open``.
    circuit: str
    #: A composite transport's members, each with its own accounts (empty for other
    #: transports).  Sending to every member (the default), each member has its own buffer
    #: and worker, and shows ``emitted`` (events handed to it), ``delivered``, ``retried``,
    #: ``queued_events``, ``in_flight`` and one count per loss reason (``dropped_full``,
    #: ``rejected_by_backend``, ...), with ``emitted == delivered + losses + queued_events +
    #: in_flight``; the outbox's own ``delivered`` then counts the events handed to every
    #: member.  A member that is itself such a composite is followed by its own members,
    #: named ``inner.member``.  A failover chain (``continue_on_success=False``) shows
    #: ``delivered``, ``retried`` and one count per rejection reason.
    members: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: The dead-letter file's own accounting (empty without one): ``written`` records, and
    #: records it could not take, by why: ``dead_letter_full`` (the file and ``FILE.1`` at
    #: their cap), ``dead_letter_error`` (a write failed: a full disk, a removed folder).  The
    #: events themselves are counted in ``dropped`` under their own reasons either way.
    dead_letter: Mapping[str, int] = field(default_factory=dict)
    #: With a ``spill_dir``: ``spilled_events`` (on disk, not settled: this outbox's and those
    #: it adopted), ``spilled_bytes`` and ``segments`` (the files it holds), ``written`` (events
    #: written in all), ``recovered`` (events of processes that are gone, adopted),
    #: ``recovering`` (of those, not read back yet), ``owners_adopted``, ``owners_left`` (gone
    #: processes whose files could not be taken over), ``not_spilled_full`` and
    #: ``not_spilled_failed`` (accepted events the disk refused: ``max_spill_bytes`` reached, or
    #: the disk failed; still held in memory, written later if still queued when it has room
    #: again), ``failed_<errno>`` (failed writes by error, such as ``failed_enospc``),
    #: ``overflow_events`` and ``stretch_events`` (the memory window: accepted beyond the queue,
    #: in memory and on disk only), ``corrupt_records``, ``torn_records``, ``unreadable_files``,
    #: ``foreign_files`` (what a replay could not use), ``lost_records`` and ``invalid_bodies``
    #: (events read back that were not there, or not JSON: counted ``spill_lost`` and
    #: ``invalid_event``), ``oldest_age`` (seconds since the oldest unsettled event of this
    #: outbox's was written).  Empty without a spill.
    spill: Mapping[str, float] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        """All events lost, whatever the reason."""
        return sum(self.dropped.values())

    @property
    def offered(self) -> int:
        """Every event passed to ``emit``, including those refused after close or while
        lineage is disabled."""
        return self.emitted + self.dropped.get("after_close", 0) + self.dropped.get("disabled", 0)


@dataclass(frozen=True, slots=True)
class CloseReport:
    """What ``close()`` achieved: the outbox's whole life, settled."""

    #: Events handed to ``emit`` while the outbox was open, and with a spill the events of
    #: processes that are gone that it adopted (``Stats.spill["recovered"]``): all it answered for.
    emitted: int
    #: Events the backend acknowledged.
    delivered: int
    #: Events not delivered, by reason (see ``Stats.dropped``).
    undelivered: Mapping[str, int]
    #: How long ``close`` took, in seconds.
    duration: float
    #: True when ``close`` stopped at its deadline with events still undelivered.
    timed_out: bool
    #: Events still held when this report was made: always 0, except in the provisional
    #: report of a ``close()`` called from a signal handler that interrupted its own
    #: thread inside the outbox (the sidecar settles them later).
    pending: int = 0
    #: A composite's members, each with its own final accounts (see ``Stats.members``): the
    #: outbox's ``delivered`` counts the events handed to every member; each member's own
    #: ``delivered`` and losses are here.
    members: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: With a spill: what was left in the spill directory beyond this outbox's own events
    #: (``spilled_at_close``): ``events`` of processes that are gone, found but not taken in by
    #: the deadline, and ``owners``, such processes whose files could not be taken over.  The
    #: next outbox started with the directory delivers them.
    spill_left: Mapping[str, int] = field(default_factory=dict)
    #: Events ``emit`` refused because lineage is disabled (``OPENLINEAGE_DISABLED=true``):
    #: an outbox that is disabled accepts nothing, so they are neither emitted nor lost (not
    #: in ``undelivered``); ``stats().dropped["disabled"]`` counts the same.
    disabled: int = 0

    @property
    def lost(self) -> int:
        """Events emitted and not delivered, whatever the reason."""
        return sum(self.undelivered.values())

    @property
    def complete(self) -> bool:
        """Everything emitted was delivered (by every member of a composite), and nothing a
        spill knows of was left undelivered in its directory."""
        return (
            self.lost == 0
            and self.pending == 0
            and not any(self.spill_left.values())
            and all(
                counts.get("emitted", counts.get("delivered", 0)) == counts.get("delivered", 0)
                for counts in self.members.values()
            )
        )
