"""The buffer's holdings: what it holds, queued and in flight, by count and by bytes, and what
an object event may still take.

A :class:`Buffer` has its holdings (``Buffer.holdings``) and puts an admission policy on top
(who gets in, what is shed when full, who waits).  This part decides nothing: it moves events
between queued and in flight, prices them (exact sizes, and objects at a running estimate),
and derives from that the two numbers ``emit``'s fast path compares
(:meth:`Holdings.recompute_locked`).  The worker and the spill use it directly (taking,
settling, the overflow's room, events read back), under the buffer's lock.
"""

from __future__ import annotations

import enum
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable
from itertools import accumulate, islice, repeat, starmap
from typing import Any, Protocol

from .._run._serde import SerializedEvent, weight
from ._numbering import Journal, Numbering

__all__ = [
    "EVICTED_MOST",
    "FIRST_ESTIMATE",
    "MEASURE_HERE_AFTER",
    "UNLOOKED_MOST",
    "Admission",
    "Entry",
    "Holdings",
    "Measure",
    "Overflow",
    "is_exact",
]

_INF = float("inf")

# An event taken by the worker: (sequence number, the event as given, its size in bytes:
# exact for str/bytes, an estimate for objects until the worker serializes them).
Entry = tuple[int, Any, int]

#: What an object counts for until the sidecar has measured one: emit never serializes, so
#: the size of an object event is unknown until the sidecar does.  4 KiB is several times a
#: typical event (0.5-1 KiB), and small enough that the default 64 MiB holds more objects than
#: the default max_events (10,000): a burst at start-up is never dropped for its estimate.
FIRST_ESTIMATE = 4096
#: Events queued beyond the newest object the sidecar has looked at (measured, or found that
#: none waits unmeasured) before the emitter of the next object measures the newest itself
#: (``Measure``): what keeps ``max_bytes`` when objects grow while the sidecar cannot run (a
#: starved thread measures nothing, and objects are priced at what it last saw).  So objects
#: hold beyond ``max_bytes`` at most this many of them, whatever they weigh (twice as many with
#: several emitting threads: while one measures, the others' objects are refused from twice
#: this many past the look, ``Buffer.put_locked``).  The sidecar looks
#: at every batch it takes and every 10 ms while objects wait (at once when it runs with half of
#: these used), and is woken to look when three quarters are used if no batch is due before
#: (``wake_at_locked``), so an emitter measures only where the sidecar cannot keep up: starved,
#: or outrun by a loop of emits.
UNLOOKED_MOST = 1024
#: The same before the sidecar's first look: objects queued at the first guess
#: (``FIRST_ESTIMATE``) while the sidecar has yet to run (a flood of 100 KB dicts held 1,400 of
#: them, 140 MiB in 64, before a sidecar under CI load ran).
MEASURE_HERE_AFTER = 64
#: Dropped objects that wait for the sidecar to free them (``Holdings.evicted``), at most: this
#: many, and a 32nd of ``max_bytes`` at the estimate.  Beyond, and events of an exact size (text,
#: or objects serialized where they waited), the drop frees on its thread.
EVICTED_MOST = 1024
_TEXT = (str, bytes, bytearray)


class Admission(enum.IntEnum):
    """What the buffer answers for one event offered (``Buffer.put``, ``put_locked``, an
    overflow's ``put``).  An ``int``: ``REFUSED`` is false."""

    #: Not accepted: refused, and counted under its reason (or the policy is to apply).
    REFUSED = 0
    #: Accepted.
    ACCEPTED = 1
    #: Accepted, and the worker must be woken (a batch is due, or the queue needs it).
    WAKE = 2


class Measure(enum.IntEnum):
    """Whether an emitter measures a queued object itself (``Holdings.measure_here``): when an
    object is queued ``UNLOOKED_MOST`` events past the sidecar's last look
    (``MEASURE_HERE_AFTER`` before its first), for a sidecar that cannot run (starved, or still
    starting)."""

    #: The sidecar measures (it looked recently enough, or nothing calls for an emitter to).
    SIDECAR = 0
    #: Due: the next emitter that wakes the sidecar measures the newest queued object.
    DUE = 1
    #: Claimed: an emitter measures it (until its look, or the sidecar's).
    CLAIMED = 2


class Overflow(Protocol):
    """What the buffer asks of an overflow (the spill's memory window, ``_spill._window``):
    admission beyond the queue's share, and what it holds."""

    #: What it holds in memory, oldest first; while it overflows, the length below which an
    #: object fits (``Buffer.put``'s fast path: then :meth:`put_object`), else 0.
    events: Any
    fast_room: int

    def put_object(self, held: Any, event: Any) -> Admission:
        """``Buffer.put``'s fast path: an object appended, within ``fast_room``."""

    def put(self, buf: Any, event: Any, nbytes: int) -> Admission:
        """``put_locked``'s answer for one event (``REFUSED``: no room, the policy applies)."""

    def has_room(self, buf: Any, nbytes: int) -> bool:
        """Whether an event of ``nbytes`` (0: an object) would be accepted now."""

    def bytes(self, estimate: int) -> int:
        """Bytes it holds in memory."""

    def clear(self) -> int:
        """Forget everything; returns how many events that was."""

    def restore(self, buf: Any) -> None:
        """Set the fast paths' bounds (``set_room_locked``) for its state."""

    def held(self) -> int:
        """Events it holds in memory (the newest accepted: numbered up to ``next_seq``)."""

    def unmeasured(self) -> int:
        """Objects it holds in memory at the estimate (not serialized yet)."""

    def newest_objects(self, start: int, most: int, span: int) -> list[tuple[int, Any]]:
        """``(number, object)`` of its newest objects held at the estimate, newest first: at
        most ``most`` among its last ``span`` events (numbered from ``start``)."""

    def replace(self, start: int, seq: int, event: Any, ser: SerializedEvent) -> int:
        """Put ``ser`` in the place of ``event``, number ``seq``, if it is still held there
        (numbered from ``start``): returns its exact size, or 0."""

    def recompute(self, held: Any) -> None:
        """Its fast path's bound (``Buffer.put``), after anything changed the accounts."""


def is_exact(event: Any) -> bool:
    """Whether an event's size is known exactly (text, or serialized by the sidecar), rather
    than counted at the running estimate of an object's size."""
    return event.__class__ is SerializedEvent or isinstance(event, _TEXT)


class Holdings:
    """What a buffer holds and what an object may still take (see the module docstring).

    The fast path's two numbers: what an object may still take, kept as a queue length,
    ``object_room``, and when the worker must be woken, as another, ``wake_at_objects``; both
    recomputed by every method that changes the accounts.  Counts that would cost ``emit`` an
    addition are derived: ``accepted`` from the sequence numbers, ``estimated`` (objects
    queued at the estimate) from the queue's length.  The caller holds the buffer's lock for
    every ``_locked`` method.
    """

    __slots__ = (
        "beyond",
        "closed",
        "estimate",
        "evicted",
        "exact_bytes",
        "exact_count",
        "full_at",
        "full_fast",
        "full_until",
        "held_from",
        "in_flight",
        "in_flight_bytes",
        "in_flight_low",
        "journal",
        "look_end",
        "max_bytes",
        "max_events",
        "measure_here",
        "measured",
        "numbers",
        "object_room",
        "overflow",
        "queue",
        "room_bytes",
        "room_events",
        "sizes",
        "taken_at",
        "wake_at_bytes",
        "wake_at_events",
        "wake_at_objects",
    )

    def __init__(self, *, max_events: int, max_bytes: int) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        # -- the spill's memory window (``_spill._window``): the fast paths' bounds, which are
        # max_events / max_bytes without a spill; events accepted beyond the queue (in the
        # overflow, or released to disk).
        self.room_events = max_events
        self.room_bytes = max_bytes
        self.overflow: Overflow | None = None
        self.beyond = 0
        # The queue is two parallel deques rather than one of tuples, so that emit allocates
        # no object the garbage collector tracks (and never triggers a collection).  The
        # event at queue[i] has the sequence number ``numbers.seq_at(i)`` (``head_seq + i``
        # unless events were shed from the tail: ``_numbering``); sizes[i] is its exact
        # size, or 0 for an object counted at the running ``estimate`` (emit never serializes).
        self.queue: deque[Any] = deque()
        self.sizes: deque[int] = deque()
        self.numbers = Numbering()
        # Dropped objects, to be freed by the sidecar (``EVICTED_MOST``; from the first measure).
        self.evicted: deque[Any] = deque(maxlen=0)
        # ``numbers.pos0`` at the last take: an untake is refused if anything left the head since.
        self.taken_at = -1
        # The numbers settled (delivered or lost), for the spill's durable log; None without one.
        self.journal: Journal | None = None
        # Queued bytes = exact_bytes + estimated * estimate: when the estimate changes, every
        # queued object is re-priced at once, in O(1).  exact_count entries of the queue have
        # an exact size (exact_bytes in all); the others are objects (``estimated``).
        self.exact_bytes = self.exact_count = 0
        self.in_flight = self.in_flight_bytes = 0
        self.in_flight_low: float = _INF  # the lowest number in flight (inf when none)
        self.closed = False  # no room for anything more
        # The worker asks to be woken when the queue reaches these sizes.
        self.wake_at_events: float = 1
        self.wake_at_bytes: float = _INF
        # The fast path's two numbers (see the class docstring): an object is appended while
        # the queue is shorter than object_room, and the worker woken when it reaches
        # wake_at_objects.  0 (no fast path) until the first object is measured.
        self.object_room: float = 0
        self.wake_at_objects: float = 1
        # When full by count (bytes to spare for one more object) and no overflow is attached,
        # the queue length at which the policy answers an object in O(1) (``Buffer.put``: the
        # oldest goes and the new one takes its place, or the new one is refused); -1 otherwise.
        # Set only where ``full_fast`` (the policy has such an answer: not ``block``).
        self.full_at: float = -1
        self.full_fast = False
        # Objects take the fast path below number ``look_end`` (``UNLOOKED_MOST`` past the last
        # look), their emitter measures past it, and they wait from ``held_from`` (``held_back_
        # locked``).  ``full_until``: the head's number at which the full path's evictions reach
        # ``look_end`` (each moves both by one).
        self.look_end = MEASURE_HERE_AFTER
        self.held_from = MEASURE_HERE_AFTER + UNLOOKED_MOST
        self.full_until: float = _INF
        # Running estimate of a serialized object event's size, learnt by the sidecar (which
        # serializes every object it sends, and samples the newest queued ones while it is
        # behind); ``measured`` once it has measured one.  Until then the first object queued
        # wakes the sidecar, which measures it at once.
        self.estimate = min(FIRST_ESTIMATE, max_bytes)  # (an object fits an empty buffer)
        self.measured = False
        self.measure_here = Measure.SIDECAR

    def reestimate_locked(self, observed: int) -> int:
        """Take an observed mean size (of object events, serialized) into the estimate: up at
        once (an estimate that is short lets large events overrun ``max_bytes``), down slowly;
        every queued object is re-priced with it.  Returns the estimate before."""
        before = self.estimate
        if not self.measured:  # the first measure: a look (``UNLOOKED_MOST``) by whoever made it
            self.look_end = max(self.look_end, self.next_seq + UNLOOKED_MOST)
            self.held_from = max(self.held_from, self.look_end + UNLOOKED_MOST)
        grew = not self.measured or observed >= before
        estimate = observed if grew else (before * 7 + observed) // 8
        # Within max_bytes, so that an object always fits an empty buffer.
        self.estimate = min(max(64, estimate), self.max_bytes)
        self.measured = True
        most = min(EVICTED_MOST, self.max_bytes // 32 // self.estimate)
        if most != self.evicted.maxlen:
            self.evicted = deque(self.evicted, maxlen=most)  # (the newest kept)
        self.recompute_locked()
        return before

    def take_evicted_locked(self) -> deque[Any]:
        """The evicted events waiting to be freed, for the sidecar to free outside the lock."""
        gone, self.evicted = self.evicted, deque(maxlen=self.evicted.maxlen)
        return gone

    def looked_locked(self, end: int, measured: bool = True) -> bool:
        """The newest objects held before number ``end`` were measured (or none is unmeasured):
        objects take the fast path up to ``UNLOOKED_MOST`` events beyond, no emitter measures.
        Not ``measured`` (an emitter's that learnt nothing: unserializable), objects still wait
        where the last look that measured left them.  Returns whether waiting ones may come."""
        self.measure_here = Measure.SIDECAR
        end += UNLOOKED_MOST if self.measured else MEASURE_HERE_AFTER  # (the estimate a guess)
        if end > self.look_end:
            self.look_end = end
            self.recompute_locked()
        if measured and end + UNLOOKED_MOST > self.held_from:
            self.held_from = end + UNLOOKED_MOST
            return True
        return False

    def held_back_locked(self, nbytes: int) -> bool:
        """Whether an event (``nbytes``; 0: an object) waits for the look whatever the room: an
        object twice ``UNLOOKED_MOST`` past it (other threads' while an emitter measures): evicting
        the oldest would not bound the unmeasured."""
        return not nbytes and self.next_seq >= self.held_from

    def unmeasured_locked(self) -> int:
        """Objects held in memory at the estimate: queued, or in the spill's overflow."""
        overflow = self.overflow
        return self.estimated + (overflow.unmeasured() if overflow is not None else 0)

    def newest_objects_locked(self, most: int, span: int) -> list[tuple[int, Any]]:
        """``(number, object)`` of the newest objects held at the estimate, newest first: at
        most ``most`` among the last ``span`` events of the spill's overflow (the newest
        events, while it holds any) and of the queue.  What a look measures."""
        overflow = self.overflow
        picked: list[tuple[int, Any]] = []
        if overflow is not None and overflow.held():
            picked = overflow.newest_objects(self.next_seq - overflow.held(), most, span)
        queue, sizes, seq_at = self.queue, self.sizes, self.numbers.seq_at
        index = len(queue) - 1
        stop = max(-1, index - span)
        while index > stop and len(picked) < most:
            if not sizes[index]:
                picked.append((seq_at(index), queue[index]))
            index -= 1
        return picked

    def claim_measure_here_locked(self) -> bool:
        """Whether the emitter is to measure the newest queued object now (``_intake.measure_here``)."""
        if self.measure_here is not Measure.DUE:
            return False
        self.measure_here = Measure.CLAIMED
        return True

    @property
    def estimated(self) -> int:
        """Objects queued, counted at the estimate (not serialized yet)."""
        return len(self.queue) - self.exact_count

    @property
    def head_seq(self) -> int:
        """The sequence number of the oldest queued event (of the next one, if none is)."""
        return self.numbers.head

    @property
    def next_seq(self) -> int:
        """The sequence number the next accepted event will get."""
        return self.numbers.end(len(self.queue)) + self.beyond

    #: Events accepted so far: each got the next sequence number (from 0), never reused.
    accepted = next_seq

    def keep_journal_locked(self) -> None:
        """From now on, note the numbers settled (for the spill's log)."""
        if self.journal is None:
            self.journal = Journal()

    def note_locked(self, first: int, end: int, outcome: str) -> None:
        """The events numbered ``first`` to ``end`` (excluded) are settled with ``outcome``
        (``DELIVERED`` or a loss reason): in the journal, if one is kept."""
        if self.journal is not None:
            self.journal.note(first, end, outcome)

    def note_each_locked(self, seqs: Iterable[int], outcome: str) -> None:
        """:meth:`note_locked` for events by number."""
        if self.journal is not None:
            for seq in seqs:
                self.journal.note(seq, seq + 1, outcome)

    @property
    def queued_bytes(self) -> int:
        """Bytes queued: exact sizes, and the estimate for each object not yet measured."""
        return self.exact_bytes + self.estimated * self.estimate

    def held_bytes_locked(self) -> int:
        """Bytes held, queued and in flight: what ``max_bytes`` bounds."""
        return self.exact_bytes + self.estimated * self.estimate + self.in_flight_bytes

    def has_room_locked(self, nbytes: int) -> bool:
        """Whether an event of ``nbytes`` bytes (0: an object, at the estimate) fits now."""
        if self.overflow is not None:
            return bool(self.overflow.has_room(self, nbytes))
        held = self.held_bytes_locked()
        return len(self.queue) + self.in_flight < self.max_events and (
            held + (nbytes or self.estimate) <= self.max_bytes
        )

    def recompute_locked(self) -> None:
        """The fast path's numbers, after anything changed the accounts: the queue length up
        to which objects fit (by count, and by bytes at the estimate), and the one at which
        the worker asked to be woken."""
        n = len(self.queue)
        estimate = self.estimate
        queued = self.exact_bytes + (n - self.exact_count) * estimate
        if self.closed or not self.measured:
            self.object_room = 0
            self.full_at = -1
        else:
            room = n + (self.room_bytes - queued - self.in_flight_bytes) // estimate
            by_count = self.room_events - self.in_flight
            # Events still accepted before the sidecar must look at the newest objects.
            unlooked = self.look_end - self.numbers.end(n) - self.beyond
            self.object_room = min(by_count, room, n + unlooked)
            # Full by count alone, with a queued event to go: one out makes room for one in.
            full = by_count == n > 0 and room > n and self.full_fast and self.overflow is None
            self.full_at = n if full else -1
            self.full_until = self.numbers.head + unlooked
        wake = self.wake_at_events
        if self.wake_at_bytes != _INF:
            # Objects until the *queued* bytes reach wake_at_bytes (what the worker takes a
            # batch by; bytes in flight are not the queue's): ceil(missing / estimate), at least 1.
            wake = min(wake, n + max(1, -(-(self.wake_at_bytes - queued) // estimate)))
        self.wake_at_objects = wake
        if self.overflow is not None:
            self.overflow.recompute(self)

    # -- the spill window's part (``_spill._window``): it changes the accounts only through these

    def attach_overflow(self, overflow: Overflow) -> None:
        """Admission goes through ``overflow`` (``Buffer.put_locked`` hands it every event)."""
        self.overflow = overflow

    def set_room_locked(self, room_events: int, room_bytes: int) -> None:
        """The fast paths' bounds: the window's share of the buffer, or none (0, -1) while
        its overflow holds events (they must stay behind them)."""
        self.room_events, self.room_bytes = room_events, room_bytes
        self.recompute_locked()

    def went_beyond_locked(self, n: int) -> None:
        """``n`` more events accepted beyond the queue (into the overflow, or adopted from a
        dead owner into the stretch): they have the next sequence numbers."""
        self.beyond += n

    def retire_beyond_locked(self, n: int, reason: str) -> int:
        """The ``n`` events accepted beyond the queue, right after it (the stretch's first),
        are lost (the caller counts them under ``reason``): their numbers are retired.
        Returns the first."""
        first = self.numbers.retire_next(len(self.queue), n)
        self.beyond -= n
        self.note_locked(first, first + n, reason)
        self.recompute_locked()
        return first

    def rejoin_locked(self, events: Iterable[Any], sizes: list[int]) -> None:
        """Events accepted beyond the queue (the overflow's, or read back from the spill) join
        the queue's tail, oldest first, at ``sizes`` (0: an object, at the estimate)."""
        self.queue.extend(events)
        self.sizes.extend(sizes)
        self.exact_bytes += sum(sizes)
        self.exact_count += len(sizes) - sizes.count(0)
        self.beyond -= len(sizes)
        self.recompute_locked()

    def place_locked(self, seq: int, event: Any, ser: SerializedEvent) -> int:
        """Put ``ser`` (serialized outside the lock) in the place of ``event``, number ``seq``,
        if still held there as it was (queued, or in the spill's overflow; an event given as its
        own serialized form stays): an object's exact size, 0 for an exact event, -1 if gone."""
        index = self.numbers.index_of(seq, len(self.queue)) if event is not ser else None
        if index is None:
            overflow = self.overflow
            if overflow is None or event is ser:
                return -1
            return overflow.replace(self.next_seq - overflow.held(), seq, event, ser) or -1
        if self.queue[index] is not event:
            return -1
        was_object = not self.sizes[index]
        size = self.replace_locked(index, ser)
        return size if was_object else 0

    def replace_locked(self, index: int, ser: SerializedEvent) -> int:
        """Put the serialized form of the queued object at ``index`` in its place, at its
        exact size (the sidecar measured it).  Returns that size."""
        size = weight(ser)
        old = self.sizes[index]
        if old:
            self.exact_bytes -= old
        else:
            self.exact_count += 1
        self.exact_bytes += size
        self.sizes[index] = size
        self.queue[index] = ser
        self.recompute_locked()
        return size

    def evict_oldest_locked(self, reason: str) -> int:
        """Drop the oldest queued event (counted by the caller under ``reason``; freed by the
        sidecar, ``evicted``); returns the bytes it counted for."""
        event, size = self.queue.popleft(), self.sizes.popleft()
        first = self.numbers.head
        self.numbers.advance(1)
        return self._dropped_locked(first, self.numbers.head, event, size, reason)

    def drop_newest_locked(self, reason: str) -> int:
        """Drop the newest queued event (counted by the caller under ``reason``: its number is
        retired, never given again); returns the bytes it counted for."""
        seq = self.numbers.retire_tail(len(self.queue))
        return self._dropped_locked(seq, seq + 1, self.queue.pop(), self.sizes.pop(), reason)

    def _dropped_locked(self, first: int, end: int, event: Any, size: int, reason: str) -> int:
        self.note_locked(first, end, reason)
        if not size:  # an object, at the estimate: freed by the sidecar
            self.evicted.append(event)
            return self.estimate
        self.exact_bytes -= size
        self.exact_count -= 1
        return size

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
        seqs = self.numbers.advance(n)
        batch = list(zip(seqs, starmap(queue.popleft, repeat((), n)), priced, strict=False))
        deque(starmap(sizes.popleft, repeat((), n)), maxlen=0)  # dropped, at C speed
        objects = raw.count(0)
        self.in_flight_low = min(self.in_flight_low, seqs[0])
        self.taken_at = self.numbers.pos0
        self.exact_bytes -= sum(raw)
        self.exact_count -= n - objects
        self.in_flight += n
        self.in_flight_bytes += sum(priced)
        self.recompute_locked()
        return batch

    def untake_locked(self, entries: list[Entry]) -> bool:
        """Put events taken last (the newest of the last take, in order) back at the head of
        the queue, as if they had not been taken.  Returns False, changing nothing, if the
        policy has evicted newer events from the head meanwhile (then these older ones would
        have gone first: the caller drops them)."""
        if self.numbers.pos0 != self.taken_at:
            return False
        self.taken_at = -1
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
        self.numbers.restore([entry[0] for entry in entries])
        self.in_flight -= len(entries)
        self.in_flight_bytes -= size
        self.recompute_locked()
        return True

    def settle_locked(self, n_events: int, n_bytes: int, lowest: float) -> None:
        """``n_events`` in-flight events (``n_bytes``) left (delivered or counted); ``lowest`` is
        the oldest number still in flight (inf: none)."""
        self.in_flight -= n_events
        self.in_flight_bytes -= n_bytes
        self.in_flight_low = lowest
        self.recompute_locked()

    def reprice_in_flight_locked(self, delta: int) -> None:
        """Taken objects were serialized: ``delta`` is their exact sizes minus their estimates."""
        self.in_flight_bytes += delta
        self.recompute_locked()

    def clear_locked(self) -> int:
        """Forget everything held (queued and in flight); returns how many events that was."""
        held = len(self.queue) + self.in_flight + self.beyond
        self.numbers.clear(len(self.queue), self.beyond)
        if self.overflow is not None:
            self.overflow.clear()
            self.overflow.restore(self)
        self.beyond = 0
        self.queue.clear()
        self.sizes.clear()
        self.evicted.clear()
        self.exact_bytes = self.exact_count = self.in_flight = self.in_flight_bytes = 0
        self.in_flight_low = _INF
        self.recompute_locked()
        return held

    def lowest_unsettled_locked(self) -> float:
        """Sequence number of the oldest event not yet delivered or dropped."""
        return min(self.in_flight_low, self.head_seq)

    def wake_at_locked(self, events: float, nbytes: float) -> None:
        """Wake the worker once this many events, or bytes, are queued (inf: never), or, if
        that is more than it may be behind by (a batch larger than ``UNLOOKED_MOST``, a long
        linger), once three quarters of that are used: woken, it looks, in the handler's idle
        time rather than an emitter measuring in its own."""
        if events > UNLOOKED_MOST and self.measured:
            n = len(self.queue)
            left = self.look_end - UNLOOKED_MOST // 4 - self.numbers.end(n) - self.beyond
            events = min(events, n + max(1, left))
        self.wake_at_events, self.wake_at_bytes = events, nbytes
        self.recompute_locked()
