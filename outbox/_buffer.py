"""The bounded buffer between ``emit`` and the worker, and the event accounting.

Every event handed to ``emit`` ends in exactly one of: ``delivered``, a named
reason in ``dropped``, or still held (``queued`` or ``in_flight``).  All of it
is guarded by one lock that is never held across I/O.
"""

from __future__ import annotations

import enum
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from itertools import accumulate, islice, repeat, starmap
from typing import Any

__all__ = ["SIDE_MAX", "Buffer", "Policy", "Reason"]

_INF = float("inf")
# The most events parked by re-entrant emits (signal handlers) until the lock is free.
SIDE_MAX = 1024


class Policy(enum.Enum):
    """What ``emit`` does when the buffer is full."""

    #: Evict the oldest queued events to make room (keeps the freshest lineage).
    DROP_OLDEST = "drop_oldest"
    #: Refuse the new event.
    DROP_NEWEST = "drop_newest"
    #: Wait up to ``block_timeout`` for room, then refuse the new event.
    BLOCK = "block"


class Reason:
    """The names under which lost events are counted in ``Stats.dropped``."""

    #: The buffer was full (evicted under drop_oldest, refused under drop_newest or block).
    DROPPED_FULL = "dropped_full"
    #: ``emit`` after ``close`` began.
    AFTER_CLOSE = "after_close"
    #: Not acknowledged when the close deadline passed (a request cut off then may still have arrived).
    DROPPED_SHUTDOWN = "dropped_shutdown"
    #: The backend refused the event for good (HTTP 400/422, ...).
    REJECTED_BY_BACKEND = "rejected_by_backend"
    #: The backend kept answering 5xx to this event alone (``poison_attempts`` times) while it
    #: took other events: it cannot map it (Marquez answers 500 to an eventTime without a time).
    POISON = "poison"
    #: Larger than the transport or the batch limit can ever carry.
    TOO_LARGE = "too_large"
    #: Could not be serialized, or pre-serialized text that is not a JSON object.
    INVALID_EVENT = "invalid_event"
    #: Lineage is turned off (``OPENLINEAGE_DISABLED=true``).
    DISABLED = "disabled"
    #: ``emit`` from a signal handler (or a finalizer) that interrupted its own thread inside
    #: the outbox, when the small side queue such events wait in was full.
    DROPPED_REENTRANT = "dropped_reentrant"
    #: The worker stopped without being closed (see ``Stats.last_error``); nothing can be sent.
    WORKER_STOPPED = "worker_stopped"


# An event taken by the worker: (sequence number, the event as given, its size in bytes:
# exact for str/bytes, an estimate for objects until the worker serializes them).
Entry = tuple[int, Any, int]


class Buffer:
    def __init__(
        self,
        *,
        max_events: int,
        max_bytes: int,
        policy: Policy,
        block_timeout: float,
    ) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.policy = policy
        self.block_timeout = block_timeout
        # Re-entrant only so that the outbox can *detect* re-entry (``lock._is_owned()``) by a
        # signal handler or finalizer on a thread that holds it, and refuse instead of waiting
        # on itself; no code path ever takes it twice.
        self.lock = threading.RLock()
        #: True when the calling thread holds the lock: the caller is a signal handler or
        #: finalizer that interrupted that thread inside the outbox.
        self.owned: Callable[[], bool] = self.lock._is_owned  # type: ignore[attr-defined]
        # Notified (under the lock) whenever events leave the buffer: room for blocked
        # emitters, progress for flush waiters.
        self.progress = threading.Condition(self.lock)
        # Async waiters (emit_async under block, aflush): callables run after progress.
        self.async_waiters: set[Callable[[], None]] = set()
        # The queue is two parallel deques rather than one of tuples, so that emit allocates
        # no object the garbage collector tracks (and never triggers a collection).  The
        # event at queue[i] has sequence number head_seq + i.
        self.queue: deque[Any] = deque()
        self.sizes: deque[int] = deque()
        self.head_seq = 0
        self.queued_bytes = 0
        self.in_flight = 0
        self.in_flight_bytes = 0
        # Lowest sequence number among in-flight events (inf when none).
        self.in_flight_low: float = _INF
        # flush() asks the worker to skip lingering for events up to this sequence number.
        self.flush_target = -1
        self.closed = False
        # What a refused emit counts as: after_close, or disabled.
        self.refusal = Reason.AFTER_CLOSE
        # Set when close() has settled the accounts: a late worker must not touch them.
        self.finalized = False
        # Counters.
        self.emitted = 0
        self.accepted = 0
        self.delivered = 0
        self.retried = 0
        self.dropped: dict[str, int] = {}
        # The worker asks to be woken when the queue reaches these sizes.
        self.wake_at_events: float = 1
        self.wake_at_bytes: float = _INF
        # Running estimate of a serialized object event's size, refined by the worker; measured
        # once it has serialized an object event.
        self.estimate = 1024
        self.measured = False
        # With more than this many events queued (the sidecar is behind), emit measures one
        # object event in SAMPLE_EVERY itself, so a change in what events weigh is seen at once.
        self.sample_above = 1000
        # Events emitted re-entrantly (from a signal handler or finalizer that interrupted a
        # thread holding the lock): (event, size), or (None, reason) for a refusal.  A deque's
        # append is atomic and needs no lock; the next holder of the lock folds them in.
        self.side: deque[tuple[Any, Any]] = deque()

    def learn_locked(self, observed: int) -> int:
        """Take one observed size (of an object event, serialized) into the estimate: up at
        once (an estimate that is short lets large events overrun ``max_bytes``), down slowly.
        Returns the estimate before."""
        before = self.estimate
        if not self.measured or observed >= before:
            self.estimate = max(64, observed)
        else:
            self.estimate = max(64, (before * 7 + observed) // 8)
        self.measured = True
        return before

    # -- emitters' side ----------------------------------------------------------------

    def put_locked(self, event: Any, nbytes: int) -> int:
        """Try to add one event; the caller holds the lock and has counted it as emitted.

        Returns 1 if accepted, 2 if accepted and the worker must be woken, 0 if there is
        no room (nothing counted: the caller applies the policy).
        """
        queue = self.queue
        if (
            len(queue) + self.in_flight >= self.max_events
            or self.queued_bytes + self.in_flight_bytes + nbytes > self.max_bytes
        ) and (
            nbytes > self.max_bytes or self.policy is not Policy.DROP_OLDEST or not self._evict_for(nbytes)
        ):
            return 0
        queue.append(event)
        self.sizes.append(nbytes)
        self.queued_bytes += nbytes
        self.accepted += 1
        if len(queue) >= self.wake_at_events or self.queued_bytes >= self.wake_at_bytes:
            self.wake_at_events = self.wake_at_bytes = _INF
            return 2
        return 1

    def _evict_for(self, nbytes: int) -> bool:
        queue = self.queue
        evicted = 0
        while queue and (
            len(queue) + self.in_flight >= self.max_events
            or self.queued_bytes + self.in_flight_bytes + nbytes > self.max_bytes
        ):
            queue.popleft()
            self.queued_bytes -= self.sizes.popleft()
            self.head_seq += 1
            evicted += 1
        if evicted:
            self.count_locked(Reason.DROPPED_FULL, evicted)
        return len(queue) + self.in_flight < self.max_events and (
            self.queued_bytes + self.in_flight_bytes + nbytes <= self.max_bytes
        )

    def shed_locked(self, nbytes: int) -> int:
        """Drop queued events until ``nbytes`` are freed (or the queue is empty), by the
        policy: the oldest under ``drop_oldest``, else the newest.  Returns the bytes freed."""
        queue, sizes = self.queue, self.sizes
        freed = 0
        n = 0
        oldest = self.policy is Policy.DROP_OLDEST
        while queue and freed < nbytes:
            if oldest:
                queue.popleft()
                freed += sizes.popleft()
                self.head_seq += 1
            else:
                queue.pop()
                freed += sizes.pop()
            n += 1
        if n:
            self.queued_bytes -= freed
            self.count_locked(Reason.DROPPED_FULL, n)
        return freed

    def has_room_locked(self, nbytes: int) -> bool:
        return len(self.queue) + self.in_flight < self.max_events and (
            self.queued_bytes + self.in_flight_bytes + nbytes <= self.max_bytes
        )

    def count_locked(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    # -- worker's side --------------------------------------------------------------------

    def notify_locked(self) -> None:
        """Events left the buffer: wake whoever waits for room or for a flush."""
        self.progress.notify_all()
        for waiter in tuple(self.async_waiters):
            waiter()

    def take_locked(self, max_events: int, max_bytes: int) -> list[Entry]:
        """Move up to ``max_events`` events (and ``max_bytes``, but at least one) from the
        queue to in flight.  The caller holds the lock: this runs at C speed (no Python
        loop over the events), since every ``emit`` waits for it."""
        queue, sizes = self.queue, self.sizes
        n = min(len(queue), max_events)
        if not n:
            return []
        if n == len(queue) and self.queued_bytes <= max_bytes:
            size = self.queued_bytes
        else:
            totals = list(accumulate(islice(sizes, n)))
            if totals[-1] > max_bytes:
                n = max(1, bisect_right(totals, max_bytes))
            size = totals[n - 1]
        seq = self.head_seq
        batch = list(
            zip(
                range(seq, seq + n),
                starmap(queue.popleft, repeat((), n)),
                starmap(sizes.popleft, repeat((), n)),
                strict=False,
            )
        )
        self.in_flight_low = min(self.in_flight_low, seq)
        self.head_seq = seq + n
        self.queued_bytes -= size
        self.in_flight += n
        self.in_flight_bytes += size
        return batch

    def untake_locked(self, entries: list[Entry]) -> bool:
        """Put events taken last (the newest of the last take, in order) back at the head of
        the queue, as if they had not been taken.  Returns False, changing nothing, if the
        policy has evicted newer events from the head meanwhile (then these older ones would
        have gone first: the caller drops them)."""
        if self.head_seq != entries[-1][0] + 1:
            return False
        queue, sizes = self.queue, self.sizes
        size = 0
        for _, event, nbytes in reversed(entries):
            queue.appendleft(event)
            sizes.appendleft(nbytes)
            size += nbytes
        self.head_seq = entries[0][0]
        self.queued_bytes += size
        self.in_flight -= len(entries)
        self.in_flight_bytes -= size
        return True

    @property
    def next_seq(self) -> int:
        """The sequence number the next accepted event will get."""
        return self.head_seq + len(self.queue)

    def clear_locked(self) -> int:
        """Forget everything held (queued and in flight); returns how many events that was."""
        held = len(self.queue) + self.in_flight
        self.head_seq += len(self.queue)
        self.queue.clear()
        self.sizes.clear()
        self.queued_bytes = self.in_flight = self.in_flight_bytes = 0
        self.in_flight_low = _INF
        return held

    def lowest_unsettled_locked(self) -> float:
        """Sequence number of the oldest event not yet delivered or dropped."""
        return min(self.in_flight_low, self.head_seq)

    def put_reentrant(self, event: Any, nbytes: int) -> bool:
        """``emit`` re-entered on a thread that holds the lock: park the event in the side
        queue (bounded by ``SIDE_MAX``) for the next holder of the lock to take in."""
        side = self.side
        if self.closed:
            side.append((None, self.refusal))
            return False
        if len(side) >= SIDE_MAX:
            side.append((None, Reason.DROPPED_REENTRANT))
            return False
        side.append((event, nbytes))
        return True

    def fold_side_locked(self) -> bool:
        """Take in what was emitted re-entrantly.  Returns True if an event was queued."""
        side = self.side
        queued = False
        while side:
            event, nbytes = side.popleft()
            if event is None:
                if nbytes != Reason.AFTER_CLOSE and nbytes != Reason.DISABLED:
                    self.emitted += 1
                self.count_locked(nbytes)
                continue
            self.emitted += 1
            if self.closed and self.finalized:
                self.count_locked(Reason.DROPPED_SHUTDOWN)
            elif self.put_locked(event, nbytes):
                queued = True
            else:
                self.count_locked(Reason.TOO_LARGE if nbytes > self.max_bytes else Reason.DROPPED_FULL)
        return queued

    def snapshot_locked(self) -> dict[str, Any]:
        self.fold_side_locked()
        return self.snapshot_unlocked()

    def snapshot_unlocked(self) -> dict[str, Any]:
        """The counters as they are (read without the lock only by a re-entrant caller)."""
        side = [size for event, size in list(self.side) if event is not None]
        refused = [reason for event, reason in list(self.side) if event is None]
        dropped = dict(self.dropped)
        for reason in refused:
            dropped[reason] = dropped.get(reason, 0) + 1
        pending = len(side) + sum(r not in (Reason.AFTER_CLOSE, Reason.DISABLED) for r in refused)
        return {
            "emitted": self.emitted + pending,
            "accepted": self.accepted,
            "delivered": self.delivered,
            "retried": self.retried,
            "dropped": dropped,
            "queued_events": len(self.queue) + len(side),
            "queued_bytes": self.queued_bytes + sum(side),
            "in_flight": self.in_flight,
        }
