"""The spill's side of the memory window (``_window``): the *stretch*, the events that
overflowed the buffer's window and wait on disk instead of in memory.

:meth:`Stretch.release` writes the overflow to this owner's segment and releases what was
written from memory; :meth:`Stretch.refill` reads the stretch back (``_spillread``) into the
queue as its window has room, in order, before the overflow, and ends the overflow once both
are empty.  An outage longer than the buffer then costs disk, not events, up to
``max_spill_bytes``.  Both are called by :class:`~outbox._spill.Spill` (from its tick on the
sidecar; ``release`` also from :meth:`~outbox._spill.Spill.attach`, at construction), which owns
the write position: ``release`` hands back the sequence numbers it wrote, and writes nothing
while queued events below the overflow are not written yet.
"""

from __future__ import annotations

import time
from typing import Any

from ._buffer import Buffer
from ._log import RateLimitedLog
from ._serde import SerializedEvent, serialize, weight
from ._slices import Slicer
from ._spilldisk import Segments
from ._spillfmt import encode_event
from ._spillread import StretchReader
from ._window import Window

__all__ = ["Stretch"]

#: What takes the place of an event of the stretch that cannot be read back (or could not be
#: serialized): text that is not JSON, which the intake counts ``invalid_event``.
_UNREADABLE = b"\x00"
#: Nothing released.
_NONE = range(0)
#: After a read of the stretch failed (or found nothing where events should be), seconds before
#: the next try: the worker would otherwise try again at once, round after round, on its loop.
READ_AGAIN_AFTER = 1.0


class Stretch:
    """The stretch of one spill, in ``disk``'s segments (see the module's docstring)."""

    def __init__(self, disk: Segments, log: RateLimitedLog) -> None:
        self.disk, self.log = disk, log
        #: The buffer's memory window, once the spill is attached to the buffer.
        self.window: Window | None = None
        self.reader = StretchReader(disk.path_of)
        #: Events of the stretch that could not be read back (counted ``invalid_event``).
        self.unreadable = 0
        #: The last release found the disk full or failing: none again before the next tick.
        self.stuck = False
        #: A read back failed: none again before this time (``time.monotonic``).
        self.read_again_at = 0.0

    def close(self) -> None:
        self.reader.close()

    def release(self, buf: Buffer, slicer: Slicer | None, written: int) -> range | None:
        """Write the overflow to disk and release what was written from memory; ``written``
        is the spill's write position (every event below it is written).  Returns the
        sequence numbers released (empty: none), or None, writing nothing, if queued events
        below the overflow are not written yet: they go first (``Spill._write_new``)."""
        window = self.window
        if window is None:
            return _NONE
        with buf.lock:
            if not window.events or buf.finalized:
                return _NONE
            start = buf.head_seq + len(buf.queue) + window.disk
            if start > written:
                # emit filled the queue's window (and overflowed) after the last write: the
                # write position, moved past the overflow, would pass those queued events, and
                # no write nor cover would ever write them (close then counted them
                # spilled_at_close, on disk, when they were not).
                return None
            events = list(window.events)
            fresh = window.disk == 0
        at = time.time()
        records: list[tuple[int, bytes]] = []
        if slicer is not None:
            slicer.begin()
        for offset, event in enumerate(events):
            if slicer is not None:
                slicer.checkpoint()
            if event.__class__ is SerializedEvent:
                ser = event
            else:
                try:
                    ser = serialize(event)
                except Exception:  # read back as _UNREADABLE: the intake counts invalid_event
                    ser = SerializedEvent(b"", None, None)
            records.append((start + offset, encode_event(start + offset, at, ser)))
        written = self.disk.append(records, at, count=False)
        self.stuck = written < len(records)  # full or failing: not again before the next tick
        with buf.lock:
            if buf.finalized or buf.head_seq + len(buf.queue) + window.disk != start:
                return _NONE  # cleared meanwhile (a close that reported without the worker)
            full = self.disk.full and not self.disk.failing
            buf.spill_full_locked(full)
            window.usable = not self.disk.failing and not full
            if not written:
                return _NONE
            window.release(written)
            buf.notify_locked()  # room in the overflow for blocked emitters
        if fresh:
            self.reader.start(*self.disk.start, start)
        return range(start, start + written)

    def refill(self, buf: Buffer) -> None:
        """Read the stretch back into the queue as its window has room; with the stretch
        empty, move the overflow to the queue (what the disk did not take); end the overflow
        once both are empty."""
        window = self.window
        if window is None:
            return
        with buf.lock:
            if buf.finalized:
                return
            room = window.share_events - len(buf.queue) - buf.in_flight
            room_bytes = window.share_bytes - buf.held_bytes_locked()
            disk = window.disk
            if not disk:
                window.to_queue(buf, max(0, room))
                window.settle(buf)
                buf._recompute_locked()
                return
        if room <= 0 or room_bytes <= 0 or time.monotonic() < self.read_again_at:
            return
        want = min(room, disk)
        try:
            events = self.reader.read(want, room_bytes, self.disk.last_segment)
        except OSError as exc:
            self.log.warning("spill-read", "spill: reading back from %s failed: %s", self.disk.directory, exc)
            events = []
        else:
            if len(events) < want and self.reader.ended:
                # The end of what is written, and events of the stretch still to come: each was
                # written whole before it was released, so they are gone (corrupt or cut at the
                # end, where no later record shows the gap).  Unreadable, as a gap would be.
                missing = want - len(events)
                self.reader.skip(missing)
                events = [*events, *[None] * missing]
        if not events:
            self.read_again_at = time.monotonic() + READ_AGAIN_AFTER
            return
        with buf.lock:
            if buf.finalized or window.disk != disk:
                return
            items: list[Any] = [ser if ser is not None and ser.body else _UNREADABLE for ser in events]
            bad = items.count(_UNREADABLE)
            # Exact sizes (an unreadable record counts 1 byte: never 0, an object's mark).
            buf.rejoin_locked(items, [1 if item is _UNREADABLE else weight(item) for item in items])
            window.disk -= len(events)
            window.settle(buf)
        if bad:
            self.unreadable += bad
            self.log.warning(
                "spill-unreadable",
                "spill: %d event(s) could not be read back from %s (corrupt); counted invalid_event",
                bad,
                self.disk.directory,
            )
