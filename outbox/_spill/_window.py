"""The memory window: with a spill, an outage longer than the buffer goes to disk, not to
``dropped_full``.  This is the buffer's *overflow* (the protocol ``_holdings.Overflow``).

With a spill, the queue (and what is in flight) keeps only a *window*, half of ``max_events`` /
``max_bytes``.  When an event does not fit, the buffer *overflows*: ``emit`` appends every event
(O(1), in memory, under the buffer's lock, as ever) to a second, small deque, the overflow,
never to the queue.  The sidecar writes the overflow to disk and *releases* it: only its count
stays, ``disk`` (the *stretch*, the numbers right after the queue's last, with the events of dead
owners adopted ahead of it: ``_stretch``), read back as the queue has room.  Once the stretch is
empty the overflow (what the disk did not take) joins the queue, and the overflow ends.  So the
order is queue < stretch < overflow by number, and each run's order holds.  Only when the
overflow is full (the disk full or failing, or the sidecar behind by half the buffer) does the
policy apply, counted ``dropped_spill_full`` when the disk holds ``max_spill_bytes``, else
``dropped_full``; ``drop_oldest`` evicts the oldest queued events, never the stretch's.  The fast
paths of ``Buffer.put`` compare against ``room_events`` / ``room_bytes``: the window, and 0 / -1
while overflowing (every ``emit`` then takes the slow path, which comes here).
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any

from .._buffer._buffer import Buffer

__all__ = ["Window"]


class Window:
    """The overflow of one buffer (see the module's docstring).  Every method runs with the
    buffer's lock held."""

    __slots__ = (
        "active",
        "disk",
        "events",
        "exact_bytes",
        "exact_count",
        "share_bytes",
        "share_events",
        "sizes",
        "usable",
        "wake_at",
    )

    def __init__(self, buf: Buffer) -> None:
        self.share_events, self.share_bytes = max(1, buf.max_events // 2), max(1, buf.max_bytes // 2)
        self.wake_at = max(1, min(64, buf.max_events // 16))
        self.active = False
        #: False while the disk fails or is full: then, unless overflowing, memory only.
        self.usable = True
        self.events: deque[Any] = deque()
        self.sizes: deque[int] = deque()
        self.exact_bytes = self.exact_count = 0
        #: Events of the stretch: on disk only, to be read back.
        self.disk = 0
        buf.attach_overflow(self)
        self.restore(buf)

    # -- the buffer's protocol (``_buffer.Overflow``) ----------------------------------------

    def restore(self, buf: Buffer) -> None:
        """The fast paths' bounds: the window, or none while overflowing."""
        if self.active:
            buf.set_room_locked(0, -1)
        else:
            buf.set_room_locked(self.share_events, self.share_bytes)

    def bytes(self, estimate: int) -> int:
        return self.exact_bytes + (len(self.events) - self.exact_count) * estimate

    def has_room(self, buf: Buffer, nbytes: int) -> bool:
        if not self.active:
            return self._fits_queue(buf, nbytes) or (self.usable and self._fits(buf, nbytes or buf.estimate))
        return self._fits(buf, nbytes or buf.estimate)

    def put(self, buf: Buffer, event: Any, nbytes: int) -> int:
        """``Buffer.put_locked`` with a spill: the queue while the window has room, else the
        overflow.  Returns 1, 2 (wake the worker) or 0 (no room: the buffer applies its policy)."""
        if not self.active:
            if self._fits_queue(buf, nbytes) or not self.usable:
                return buf.queue_locked(event, nbytes)
            self.activate(buf)
        if not self._fits(buf, nbytes or buf.estimate):
            return 0
        self.events.append(event)
        self.sizes.append(nbytes)
        if nbytes:
            self.exact_bytes += nbytes
            self.exact_count += 1
        buf.went_beyond_locked(1)
        n = len(self.events)
        # The sidecar is woken for the first, and once every wake_at (its ``due`` keeps it
        # going while the overflow holds that many): not on every emit of an outage.
        return 2 if n == 1 or n % self.wake_at == 0 else 1

    def clear(self) -> int:
        n = len(self.events) + self.disk
        self.events.clear()
        self.sizes.clear()
        self.exact_bytes = self.exact_count = self.disk = 0
        self.active = False
        return n

    # -- the spill's side ---------------------------------------------------------------------

    def activate(self, buf: Buffer) -> None:
        """Overflow from now on: every event accepted goes behind the stretch."""
        self.active = True
        self.restore(buf)

    def _fits_queue(self, buf: Buffer, nbytes: int) -> bool:
        """Whether an event fits the queue's window."""
        return len(buf.queue) + buf.in_flight < self.share_events and (
            buf.held_bytes_locked() + (nbytes or buf.estimate) <= self.share_bytes
        )

    def room(self, buf: Buffer) -> tuple[int, int]:
        """What the queue's window has room for, by count and by bytes (the stretch read back)."""
        return self.share_events - len(buf.queue) - buf.in_flight, self.share_bytes - buf.held_bytes_locked()

    def _fits(self, buf: Buffer, price: int) -> bool:
        held = buf.held_bytes_locked() + self.bytes(buf.estimate)
        n = len(self.events) + len(buf.queue) + buf.in_flight
        return n < buf.max_events and held + price <= buf.max_bytes

    def release(self, n: int) -> None:
        """The oldest ``n`` of the overflow are on disk: forget them here."""
        events, sizes = self.events, self.sizes
        for _ in range(n):
            events.popleft()
            size = sizes.popleft()
            if size:
                self.exact_bytes -= size
                self.exact_count -= 1
        self.disk += n

    def to_queue(self, buf: Buffer) -> int:
        """With the stretch empty: move the overflow to the queue, in memory (what the disk
        would not take), as much as fits the queue's window.  Returns how many."""
        room, room_bytes = self.room(buf)
        estimate = buf.estimate
        take = 0
        for size in islice(self.sizes, max(0, min(room, len(self.events)))):
            room_bytes -= size or estimate
            if room_bytes < 0:
                break
            take += 1
        if not take:
            return 0
        events, sizes = (
            [self.events.popleft() for _ in range(take)],
            [self.sizes.popleft() for _ in range(take)],
        )
        self.exact_bytes -= sum(sizes)
        self.exact_count -= take - sizes.count(0)
        buf.rejoin_locked(events, sizes)  # (one recount for all of them)
        return take

    def settle(self, buf: Buffer) -> None:
        """End the overflow once the stretch and the overflow are both empty."""
        if self.active and not self.disk and not self.events:
            self.active = False
            self.restore(buf)
