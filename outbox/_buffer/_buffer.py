"""The bounded buffer between ``emit`` and the worker, and the event accounting.

Every event handed to ``emit`` ends in exactly one of: ``delivered``, a named
reason in ``dropped``, or still held (``queued`` or ``in_flight``).  All of it
is guarded by one lock that is never held across I/O.

What is held, by count and by bytes, is the buffer's part ``Holdings`` (``_holdings.py``,
``Buffer.holdings``); this module is the admission: ``put``'s fast and slow paths, the overflow policies,
the wait for room under ``block``, the side queue of re-entrant emits, close, and the counters.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from .._run._serde import SerializedEvent, serialize
from ._holdings import (
    _INF,
    FIRST_ESTIMATE,
    MEASURE_HERE_AFTER,
    UNLOOKED_MOST,
    Admission,
    Entry,
    Holdings,
    Measure,
    is_exact,
)
from ._losses import Losses

__all__ = [
    "FIRST_ESTIMATE",
    "MEASURE_HERE_AFTER",
    "SIDE_MAX",
    "UNLOOKED_MOST",
    "Buffer",
    "Entry",
    "Policy",
    "Reason",
    "count_held_locked",
    "is_exact",
]

# The answers of ``put``, as module names: read on emit's path (a global, not an attribute).
REFUSED, ACCEPTED, WAKE = Admission.REFUSED, Admission.ACCEPTED, Admission.WAKE

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
    #: Not delivered by the close deadline, but written to the spill directory, where the
    #: next outbox to start with it adopts and delivers them (not lost: handed on).
    SPILLED_AT_CLOSE = "spilled_at_close"
    #: With a spill, refused while the buffer overflows to disk (see ``_spill._window``)
    #: because the spill directory holds ``max_spill_bytes``.
    DROPPED_SPILL_FULL = "dropped_spill_full"
    #: With a spill, an event held on disk only (the memory window's stretch) whose record was
    #: found damaged when read back, or whose files were removed under the running outbox.
    SPILL_LOST = "spill_lost"


def serialize_held(
    picked: list[tuple[int, Any]], checkpoint: Callable[[], object] | None = None, budget: float = _INF
) -> list[tuple[int, Any, SerializedEvent | None]]:
    """The one way held events are serialized, outside the lock, for their place in the queue
    (:meth:`Buffer.serialized_in_place_locked`) and the spill's disk: ``(number, event, its
    serialized form)`` of each of ``picked`` (number and event), None for one that cannot be
    (taking it counts it ``invalid_event``); one serialized already is its own form.
    ``checkpoint`` runs before each (the sidecar's slices hand the GIL back between two);
    after ``budget`` seconds the rest is left out."""
    out: list[tuple[int, Any, SerializedEvent | None]] = []
    started = time.perf_counter()
    for seq, event in picked:
        if checkpoint is not None:
            checkpoint()
        try:
            out.append((seq, event, event if event.__class__ is SerializedEvent else serialize(event)))
        except Exception:
            out.append((seq, event, None))
        if budget < _INF and time.perf_counter() - started > budget:
            break
    return out


class Buffer:
    """The queue between ``emit`` and the worker, and every event's account.  ``emit`` visits
    it once (:meth:`put`), whose fast paths compare queue lengths the holdings keep
    (``object_room``, ``wake_at_objects``, ``full_at``: ``Holdings.recompute_locked``).  What it
    holds, by count and bytes, is its part :attr:`holdings`, which the worker and the spill
    use directly; the buffer adds who gets in, what the policy drops, who waits, and the counts.
    """

    __slots__ = (
        "__weakref__",  # the metrics' registry holds buffers weakly
        "async_waiters",
        "block_timeout",
        "delivered",
        "evicts",
        "finalized",
        "flush_target",
        "full_drops",
        "full_reason",
        "holdings",
        "lock",
        "losses",
        "measure_asked",
        "no_block_thread",
        "owned",
        "policy",
        "progress",
        "refusal",
        "refused",
        "retried",
        "side",
        "wake_for_room",
    )

    def __init__(
        self,
        *,
        max_events: int,
        max_bytes: int,
        policy: Policy,
        block_timeout: float,
    ) -> None:
        #: What it holds, queued and in flight, by count and bytes (its accounts).
        self.holdings = Holdings(max_events=max_events, max_bytes=max_bytes)
        # What a refusal for room counts as (with a spill overflowing: ``dropped_spill_full``).
        self.full_reason = Reason.DROPPED_FULL
        self.policy = policy
        self.holdings.full_fast = policy is not Policy.BLOCK
        #: Full, an object makes room by evicting the oldest (drop_oldest), or is refused.
        self.evicts = policy is Policy.DROP_OLDEST
        self.block_timeout = block_timeout
        # Re-entrant only so that re-entry by a signal handler or finalizer on a thread that
        # holds it is *detected* (``lock._is_owned()``); no code path ever takes it twice.
        self.lock = threading.RLock()
        #: True when the calling thread holds the lock (a signal handler or finalizer in it).
        self.owned: Callable[[], bool] = self.lock._is_owned  # type: ignore[attr-defined]
        # Notified (under the lock) when events leave: room for blocked emitters, flushes.
        self.progress = threading.Condition(self.lock)
        # Async waiters (emit_async under block, aflush): callables run after progress.
        self.async_waiters: set[Callable[[], None]] = set()
        # flush() asks the worker to skip lingering for events up to this sequence number.
        self.flush_target = -1
        # What a refused emit counts as: after_close, or disabled.
        self.refusal = Reason.AFTER_CLOSE
        # Set when close() has settled the accounts: a late worker must not touch them.
        self.finalized = False
        self.no_block_thread: int | None = None
        self.wake_for_room: Callable[[], None] = _nothing
        # Counters.  Offered events that were not accepted (``emitted`` less ``accepted``).
        self.refused = 0
        self.delivered = 0
        self.retried = 0
        self.losses = Losses()
        self.full_drops = self.losses.cell(self.full_reason)  # (``put``'s fast path counts here)
        # The first object queued asked the sidecar to measure it (the estimate a guess till then).
        self.measure_asked = False
        # Events emitted re-entrantly (a signal handler or finalizer interrupted a thread that
        # held the lock): (event, size), or (None, reason) for a refusal; an atomic append,
        # folded in by the next holder of the lock.
        self.side: deque[tuple[Any, Any]] = deque()

    def set_sidecar(self, thread: int | None, wake: Callable[[], None]) -> None:
        """The sidecar's ``thread``, where ``put`` never waits under ``block``, and its ``wake``
        for an emitter about to wait for room, sent even with a wake-up on its way: the waiting
        thread may hold that one (a signal handler between an emit's marking it and sending it)."""
        self.no_block_thread, self.wake_for_room = thread, wake

    def spill_full_locked(self, full: bool) -> None:
        """A refusal for room counts as ``dropped_spill_full`` while the spill is ``full``."""
        self.full_reason = Reason.DROPPED_SPILL_FULL if full else Reason.DROPPED_FULL
        self.full_drops = self.losses.cell(self.full_reason)

    @property
    def dropped(self) -> dict[str, int]:
        """Events lost so far, by reason (``Losses.by_reason``)."""
        return self.losses.by_reason()

    @property
    def emitted(self) -> int:
        """Events offered to an open outbox so far (accepted, or refused and counted)."""
        return self.holdings.next_seq + self.refused

    def learn_locked(self, observed: int) -> int:
        """Take an observed mean size of serialized objects into the estimate (``reestimate_locked``)
        and, if it grew, enforce the byte bound by the policy.  Returns the estimate before."""
        before = self.holdings.reestimate_locked(observed)
        if self.holdings.estimate > before:
            self.enforce_bound_locked()
        return before

    def serialized_in_place_locked(self, done: Iterable[tuple[int, Any, SerializedEvent]]) -> int:
        """Queued events serialized outside the lock (``(number, event, its serialized form)``)
        take their serialized form's place, at its exact size, each if it is still queued as it
        was (not taken, evicted, shed or put in its place meanwhile); what the objects among
        them weigh teaches the estimate (:meth:`learn_locked`).  The one way to serialize queued
        events in place: the intake's sampling, an emitter's measure, the spill's writes (one
        serialized already, its own serialized form, stays as it is), in the queue or in the
        spill's overflow.  Returns how many took their place."""
        held = self.holdings
        placed = objects = total = 0
        for seq, event, ser in done:
            size = held.place_locked(seq, event, ser)
            if size >= 0:
                placed += 1
                if size:
                    objects += 1
                    total += size
        if objects:
            self.learn_locked(total // objects)
        return placed

    def looked_locked(self, end: int, measured: bool = True) -> None:
        """:meth:`Holdings.looked_locked`, and emitters waiting under ``block`` for the look
        (``Holdings.held_back_locked``) are told when it lets objects in again."""
        if self.holdings.looked_locked(end, measured):
            self.notify_locked()

    def enforce_bound_locked(self) -> int:
        """Shed queued events by the policy until what is held fits ``max_bytes`` again (after
        the estimate grew, or a serialized event was found larger than its estimate).
        Returns the bytes still over the bound (in flight: only the queue can be shed)."""
        over = self.holdings.held_bytes_locked() - self.holdings.max_bytes
        if over > 0:
            over -= self.shed_locked(over)
            self.holdings.recompute_locked()
        return max(0, over)

    # -- emitters' side ----------------------------------------------------------------

    def put(self, event: Any, nbytes: int) -> Admission:
        """``emit``'s visit: offer one event of ``nbytes`` bytes (0: an object, at the estimate).
        Returns ``ACCEPTED``, ``WAKE`` (wake the worker) or ``REFUSED`` (counted); waits only under
        ``block`` off the sidecar's thread.  An object with room costs a comparison and two
        appends; in a full buffer (``full_at``) or into the spill's overflow, a few more."""
        lock = self.lock
        if lock._is_owned():  # type: ignore[attr-defined]  # (self.owned(), called the quicker way)
            # A signal handler or finalizer interrupted this very thread inside the outbox:
            # the lock will not be released until we return.  Park the event aside.
            return WAKE if self.put_reentrant(event, nbytes) else REFUSED
        lock.acquire()
        try:
            held = self.holdings  # (one alias: each slot read costs what it did on the buffer)
            queue = held.queue
            n = len(queue)
            if nbytes:
                return self._put_text_locked(event, nbytes, n)
            if n >= held.object_room:
                over = held.overflow  # (the spill's, overflowing: its own fast path, ``_spill._window``)
                if over is not None and len(over.events) < over.fast_room:
                    return over.put_object(held, event)
                numbers = held.numbers
                first = numbers.head
                if n != held.full_at or first >= held.full_until:  # (or past the sidecar's look)
                    return self._put_slow_locked(event, nbytes)
                self.full_drops[0] += 1
                if not self.evicts:  # drop_newest
                    self.refused += 1
                    return REFUSED
                # drop_oldest: the oldest goes, this one takes its place (the accounts as they were,
                # unless the oldest had its exact size: recomputed).  (``evict_oldest_locked``, inlined.)
                size = held.sizes.popleft()
                gone = queue.popleft()
                queue.append(event)
                held.sizes.append(0)
                if numbers.jumps:
                    numbers.advance(1)
                else:
                    numbers.head = first + 1  # (and its position: ``Numbering.lag``)
                if held.journal is not None:
                    held.journal.note(first, numbers.head, self.full_reason)
                if size:
                    held.exact_bytes -= size
                    held.exact_count -= 1
                    held.recompute_locked()
                else:  # an object, at the estimate: freed by the sidecar (``Holdings.evicted``)
                    held.evicted.append(gone)
                if n < held.wake_at_objects:
                    return ACCEPTED
                held.wake_at_events = held.wake_at_bytes = held.wake_at_objects = _INF
                return WAKE
            queue.append(event)
            held.sizes.append(0)
            if n < held.wake_at_objects - 1:
                return ACCEPTED
            held.wake_at_events = held.wake_at_bytes = held.wake_at_objects = _INF
            return WAKE
        finally:
            lock.release()

    def _put_text_locked(self, event: Any, nbytes: int, n: int) -> Admission:
        """:meth:`put` for text (its exact size known): checked against the accounts as they
        are, then the fast path's numbers lowered without recomputing them."""
        held = self.holdings
        estimate = held.estimate
        queued = held.exact_bytes + (n - held.exact_count) * estimate + nbytes
        if (
            held.closed
            or n + held.in_flight >= held.room_events
            or queued + held.in_flight_bytes > held.room_bytes
        ):
            return self._put_slow_locked(event, nbytes)
        held.queue.append(event)
        held.sizes.append(nbytes)
        held.exact_bytes += nbytes
        held.exact_count += 1
        # Lowered by nbytes // estimate: never above the exact figure (a recompute makes it so).
        drop = nbytes // estimate
        held.object_room -= drop
        held.wake_at_objects -= drop
        if n + 1 >= held.wake_at_events or queued >= held.wake_at_bytes:
            held.wake_at_events = held.wake_at_bytes = held.wake_at_objects = _INF
            return WAKE
        return ACCEPTED

    def _put_slow_locked(self, event: Any, nbytes: int) -> Admission:
        """:meth:`put` when the fast path does not apply: closed, full, or the first object
        (whose size the sidecar has yet to measure)."""
        if self.holdings.closed:
            self.refuse_locked()
            return REFUSED
        result = self.put_locked(event, nbytes)
        if not result:
            if nbytes > self.holdings.max_bytes:  # (an object is never refused for its estimate)
                self.drop_offered_locked(Reason.TOO_LARGE)
            elif self.policy is Policy.BLOCK and threading.get_ident() != self.no_block_thread:
                result = self._wait_for_room_locked(event, nbytes)
            else:
                self.drop_offered_locked(self.full_reason)
        return result

    def _wait_for_room_locked(self, event: Any, nbytes: int) -> Admission:
        """Wait (the lock released) up to ``block_timeout`` for room for an event offered; counts
        it ``dropped_full`` (``dropped_shutdown`` if closed meanwhile) if none comes."""
        deadline = time.monotonic() + self.block_timeout
        self.wake_for_room()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.holdings.closed:
                self.drop_offered_locked(
                    Reason.DROPPED_SHUTDOWN if self.holdings.closed else self.full_reason
                )
                return REFUSED
            self.progress.wait(remaining)
            if not self.holdings.closed:
                result = self.put_locked(event, nbytes)
                if result:
                    return result

    def put_locked(self, event: Any, nbytes: int) -> Admission:
        """Try to add one event of ``nbytes`` bytes (0: an object, at the estimate), making room
        under drop_oldest (with a spill: to the queue within its share, else to the overflow,
        ``_spill._window``).
        Returns ``ACCEPTED``, ``WAKE`` (the worker must be woken too) or ``REFUSED`` if there is
        no room (nothing counted: the caller applies the policy, and counts with
        :meth:`drop_offered_locked`)."""
        held = self.holdings
        if held.held_back_locked(nbytes):
            return REFUSED
        overflow = held.overflow
        if overflow is None:
            result = self.queue_locked(event, nbytes)
        else:
            result = overflow.put(self, event, nbytes)
            if not result and self.policy is Policy.DROP_OLDEST and self._evict_for(nbytes or held.estimate):
                result = overflow.put(self, event, nbytes)  # (evicted from the queue: room in the overflow)
        if result and not nbytes and held.next_seq >= held.look_end and held.measure_here is Measure.SIDECAR:
            # An object queued as far past the sidecar's last look as may be (``UNLOOKED_MOST``;
            # it cannot run, or not often enough): its emitter measures the newest object
            # (emit sees ``WAKE``, and ``_worker._intake.measure_here``).
            held.measure_here = Measure.DUE
            result = WAKE
        return result

    def queue_locked(self, event: Any, nbytes: int) -> Admission:
        """:meth:`put_locked` to the queue itself."""
        held = self.holdings
        queue = held.queue
        price = nbytes or held.estimate
        held_bytes = held.held_bytes_locked()
        if (len(queue) + held.in_flight >= held.max_events or held_bytes + price > held.max_bytes) and (
            price > held.max_bytes or self.policy is not Policy.DROP_OLDEST or not self._evict_for(price)
        ):
            held.recompute_locked()  # (evictions may have happened)
            return REFUSED
        queue.append(event)
        held.sizes.append(nbytes)
        result = ACCEPTED
        if nbytes:
            held.exact_bytes += nbytes
            held.exact_count += 1
        elif not held.measured and not self.measure_asked:
            # The first object: the sidecar measures it now, so the estimate is not a guess.
            self.measure_asked = True
            held.wake_at_events = held.wake_at_bytes = _INF
            result = WAKE
        if result == ACCEPTED and (
            len(queue) >= held.wake_at_events
            or held_bytes - held.in_flight_bytes + price >= held.wake_at_bytes
        ):
            held.wake_at_events = held.wake_at_bytes = _INF
            result = WAKE
        held.recompute_locked()
        return result

    def drop_offered_locked(self, reason: str, n: int = 1) -> None:
        """``n`` events offered (to ``emit``, or to a composite's member) are refused: counted."""
        self.refused += n
        self.count_locked(reason, n)

    def _evict_for(self, nbytes: int) -> bool:
        held, reason, evicted = self.holdings, self.full_reason, 0
        while held.queue and nbytes <= held.max_bytes and not held.has_room_locked(nbytes):
            held.evict_oldest_locked(reason)  # (nothing is evicted for an event that never fits)
            evicted += 1
        if evicted:
            self.count_locked(reason, evicted)
            held.recompute_locked()
        return held.has_room_locked(nbytes)

    def shed_locked(self, nbytes: int) -> int:
        """Drop queued events until ``nbytes`` are freed (or none is left), the oldest under
        ``drop_oldest``, else the newest.  Returns the bytes freed."""
        held = self.holdings
        freed = 0
        n = 0
        # (While the buffer overflows to the spill, the newest queued are not the newest.)
        oldest = self.policy is Policy.DROP_OLDEST or held.beyond
        pop = held.evict_oldest_locked if oldest else held.drop_newest_locked
        while held.queue and freed < nbytes:
            freed += pop(Reason.DROPPED_FULL)
            n += 1
        if n:
            self.count_locked(Reason.DROPPED_FULL, n)
            held.recompute_locked()
        return freed

    def count_locked(self, reason: str, n: int = 1) -> None:
        self.losses.count(reason, n)

    # -- worker's side --------------------------------------------------------------------

    def notify_locked(self) -> None:
        """Events left the buffer: wake whoever waits for room or for a flush."""
        self.progress.notify_all()
        for waiter in tuple(self.async_waiters):
            waiter()

    def settle_locked(self, n_events: int, n_bytes: int, lowest: float) -> None:
        """``n_events`` in-flight events (``n_bytes``) are settled (delivered or counted); ``lowest``
        is the oldest number still in flight (inf: none).  Wakes whoever waits for room or flush."""
        self.holdings.settle_locked(n_events, n_bytes, lowest)
        self.notify_locked()

    def record_answer_locked(self, delivered: int, retried: int) -> None:
        """Count what the backend took, and the events it asked to have sent again."""
        self.delivered += delivered
        self.retried += retried

    def refuse_locked(self) -> None:
        """An event offered while closed: counted under the buffer's refusal (and as emitted
        when offered to an outbox that was open: its worker is gone)."""
        if self.refusal == Reason.WORKER_STOPPED:
            self.refused += 1
        self.count_locked(self.refusal)

    def close_locked(self, refusal: str | None = None, *, final: bool = False) -> None:
        """Accept nothing more (counted under ``refusal``, if given, from now on); ``final``:
        nothing held will be sent either.  Blocked emitters and flushes are woken."""
        self.close_unlocked(refusal)
        if final:
            self.finalized = True
        self.notify_locked()

    def close_unlocked(self, refusal: str | None = None) -> None:
        """:meth:`close_locked` from a signal handler in the lock's holder: atomic stores."""
        if refusal is not None:
            self.refusal = refusal
        self.holdings.closed = True
        self.holdings.object_room, self.holdings.full_at = 0, -1
        if self.holdings.overflow is not None:
            self.holdings.overflow.fast_room = 0

    def ask_flush_locked(self, target: int) -> None:
        """Send every event up to sequence number ``target`` without lingering."""
        self.flush_target = max(self.flush_target, target)

    def put_reentrant(self, event: Any, nbytes: int) -> bool:
        """``emit`` re-entered on a thread that holds the lock: the event waits in the side queue
        (at most ``SIDE_MAX``) for the next holder of the lock."""
        side = self.side
        if self.holdings.closed:
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
                    self.refused += 1
                self.count_locked(nbytes)
                continue
            if self.holdings.closed and self.finalized:
                self.drop_offered_locked(Reason.DROPPED_SHUTDOWN)
            elif self.put_locked(event, nbytes):
                queued = True
            else:
                self.drop_offered_locked(
                    Reason.TOO_LARGE if nbytes > self.holdings.max_bytes else Reason.DROPPED_FULL
                )
        return queued

    def snapshot_locked(self) -> dict[str, Any]:
        self.fold_side_locked()
        return self.snapshot_unlocked()

    def snapshot_unlocked(self) -> dict[str, Any]:
        """The counters as they are (read without the lock only by a re-entrant caller)."""
        return _counters(self)

    def watch_locked(self, waiter: Callable[[], None], watching: bool = True) -> None:
        """Run ``waiter`` after each progress (an async waiter), or no longer."""
        (self.async_waiters.add if watching else self.async_waiters.discard)(waiter)


def count_held_locked(buf: Buffer, on_disk: int, reason: str) -> int:
    """The events still held at the end (a close, a stopped worker) are let go: ``on_disk`` of
    them handed on in the spill directory (``spilled_at_close``), the rest lost under ``reason``.
    Returns how many were lost."""
    held = buf.holdings.clear_locked()
    kept = min(held, on_disk)
    if kept:
        buf.count_locked(Reason.SPILLED_AT_CLOSE, kept)
    if held > kept:
        buf.count_locked(reason, held - kept)
    return held - kept


def _counters(buf: Buffer) -> dict[str, Any]:
    side = [size for event, size in list(buf.side) if event is not None]
    refused = [reason for event, reason in list(buf.side) if event is None]
    dropped = dict(buf.dropped)
    for reason in refused:
        dropped[reason] = dropped.get(reason, 0) + 1
    pending = len(side) + sum(r not in (Reason.AFTER_CLOSE, Reason.DISABLED) for r in refused)
    return {
        "emitted": buf.emitted + pending,
        "accepted": buf.holdings.accepted,
        "delivered": buf.delivered,
        "retried": buf.retried,
        "dropped": dropped,
        "queued_events": len(buf.holdings.queue) + len(side) + buf.holdings.beyond,
        "queued_bytes": buf.holdings.queued_bytes
        + sum(side)
        + (buf.holdings.overflow.bytes(buf.holdings.estimate) if buf.holdings.overflow is not None else 0),
        "in_flight": buf.holdings.in_flight,
    }


def _nothing() -> None:
    """``Buffer.wake_for_room`` until a sidecar runs (its first wake starts it)."""
