"""The spill's memory window: the buffer's overflow (``_holdings.Overflow``), in memory and on
disk; see "The spill: a log" in docs/architecture.md.

The queue and what is in flight keep a *window*, half the buffer's bounds.  Once an event does
not fit, the buffer *overflows*: every event goes to the overflow, never to the queue, until the
sidecar has written it to disk and released it (``disk`` counts it: the *stretch*, behind dead
owners' events adopted) and read it back as the window has room: queue < stretch < overflow by
number.  The policy applies only when the overflow is full.  Numbers given here to the stretch's
events are *foreign*: their records stay in their run's stream, where the *spans* say.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any

from .._buffer._buffer import Buffer, Reason
from .._buffer._holdings import Admission, Holdings
from .._observability._log import RateLimitedLog
from .._run._serde import SerializedEvent, weight
from ._disk import Disk
from ._format import TOMBSTONES
from ._ranges import Ranges
from ._streams import Run

__all__ = ["READ_AGAIN_AFTER", "Window"]

#: After a read of the stretch failed, seconds before the next try.
READ_AGAIN_AFTER = 1.0
_REASONS = {tomb.body: reason for reason, tomb in TOMBSTONES.items()}
_ACCEPTED, _WAKE = Admission.ACCEPTED, Admission.WAKE


@dataclass(slots=True)
class Span:
    """Events read back, numbered here from ``first``: ``origins`` as a ``Read``'s, ``left`` unsettled."""

    first: int
    origins: list[list[Any]]
    left: int


class Window:
    """One buffer's overflow.  The protocol's methods and those named ``_locked`` need its lock."""

    def __init__(self) -> None:
        self.share_events = self.share_bytes = self.wake_at = self.wake_bytes = self.wake_events = 0
        self.active = False
        #: False while the disk fails or is full: memory only, unless overflowing.
        self.usable = True
        self.events: deque[Any] = deque()
        self.sizes: deque[int] = deque()
        self.exact_bytes = self.exact_count = 0
        #: Events of the stretch: on disk only, to be read back.
        self.disk = 0
        #: Room a read of the stretch holds while it reads outside the lock.
        self.reading_events = self.reading_bytes = 0
        #: The overflow's length below which ``Buffer.put`` appends an object here itself.
        self.fast_room = 0
        self._new_stretch()

    def _new_stretch(self) -> None:
        """The stretch's state, anew (also once its files are gone)."""
        self.runs: deque[Run] = deque()
        self.spans: list[Span] = []
        self.foreign = Ranges()
        #: After a failed read, no read before this time (``time.monotonic``).
        self.read_again_at = 0.0
        #: The last release found the disk full or failing: no write before the next tick.
        self.stuck = False
        #: Events read back that were not there, or whose body is not a JSON object.
        self.lost = self.invalid = 0
        #: The bytes of the event a read held back for want of room (0: none).
        self.waiting = 0

    def attach(self, held: Holdings) -> None:
        self.share_events, self.share_bytes = max(1, held.max_events // 2), max(1, held.max_bytes // 2)
        # An eighth of the bounds: the interval's write keeps up with an ordinary outage, this
        # wake is for a burst.  Waking costs the emitting thread the GIL (`tail --spill`).
        self.wake_events, self.wake_bytes = max(1, held.max_events // 8), max(1, held.max_bytes // 8)
        held.attach_overflow(self)
        self.restore(held)  # (which sets wake_at: ``recompute``)

    # -- the buffer's protocol (``_buffer.Overflow``) ----------------------------------------

    def restore(self, held: Holdings) -> None:
        """The fast paths' bounds: the window, or none while overflowing."""
        room = (0, -1) if self.active else (self.share_events, self.share_bytes)
        held.set_room_locked(*room)

    def bytes(self, estimate: int) -> int:
        return self.exact_bytes + (len(self.events) - self.exact_count) * estimate

    def has_room(self, held: Holdings, nbytes: int) -> bool:
        if not self.active and self._fits_queue(held, nbytes):
            return True
        return (self.active or self.usable) and self._fits(held, nbytes or held.estimate)

    def put(self, buf: Buffer, event: Any, nbytes: int) -> Admission:
        """``Buffer.put_locked`` with a spill: the queue while the window has room, else the
        overflow.  Returns ``ACCEPTED``, ``WAKE`` or ``REFUSED`` (the policy applies)."""
        held = buf.holdings
        if not self.active:
            if self._fits_queue(held, nbytes) or not self.usable:
                return buf.queue_locked(event, nbytes)
            self.activate(held)
        if not self._fits(held, nbytes or held.estimate):
            return Admission.REFUSED
        self.events.append(event)
        self.sizes.append(nbytes)
        held.went_beyond_locked(1)
        n = len(self.events)
        # Woken for the first, then every wake_at objects, wake_bytes of text (never at the
        # estimate, which may make wake_at 1) or wake_events events; ``wants_write`` does the rest.
        if nbytes:
            before, step = self.exact_bytes, self.wake_bytes
            wake = n == 1 or n % self.wake_events == 0 or before // step != (before + nbytes) // step
            self.exact_bytes += nbytes
            self.exact_count += 1
            held.recompute_locked()  # (its exact size, not the estimate ``fast_room`` counts)
        else:
            wake = n == 1 or (n - self.exact_count) % self.wake_at == 0
        return Admission.WAKE if wake else Admission.ACCEPTED

    def put_object(self, held: Holdings, event: Any) -> Admission:
        """``Buffer.put``'s fast path while overflowing: an object, within ``fast_room``."""
        events = self.events
        events.append(event)
        self.sizes.append(0)
        held.went_beyond_locked(1)
        n = len(events)
        return _WAKE if n == 1 or (n - self.exact_count) % self.wake_at == 0 else _ACCEPTED

    def recompute(self, held: Holdings) -> None:
        """``fast_room``: the overflow's length below which an object fits by count, by bytes at
        the estimate and before the sidecar's next look; 0 unless overflowing, measured."""
        m, estimate, next_seq = len(self.events), held.estimate, held.next_seq
        self.wake_at = max(1, min(self.wake_events, self.wake_bytes // estimate))
        if not self.active or held.closed or not held.measured:
            self.fast_room = 0
            return
        free = held.max_bytes - held.held_bytes_locked() - self.bytes(estimate) - self.reading_bytes
        self.fast_room = min(
            held.max_events - len(held.queue) - held.in_flight - self.reading_events,
            m + free // estimate,
            m + held.look_end - next_seq,
            m + held.held_from - next_seq,
        )

    def held(self) -> int:
        return len(self.events)

    def wants_write(self, held: Holdings) -> bool:
        """Whether the overflow is to be written now: what wakes the sidecar, or past the bounds."""
        n = len(self.events)
        return (
            n - self.exact_count >= self.wake_at
            or self.exact_bytes >= self.wake_bytes
            or n >= self.wake_events
            or held.held_bytes_locked() + self.bytes(held.estimate) > held.max_bytes
        ) and not self.stuck

    def unmeasured(self) -> int:
        return len(self.events) - self.exact_count

    def newest_objects(self, start: int, most: int, span: int) -> list[tuple[int, Any]]:
        last = len(self.events) - 1
        newest = range(last, max(-1, last - span), -1)
        return list(islice(((start + i, self.events[i]) for i in newest if not self.sizes[i]), most))

    def replace(self, start: int, seq: int, event: Any, ser: SerializedEvent) -> int:
        index = seq - start
        if not 0 <= index < len(self.events) or self.events[index] is not event or self.sizes[index]:
            return 0
        size = weight(ser)
        self.events[index] = ser
        self.sizes[index] = size
        self.exact_bytes += size
        self.exact_count += 1
        return size

    def clear(self) -> int:
        n = len(self.events) + self.disk
        self.events.clear()
        self.sizes.clear()
        self.exact_bytes = self.exact_count = self.disk = 0
        self.active = False
        return n

    # -- the memory window ------------------------------------------------------------------

    def activate(self, held: Holdings) -> None:
        """Overflow from now on."""
        self.active = True
        self.restore(held)

    def _fits_queue(self, held: Holdings, nbytes: int) -> bool:
        """Whether an event fits the queue's window."""
        return len(held.queue) + held.in_flight < self.share_events and (
            held.held_bytes_locked() + (nbytes or held.estimate) <= self.share_bytes
        )

    def room(self, held: Holdings, beside_overflow: bool = True) -> tuple[int, int]:
        """The queue's window's room, by count and by bytes; ``beside_overflow`` (a read of the
        stretch, which adds to memory), within what the overflow leaves of the bounds too."""
        queued, held_bytes = len(held.queue) + held.in_flight, held.held_bytes_locked()
        events, nbytes = self.share_events - queued, self.share_bytes - held_bytes
        if beside_overflow:
            events = min(events, held.max_events - queued - len(self.events))
            nbytes = min(nbytes, held.max_bytes - held_bytes - self.bytes(held.estimate))
        return events, nbytes

    def readable(self, held: Holdings) -> tuple[int, int, bool]:
        """The room a read of the stretch may take now, by count and by bytes, and whether it
        takes one event past the bytes (nothing else would ever make room for it).  With no
        queue, an event larger than the window's room is read alone within what the overflow
        leaves of ``max_bytes``: the window may never have room for it."""
        events, nbytes = self.room(held)
        idle = not held.queue and not held.in_flight
        alone = idle and (not self.events or self.stuck or not self.usable)
        if events <= 0:
            return 0, 0, False
        if nbytes >= max(1, self.waiting) or alone:
            return events, nbytes, alone
        beside = held.max_bytes - held.held_bytes_locked() - self.bytes(held.estimate)
        if idle and 0 < self.waiting <= beside:
            return events, self.waiting, False  # (that event, and no more)
        return 0, 0, False

    def _fits(self, held: Holdings, price: int) -> bool:
        held_bytes = held.held_bytes_locked() + self.bytes(held.estimate) + self.reading_bytes
        n = len(self.events) + len(held.queue) + held.in_flight + self.reading_events
        return n < held.max_events and held_bytes + price <= held.max_bytes

    def _to_queue_locked(self, held: Holdings) -> None:
        """With the stretch empty: the overflow's head joins the queue, as much as fits the window."""
        room, room_bytes = self.room(held, beside_overflow=False)
        estimate = held.estimate
        take = 0
        for size in islice(self.sizes, max(0, room)):
            room_bytes -= size or estimate
            if room_bytes < 0:
                break
            take += 1
        if take:
            held.rejoin_locked(*self._popleft(take))  # (one recount for all of them)

    def _popleft(self, n: int) -> tuple[list[Any], list[int]]:
        """The overflow's oldest ``n`` events and their sizes, out of it and its accounts."""
        events = [self.events.popleft() for _ in range(n)]
        sizes = [self.sizes.popleft() for _ in range(n)]
        self.exact_bytes -= sum(sizes)
        self.exact_count -= n - sizes.count(0)
        return events, sizes

    def settle(self, held: Holdings) -> None:
        """End the overflow once the stretch and the overflow are both empty."""
        if self.active and not self.disk and not self.events:
            self.active = False
            self.restore(held)

    # -- the stretch --------------------------------------------------------------------------

    def place_locked(self, held: Holdings, runs: list[Run]) -> None:
        """Adopted runs join the stretch, numbered after everything accepted so far."""
        for run in runs:
            run.first = held.next_seq
            held.went_beyond_locked(run.remaining)
            self.disk += run.remaining
            self.runs.append(run)
            self.foreign.add(run.first, run.first + run.remaining)
        self.activate(held)

    def writable(self, ser: SerializedEvent | None, disk: Disk) -> SerializedEvent:
        """What is written for an overflow event: itself, or its tombstone (not serializable, or
        larger than the whole spill), so that the events after it flow."""
        if ser is None:
            return TOMBSTONES[Reason.INVALID_EVENT]
        return ser if disk.holds(ser) else TOMBSTONES[Reason.DROPPED_SPILL_FULL]

    def released_locked(self, buf: Buffer, start: int, wrote: int, offered: int, disk: Disk) -> None:
        """The overflow's first ``wrote`` of ``offered`` events, numbered from ``start``, are on
        disk (``disk.last``): released from memory, an own run of the stretch."""
        self.stuck = wrote < offered
        if buf.finalized or buf.holdings.next_seq - len(self.events) != start:
            return  # cleared meanwhile (a close that reported without the worker)
        buf.spill_full_locked(disk.full and not disk.refusing)
        self.usable = not disk.refusing and not disk.full
        if not wrote or disk.last is None:
            return
        self._popleft(wrote)
        self.disk += wrote
        self.foreign.add(start, start + wrote)
        buf.holdings.recompute_locked()  # (room in the overflow: its fast path's bound)
        last = self.runs[-1] if self.runs else None
        if last is None or not last.own or last.first + last.remaining != start:
            last = Run(start, [], {}, own=True, damage=disk.streams.damage)
            self.runs.append(last)
        last.extend(disk.home.owner, start, start + wrote, disk.last.path)
        buf.notify_locked()  # room in the overflow for blocked emitters

    def refill(self, buf: Buffer, log: RateLimitedLog) -> None:
        """Read the stretch back as the window has room, then the overflow; end the overflow."""
        with buf.lock:
            if buf.finalized:
                return
            if not self.disk:
                self._to_queue_locked(buf.holdings)
                self.settle(buf.holdings)
                return
            room, room_bytes, alone = self.readable(buf.holdings)
            if room <= 0 or time.monotonic() < self.read_again_at:
                return
            # The read's room is held (emits do not take it) while it reads.
            run, disk = self.runs[0], self.disk
            room = min(room, run.remaining)
            self.reading_events, self.reading_bytes = room, max(0, room_bytes)
            buf.holdings.recompute_locked()
        try:
            events, origins = run.read(room, room_bytes, alone)
        except OSError as exc:
            log.warning("spill-read", "spill: reading back failed: %s", exc)
            events, origins = [], []
        with buf.lock:
            self.reading_events = self.reading_bytes = 0
            buf.holdings.recompute_locked()
            self.waiting = run.wants
            if not events and not run.wants:
                self.read_again_at = time.monotonic() + READ_AGAIN_AFTER
            if buf.finalized or self.disk != disk or not events:
                return
            self.remember(buf.holdings.next_seq - buf.holdings.beyond, origins)  # (the stretch's first)
            if not run.remaining:
                self.runs.popleft()
                run.close()
            bad = self._rejoin_locked(buf, events)
            self.disk -= len(events)
            self.settle(buf.holdings)
        if bad:
            log.warning("spill-unreadable", "spill: %d event(s) could not be read back; counted lost", bad)

    def _rejoin_locked(self, buf: Buffer, read: list[SerializedEvent | None]) -> int:
        """Events read back join the queue, in order; one that is a gap or whose body is not a
        JSON object (a tombstone) is counted lost in its place.  Returns how many were."""
        events: list[SerializedEvent] = []
        bad = 0
        for event in read:
            if event is not None and event.body[:1] == b"{":  # (``Run.read`` checked it)
                events.append(event)
                continue
            if events:
                buf.holdings.rejoin_locked(events, [weight(e) for e in events])
                events = []
            if event is None:
                self.lost += 1
                reason = Reason.SPILL_LOST
            else:
                reason = _REASONS.get(event.body, Reason.INVALID_EVENT)
                self.invalid += reason == Reason.INVALID_EVENT
            buf.holdings.retire_beyond_locked(1, reason)
            buf.count_locked(reason)
            bad += 1
        if events:
            buf.holdings.rejoin_locked(events, [weight(e) for e in events])
        return bad

    def remember(self, first: int, origins: list[list[Any]]) -> None:
        """Events read back are numbered here from ``first``: where they came from."""
        self.spans.append(Span(first, origins, sum(n for _, _, n in origins)))

    def origins(self, first: int, end: int) -> list[tuple[str, int, int]]:
        """Where the events numbered ``[first, end)`` here came from, as ``(stream, first, end)``;
        they are settled (a span goes with its last)."""
        out: list[tuple[str, int, int]] = []
        start = max(0, bisect_right(self.spans, first, key=lambda span: span.first) - 1)
        for span in self.spans[start:]:
            if span.first >= end:
                break
            at = span.first  # (the number here of each origin's first event)
            for stream, seq, n in span.origins:
                lo, hi = max(first, at), min(end, at + n)
                if lo < hi:
                    out.append((stream, seq + lo - at, seq + hi - at))
                    span.left -= hi - lo
                at += n
        self.spans = [span for span in self.spans if span.left > 0]
        self.foreign.remove(first, end)
        return out

    def lose_disk_locked(self, buf: Buffer) -> int:
        """The stretch's files are gone: its events are counted lost.  Returns how many."""
        lost = self.disk
        if lost:
            buf.holdings.retire_beyond_locked(lost, Reason.SPILL_LOST)
            buf.count_locked(Reason.SPILL_LOST, lost)
            self.disk = 0
            self.settle(buf.holdings)
        self.close()
        self._new_stretch()
        return lost

    def adopted(self) -> int:
        """Events of dead owners not read back yet."""
        return sum(run.remaining for run in list(self.runs) if not run.own)

    def close(self) -> None:
        for run in self.runs:
            run.close()
