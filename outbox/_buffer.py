"""The bounded buffer between ``emit`` and the worker, and the event accounting.

Every event handed to ``emit`` ends in exactly one of: ``delivered``, a named
reason in ``dropped``, or still held (``queued`` or ``in_flight``).  All of it
is guarded by one lock that is never held across I/O.
"""

from __future__ import annotations

import enum
import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from itertools import accumulate, islice, repeat, starmap
from typing import Any

from ._serde import SerializedEvent

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
    #: Not delivered by the close deadline, but written to the spill directory, where the
    #: next outbox to start with it adopts and delivers them (not lost: handed on).
    SPILLED_AT_CLOSE = "spilled_at_close"
    #: With a spill, refused while the buffer overflows to disk (see ``_window``) because the
    #: spill directory holds ``max_spill_bytes``.
    DROPPED_SPILL_FULL = "dropped_spill_full"


# An event taken by the worker: (sequence number, the event as given, its size in bytes:
# exact for str/bytes, an estimate for objects until the worker serializes them).
Entry = tuple[int, Any, int]

#: What an object counts for until the sidecar has measured one: emit never serializes, so
#: the size of an object event is unknown until the sidecar does.  4 KiB is several times a
#: typical event (0.5-1 KiB), and small enough that the default 64 MiB holds more objects than
#: the default max_events (10,000): a burst at start-up is never dropped for its estimate.
FIRST_ESTIMATE = 4096
_TEXT = (str, bytes, bytearray)


def is_exact(event: Any) -> bool:
    """Whether an event's size is known exactly (text, or serialized by the sidecar), rather
    than counted at the running estimate of an object's size."""
    return event.__class__ is SerializedEvent or isinstance(event, _TEXT)


class Buffer:
    """The queue between ``emit`` and the worker, and every event's account.

    ``emit`` visits it once, through :meth:`put`.  Its fast path (an object event, room to
    spare) compares one number and appends: what an object may still take is kept as a queue
    length, ``object_room``, and when the worker must be woken as another, ``wake_at_objects``,
    both recomputed by every other method that changes the accounts (:meth:`_recompute_locked`),
    all of which run in the sidecar or on the slow path.  Counts that would cost ``emit`` an
    addition are derived: ``accepted`` from the sequence numbers, ``estimated`` (objects
    queued at the estimate) from the queue's length, ``emitted`` from both and the refusals.
    """

    __slots__ = (
        "__weakref__",  # the metrics' registry holds buffers weakly
        "async_waiters",
        "beyond",
        "block_timeout",
        "closed",
        "delivered",
        "dropped",
        "estimate",
        "exact_bytes",
        "exact_count",
        "finalized",
        "flush_target",
        "full_reason",
        "head_seq",
        "in_flight",
        "in_flight_bytes",
        "in_flight_low",
        "lock",
        "max_bytes",
        "max_events",
        "measure_asked",
        "measured",
        "no_block_thread",
        "object_room",
        "owned",
        "policy",
        "progress",
        "queue",
        "refusal",
        "refused",
        "retried",
        "room_bytes",
        "room_events",
        "shed_newest",
        "side",
        "sizes",
        "wake_at_bytes",
        "wake_at_events",
        "wake_at_objects",
        "window",
    )

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
        # -- the spill's memory window (``_window``): the fast paths' bounds, which are
        # max_events / max_bytes without a spill; events accepted beyond the queue (in the
        # overflow, or released to disk); what a refusal for room counts as.
        self.room_events = max_events
        self.room_bytes = max_bytes
        self.window: Any = None
        self.beyond = 0
        self.full_reason = Reason.DROPPED_FULL
        # -- (end of the window's part)
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
        # event at queue[i] has sequence number head_seq + i; sizes[i] is its exact size, or 0
        # for an object counted at the running ``estimate`` (emit never serializes).
        self.queue: deque[Any] = deque()
        self.sizes: deque[int] = deque()
        self.head_seq = 0
        # Queued bytes = exact_bytes + estimated * estimate: when the estimate changes, every
        # queued object is re-priced at once, in O(1).  exact_count entries of the queue have
        # an exact size (exact_bytes in all); the others are objects (``estimated``).
        self.exact_bytes = 0
        self.exact_count = 0
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
        #: The thread on which ``put`` never waits under ``block`` (the sidecar's: waiting
        #: there would wait for itself); the policy then refuses at once.
        self.no_block_thread: int | None = None
        # Counters.  Offered events that were not accepted (``emitted`` less ``accepted``), and
        # the newest queued events shed under drop_newest (their sequence numbers are reused).
        self.refused = 0
        self.shed_newest = 0
        self.delivered = 0
        self.retried = 0
        self.dropped: dict[str, int] = {}
        # The worker asks to be woken when the queue reaches these sizes.
        self.wake_at_events: float = 1
        self.wake_at_bytes: float = _INF
        # The fast path's two numbers (see the class docstring): an object is appended while
        # the queue is shorter than object_room, and the worker woken when it reaches
        # wake_at_objects.  0 (no fast path) until the first object is measured.
        self.object_room: float = 0
        self.wake_at_objects: float = 1
        # Running estimate of a serialized object event's size, learnt by the sidecar (which
        # serializes every object it sends, and samples the newest queued ones while it is
        # behind); ``measured`` once it has measured one.  Until then the first object queued
        # wakes the sidecar, which measures it at once.
        self.estimate = FIRST_ESTIMATE
        self.measured = False
        self.measure_asked = False
        # Events emitted re-entrantly (from a signal handler or finalizer that interrupted a
        # thread holding the lock): (event, size), or (None, reason) for a refusal.  A deque's
        # append is atomic and needs no lock; the next holder of the lock folds them in.
        self.side: deque[tuple[Any, Any]] = deque()

    @property
    def estimated(self) -> int:
        """Objects queued, counted at the estimate (not serialized yet)."""
        return len(self.queue) - self.exact_count

    @property
    def accepted(self) -> int:
        """Events accepted so far: every one got the next sequence number."""
        return self.head_seq + len(self.queue) + self.beyond + self.shed_newest

    @property
    def emitted(self) -> int:
        """Events offered to an open outbox so far (accepted, or refused and counted)."""
        return self.head_seq + len(self.queue) + self.beyond + self.shed_newest + self.refused

    def _recompute_locked(self) -> None:
        """The fast path's numbers, after anything changed the accounts: the queue length up
        to which objects fit (by count, and by bytes at the estimate), and the one at which
        the worker asked to be woken."""
        n = len(self.queue)
        estimate = self.estimate
        held = self.exact_bytes + (n - self.exact_count) * estimate + self.in_flight_bytes
        if self.closed or not self.measured:
            self.object_room = 0
        else:
            room = n + (self.room_bytes - held) // estimate
            self.object_room = min(self.room_events - self.in_flight, room)
        wake = self.wake_at_events
        if self.wake_at_bytes != _INF:
            # objects until the bytes reach wake_at_bytes: ceil(missing / estimate), at least 1
            wake = min(wake, n + max(1, -(-(self.wake_at_bytes - held) // estimate)))
        self.wake_at_objects = wake

    @property
    def queued_bytes(self) -> int:
        """Bytes queued: exact sizes, and the estimate for each object not yet measured."""
        return self.exact_bytes + self.estimated * self.estimate

    def held_bytes_locked(self) -> int:
        """Bytes held, queued and in flight: what ``max_bytes`` bounds."""
        return self.exact_bytes + self.estimated * self.estimate + self.in_flight_bytes

    def learn_locked(self, observed: int) -> int:
        """Take an observed mean size (of object events, serialized) into the estimate: up at
        once (an estimate that is short lets large events overrun ``max_bytes``), down slowly;
        every queued object is re-priced with it, and the byte bound enforced by the policy.
        Returns the estimate before."""
        before = self.estimate
        grew = not self.measured or observed >= before
        estimate = observed if grew else (before * 7 + observed) // 8
        # Within max_bytes, so that an object always fits an empty buffer.
        self.estimate = min(max(64, estimate), self.max_bytes)
        self.measured = True
        if self.estimate > before:
            self.enforce_bound_locked()
        self._recompute_locked()
        return before

    def enforce_bound_locked(self) -> int:
        """Shed queued events by the policy until what is held fits ``max_bytes`` again (after
        the estimate grew, or a serialized event was found larger than its estimate).
        Returns the bytes still over the bound (in flight: only the queue can be shed)."""
        over = self.held_bytes_locked() - self.max_bytes
        if over > 0:
            over -= self.shed_locked(over)
            self._recompute_locked()
        return max(0, over)

    def replace_locked(self, index: int, ser: SerializedEvent) -> int:
        """Put the serialized form of the queued object at ``index`` in its place, at its
        exact size (the sidecar measured it).  Returns that size."""
        size = len(ser.body)
        old = self.sizes[index]
        if old:
            self.exact_bytes -= old
        else:
            self.exact_count += 1
        self.exact_bytes += size
        self.sizes[index] = size
        self.queue[index] = ser
        self._recompute_locked()
        return size

    # -- emitters' side ----------------------------------------------------------------

    def put(self, event: Any, nbytes: int) -> int:
        """``emit``'s whole visit to the buffer: offer one event of ``nbytes`` bytes (0: an
        object, counted at the estimate), under the policy.  Takes the lock itself.

        Returns 1 if accepted, 2 if accepted and the worker must be woken, 0 if refused
        (counted under its reason).  Never waits, except under ``block`` on a thread other
        than ``no_block_thread`` (the sidecar's), for up to ``block_timeout``.

        This is the hot path, paid by every handler call: an object with room to spare
        costs one comparison and two appends (see the class docstring); the lock is taken
        with ``acquire``/``release`` (a ``with`` costs twice as much); everything else is
        :meth:`_put_slow_locked`'s.
        """
        lock = self.lock
        if lock._is_owned():  # type: ignore[attr-defined]  # (self.owned(), called the quicker way)
            # A signal handler or finalizer interrupted this very thread inside the outbox:
            # the lock will not be released until we return.  Park the event aside.
            return 2 if self.put_reentrant(event, nbytes) else 0
        lock.acquire()
        try:
            queue = self.queue
            n = len(queue)
            if nbytes:
                return self._put_text_locked(event, nbytes, n)
            if n >= self.object_room:
                return self._put_slow_locked(event, nbytes)
            queue.append(event)
            self.sizes.append(0)
            if n < self.wake_at_objects - 1:
                return 1
            self.wake_at_events = self.wake_at_bytes = self.wake_at_objects = _INF
            return 2
        finally:
            lock.release()

    def _put_text_locked(self, event: Any, nbytes: int, n: int) -> int:
        """:meth:`put` for text (its exact size known): checked against the accounts as they
        are, then the fast path's numbers lowered without recomputing them."""
        estimate = self.estimate
        held = self.exact_bytes + (n - self.exact_count) * estimate + self.in_flight_bytes + nbytes
        if self.closed or n + self.in_flight >= self.room_events or held > self.room_bytes:
            return self._put_slow_locked(event, nbytes)
        self.queue.append(event)
        self.sizes.append(nbytes)
        self.exact_bytes += nbytes
        self.exact_count += 1
        # What objects may still take shrinks by these bytes: lowered by nbytes // estimate,
        # which never leaves it above the exact figure (the next recompute makes it exact).
        drop = nbytes // estimate
        self.object_room -= drop
        self.wake_at_objects -= drop
        if n + 1 >= self.wake_at_events or held >= self.wake_at_bytes:
            self.wake_at_events = self.wake_at_bytes = self.wake_at_objects = _INF
            return 2
        return 1

    def _put_slow_locked(self, event: Any, nbytes: int) -> int:
        """:meth:`put` when the fast path does not apply: closed, full, or the first object
        (whose size the sidecar has yet to measure)."""
        if self.closed:
            self.refuse_locked()
            return 0
        result = self.put_locked(event, nbytes)
        if not result:
            if nbytes > self.max_bytes:  # (an object is never refused for its estimate)
                self.drop_offered_locked(Reason.TOO_LARGE)
            elif self.policy is Policy.BLOCK and threading.get_ident() != self.no_block_thread:
                result = self._wait_for_room_locked(event, nbytes)
            else:
                self.drop_offered_locked(self.full_reason)
        return result

    def _wait_for_room_locked(self, event: Any, nbytes: int) -> int:
        """Wait (the lock released while waiting) up to ``block_timeout`` for room for an
        event already offered; counts it ``dropped_full`` (or ``dropped_shutdown`` if the
        outbox closes meanwhile) if none comes.  Returns what :meth:`put_locked` returns."""
        deadline = time.monotonic() + self.block_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed:
                self.drop_offered_locked(Reason.DROPPED_SHUTDOWN if self.closed else self.full_reason)
                return 0
            self.progress.wait(remaining)
            if not self.closed:
                result = self.put_locked(event, nbytes)
                if result:
                    return result

    def put_locked(self, event: Any, nbytes: int) -> int:
        """Try to add one event of ``nbytes`` bytes (0: an object, counted at the estimate),
        making room under drop_oldest (with a spill: to the queue's window, or to the
        overflow, see ``_window``).

        Returns 1 if accepted, 2 if accepted and the worker must be woken, 0 if there is
        no room (nothing counted: the caller applies the policy, and counts the event with
        :meth:`drop_offered_locked` if it gives up).
        """
        if self.window is not None:
            return int(self.window.put(self, event, nbytes))
        return self.queue_locked(event, nbytes)

    def queue_locked(self, event: Any, nbytes: int) -> int:
        """:meth:`put_locked` to the queue itself."""
        queue = self.queue
        price = nbytes or self.estimate
        held = self.held_bytes_locked()
        if (len(queue) + self.in_flight >= self.max_events or held + price > self.max_bytes) and (
            price > self.max_bytes or self.policy is not Policy.DROP_OLDEST or not self._evict_for(price)
        ):
            self._recompute_locked()  # (evictions may have happened)
            return 0
        queue.append(event)
        self.sizes.append(nbytes)
        result = 1
        if nbytes:
            self.exact_bytes += nbytes
            self.exact_count += 1
        elif not self.measured and not self.measure_asked:
            # The first object: the sidecar measures it now, so the estimate is not a guess.
            self.measure_asked = True
            self.wake_at_events = self.wake_at_bytes = _INF
            result = 2
        if result == 1 and (len(queue) >= self.wake_at_events or held + price >= self.wake_at_bytes):
            self.wake_at_events = self.wake_at_bytes = _INF
            result = 2
        self._recompute_locked()
        return result

    def drop_offered_locked(self, reason: str, n: int = 1) -> None:
        """``n`` events offered (to ``emit``, or handed to a composite's member) are not
        accepted after all: count them under ``reason``."""
        self.refused += n
        self.count_locked(reason, n)

    def _popleft_locked(self) -> int:
        """Forget the oldest queued event; returns the bytes it counted for."""
        self.queue.popleft()
        size = self.sizes.popleft()
        self.head_seq += 1
        if size:
            self.exact_bytes -= size
            self.exact_count -= 1
            return size
        return self.estimate

    def _pop_locked(self) -> int:
        """Forget the newest queued event; returns the bytes it counted for."""
        self.queue.pop()
        size = self.sizes.pop()
        self.shed_newest += 1  # its sequence number goes to the next event accepted
        if size:
            self.exact_bytes -= size
            self.exact_count -= 1
            return size
        return self.estimate

    def _evict_for(self, nbytes: int) -> bool:
        queue = self.queue
        evicted = 0
        while queue and not self.has_room_locked(nbytes):
            self._popleft_locked()
            evicted += 1
        if evicted:
            self.count_locked(Reason.DROPPED_FULL, evicted)
        return self.has_room_locked(nbytes)

    def shed_locked(self, nbytes: int) -> int:
        """Drop queued events until ``nbytes`` are freed (or the queue is empty), by the
        policy: the oldest under ``drop_oldest``, else the newest.  Returns the bytes freed."""
        freed = 0
        n = 0
        # (While the buffer overflows to the spill, the newest queued are not the newest.)
        pop = self._popleft_locked if self.policy is Policy.DROP_OLDEST or self.beyond else self._pop_locked
        while self.queue and freed < nbytes:
            freed += pop()
            n += 1
        if n:
            self.count_locked(Reason.DROPPED_FULL, n)
            self._recompute_locked()
        return freed

    def has_room_locked(self, nbytes: int) -> bool:
        """Whether an event of ``nbytes`` bytes (0: an object, at the estimate) fits now."""
        if self.window is not None:
            return bool(self.window.has_room(self, nbytes))
        held = self.held_bytes_locked()
        return len(self.queue) + self.in_flight < self.max_events and (
            held + (nbytes or self.estimate) <= self.max_bytes
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
        estimate = self.estimate
        # Each size as it counts: an object's 0 becomes the estimate ({0: e}.get(s, s), at C speed).
        raw = list(islice(sizes, n))
        priced = list(map({0: estimate}.get, raw, raw))
        if n < len(queue) or self.queued_bytes > max_bytes:
            totals = list(accumulate(priced))
            if totals[-1] > max_bytes:
                n = max(1, bisect_right(totals, max_bytes))
                raw, priced = raw[:n], priced[:n]
        seq = self.head_seq
        batch = list(zip(range(seq, seq + n), starmap(queue.popleft, repeat((), n)), priced, strict=False))
        deque(starmap(sizes.popleft, repeat((), n)), maxlen=0)  # dropped, at C speed
        objects = raw.count(0)
        self.in_flight_low = min(self.in_flight_low, seq)
        self.head_seq = seq + n
        self.exact_bytes -= sum(raw)
        self.exact_count -= n - objects
        self.in_flight += n
        self.in_flight_bytes += sum(priced)
        self._recompute_locked()
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
            size += nbytes
            if is_exact(event):
                sizes.appendleft(nbytes)
                self.exact_bytes += nbytes
                self.exact_count += 1
            else:  # an object again, counted at the estimate
                sizes.appendleft(0)
        self.head_seq = entries[0][0]
        self.in_flight -= len(entries)
        self.in_flight_bytes -= size
        self._recompute_locked()
        return True

    def reprice_in_flight_locked(self, delta: int) -> None:
        """Taken objects were serialized: ``delta`` is their exact sizes minus their estimates."""
        self.in_flight_bytes += delta
        self._recompute_locked()

    def settle_locked(self, n_events: int, n_bytes: int, lowest: float) -> None:
        """``n_events`` in-flight events (``n_bytes``) are settled (delivered or counted);
        ``lowest`` is the sequence number of the oldest event still in flight (inf: none).
        Wakes whoever waits for room or for a flush."""
        self.in_flight -= n_events
        self.in_flight_bytes -= n_bytes
        self.in_flight_low = lowest
        self._recompute_locked()
        self.notify_locked()

    def record_answer_locked(self, delivered: int, retried: int) -> None:
        """Count what the backend took, and the events it asked to have sent again."""
        self.delivered += delivered
        self.retried += retried

    @property
    def next_seq(self) -> int:
        """The sequence number the next accepted event will get."""
        return self.head_seq + len(self.queue) + self.beyond

    def clear_locked(self) -> int:
        """Forget everything held (queued and in flight); returns how many events that was."""
        held = len(self.queue) + self.in_flight + self.beyond
        self.head_seq += len(self.queue) + self.beyond
        if self.window is not None:
            self.window.clear()
            self.window.restore(self)
        self.beyond = 0
        self.queue.clear()
        self.sizes.clear()
        self.exact_bytes = self.exact_count = self.in_flight = self.in_flight_bytes = 0
        self.in_flight_low = _INF
        self._recompute_locked()
        return held

    def lowest_unsettled_locked(self) -> float:
        """Sequence number of the oldest event not yet delivered or dropped."""
        return min(self.in_flight_low, self.head_seq)

    def refuse_locked(self) -> None:
        """An event offered while closed: counted under the reason the buffer refuses for
        (and as emitted when it was offered to an outbox that was open: its worker is gone)."""
        if self.refusal == Reason.WORKER_STOPPED:
            self.refused += 1
        self.count_locked(self.refusal)

    def close_locked(self, refusal: str | None = None, *, final: bool = False) -> None:
        """Accept nothing more (counted under ``refusal``, if given, from now on); ``final``:
        nothing held will be sent either.  Blocked emitters and flushes are woken."""
        if refusal is not None:
            self.refusal = refusal
        self.closed = True
        self.object_room = 0
        if final:
            self.finalized = True
        self.notify_locked()

    def close_unlocked(self, refusal: str | None = None) -> None:
        """:meth:`close_locked` from a signal handler that interrupted the lock's holder:
        plain stores (atomic); waiters notice at their timeout."""
        if refusal is not None:
            self.refusal = refusal
        self.closed = True
        self.object_room = 0

    def ask_flush_locked(self, target: int) -> None:
        """Send every event up to sequence number ``target`` without lingering."""
        self.flush_target = max(self.flush_target, target)

    def wake_at_locked(self, events: float, nbytes: float) -> None:
        """Wake the worker once this many events, or bytes, are queued (inf: never)."""
        self.wake_at_events, self.wake_at_bytes = events, nbytes
        self._recompute_locked()

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
                    self.refused += 1
                self.count_locked(nbytes)
                continue
            if self.closed and self.finalized:
                self.drop_offered_locked(Reason.DROPPED_SHUTDOWN)
            elif self.put_locked(event, nbytes):
                queued = True
            else:
                self.drop_offered_locked(Reason.TOO_LARGE if nbytes > self.max_bytes else Reason.DROPPED_FULL)
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
            "queued_events": len(self.queue) + len(side) + self.beyond,
            "queued_bytes": self.queued_bytes
            + sum(side)
            + (self.window.bytes(self.estimate) if self.window is not None else 0),
            "in_flight": self.in_flight,
        }
