"""The spill: every accepted event written to local disk by the sidecar, so that a process that
dies (SIGKILL, OOM kill, a container replaced) or closes with the backend down hands what it had
not delivered to its successor.  Off unless ``spill_dir`` is set.

Who writes: the sidecar, never ``emit``.  Every ``interval`` (and before each batch is taken from
the buffer, so that no event reaches a transport before the disk) the worker calls
:meth:`Spill.tick`, which reads the events queued since the last write, serializes them (in
place in the buffer: the intake does not do it again), and appends them in one write to this
process's current segment (``_spillfmt``).  Page cache, no fsync: a dead process loses nothing
written; a dead machine may lose the last seconds.

What is forgotten: the buffer numbers every accepted event; all below
``Buffer.lowest_unsettled_locked()`` are delivered or counted lost.  That number is the
checkpoint (``OWNER.ckpt``, rewritten atomically each tick when it moved); a segment whose
events are all below it is deleted.

Owners: each process (each outbox) is an owner with a random id; it holds an ``flock`` on
``OWNER.lock`` for its whole life (the kernel drops it when the process dies, however it dies).
At construction, and every ``SCAN_INTERVAL`` after, an outbox looks for owners whose lock it can
take: dead ones.  It adopts one (holding its lock, so that exactly one process adopts it), reads
its records above its checkpoint, queues them in its own buffer ahead of anything newer (at
construction, :meth:`Spill.attach`, all of them: what exceeds the queue's window goes through the
overflow to our own segments before the constructor returns; while running, as room allows),
writes them to its own segments like any event, and then deletes the dead owner's files, its
lock file last.  A crash in between leaves both copies: sent twice, never lost.  The dead
owner's records are read a record at a time and only as far as the buffer has room.  All of
adoption is ``_spilladopt``'s :class:`Adopter`; when to look for dead owners is decided here.

The memory window (``_window``): when the buffer's queue holds half of its bounds,
``emit`` appends to the buffer's small overflow instead; each tick (or sooner, woken by
``emit``) the spill writes the overflow to the segment and releases it from memory (the
*stretch*), and reads the stretch back as the queue drains, in order, before the overflow
(``_spillstretch``'s :class:`Stretch`).  An outage longer than the buffer then costs
disk, not events, up to ``max_spill_bytes``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import time
from collections import deque
from itertools import islice
from typing import Any

from ._buffer import Buffer
from ._errors import ConfigError
from ._log import RateLimitedLog
from ._serde import SerializedEvent, serialize, weight
from ._slices import Slicer
from ._spilladopt import Adopter
from ._spilldisk import RETRY_AFTER, Segments, Unwritten, inspect_dir
from ._spillfmt import HEADER, encode_event, encode_void
from ._spillstretch import Stretch
from ._window import Window

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_MAX_BYTES", "Spill", "inspect_dir"]

DEFAULT_MAX_BYTES = 1024**3
DEFAULT_INTERVAL = 0.1
#: Seconds between two looks for dead owners while running.
SCAN_INTERVAL = 5.0
_INF = float("inf")
#: The record of an event that cannot be serialized: read back, it is counted invalid_event.
_UNWRITABLE = SerializedEvent(b"", None, None)


class Spill:
    """One process's spill in ``directory`` (see the module's docstring).

    Raises:
        ConfigError: the directory cannot be made, is not a directory, or is not writable.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        interval: float = DEFAULT_INTERVAL,
        log_interval: float = 30.0,
        adopt: bool = True,
    ) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        self.max_bytes = max_bytes
        self.interval = interval
        self.log = RateLimitedLog(log_interval)
        self.owner = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._lock_fd = self._take_own_lock()
        self.disk = Segments(self.directory, self.owner, max_bytes, self.log)
        # The next sequence number to write: every queued event below it is on disk.  A write
        # the disk refuses (full, failing) leaves it at the first event not written, so the next
        # write tries that one again (once settled segments free room, or the disk works again).
        self._spilled_upto = 0
        self.unwritten = Unwritten(self.disk)
        # A void record the disk refused: written ahead of the next write.
        self._void: int | None = None
        self._refs: deque[tuple[int, Any]] = deque()  # written, maybe still queued
        self._checkpoint = -1
        self._checkpoint_retry_at = -_INF
        self._lowest = 0
        self._last_tick = -_INF
        self._next_scan = time.monotonic() + SCAN_INTERVAL
        self._closed = False
        self.adopter = Adopter(self.directory, self.owner)
        self.stretch = Stretch(self.disk, self.log)
        if adopt:
            self.adopter.scan()

    def attach(self, buf: Buffer) -> None:
        """Give the buffer its memory window, and queue what was adopted at construction:
        ahead of anything newer, the queue's window first, the rest through the overflow to
        our own segments (so that memory holds only a window however much was adopted)."""
        self.stretch.window = Window(buf)
        adopter = self.adopter
        while adopter.recovering:
            adopter.fill(buf, self.stretch.window)
            with buf.lock:
                fed = adopter.feed_locked(buf)
            self._write_new(buf, None)
            released = self._release(buf, None)
            if not fed and not released:
                break

    # -- construction -------------------------------------------------------------------

    def _take_own_lock(self) -> int:
        """Make the directory if need be, and take this owner's lock (made under a temporary
        name and renamed, so that no scanner ever sees it unlocked)."""
        directory = self.directory
        try:
            os.makedirs(directory, exist_ok=True)
            if not os.path.isdir(directory):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", directory)
            tmp = os.path.join(directory, f".{self.owner}.lock.tmp")
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(tmp, self._path(".lock"))
        except OSError as exc:
            raise ConfigError(
                f"spill_dir={directory!r} is not usable: {exc.strerror or exc}; "
                "pass a writable directory on local disk (it is made if missing)"
            ) from None
        return fd

    def _path(self, suffix: str) -> str:
        return os.path.join(self.directory, f"{self.owner}{suffix}")

    def for_child(self) -> Spill:
        """In a forked child: let go of the parent's files (the parent still owns them) and
        start a spill of the child's own."""
        self.stretch.close()
        for fd in (self._lock_fd, self.disk.fd, *(a.fd for a in self.adopter.adopting)):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return Spill(
            self.directory,
            max_bytes=self.max_bytes,
            interval=self.interval,
            log_interval=self.log.interval,
            adopt=False,
        )

    # -- the worker's side ------------------------------------------------------------------

    def due(self, buf: Buffer, now: float) -> float:
        """Seconds until :meth:`tick` has something to do (read without the lock)."""
        if self._closed:
            return _INF
        window = self.stretch.window
        if (
            window is not None
            and window.active
            and (
                (len(window.events) >= window.wake_at and not self.stretch.stuck)
                # (not while in flight fills the window's bytes: the refill could read
                # nothing, and the worker would spin on its loop until the backend answers)
                # (nor while a read back that failed waits to be tried again)
                or (
                    window.disk
                    and not buf.queue
                    and window.can_refill(buf)
                    and now >= self.stretch.read_again_at
                )
            )
        ):
            return 0.0
        busy = buf.beyond or (
            buf.next_seq != self._spilled_upto
            or buf.lowest_unsettled_locked() != self._checkpoint
            or self.adopter.recovering
            or self.adopter.adopting
        )
        if busy:
            return max(0.0, self._last_tick + self.interval - now)
        return max(0.0, self._next_scan - now)

    def write(self, buf: Buffer, slicer: Slicer | None) -> None:
        """Write what was queued since the last write, now (before a batch). Never raises."""
        if self._closed:
            return
        try:
            self._write_new(buf, slicer)
        except Exception as exc:  # a bug of ours must not stop the worker
            self.log.error("spill-bug", "spill: unexpected error, going on in memory: %r", exc)

    def tick(self, buf: Buffer, slicer: Slicer | None, now: float, force: bool = False) -> None:
        """Once an interval: write what was queued since the last write, record progress,
        forget what is settled, adopt dead owners' events (``force``: now).  Never raises: a
        failure of ours is logged and the outbox goes on in memory."""
        if self._closed:
            return
        window = self.stretch.window
        if window is not None and window.active:
            try:
                self.stretch.refill(buf)
                if len(window.events) >= window.wake_at and not self.stretch.stuck:
                    self._write_new(buf, slicer)
                    self._release(buf, slicer)
            except Exception as exc:  # a bug of ours must not stop the worker
                self.log.error("spill-bug", "spill: unexpected error, going on in memory: %r", exc)
        if not force and now < self._last_tick + self.interval:
            return
        self._last_tick = now
        self.stretch.stuck = False  # (the disk is tried again once an interval)
        try:
            adopter = self.adopter
            if adopter.recovering:
                adopter.fill(buf, self.stretch.window)
                with buf.lock:
                    adopter.feed_locked(buf)
            self._write_new(buf, slicer)
            self._release(buf, slicer)
            self.stretch.refill(buf)
            self._record_progress(buf)
            # (The first hole's events left the queue before the disk took them: not on disk
            # here, so the dead owner's files are still their only copy until they settle.)
            holes = self.unwritten.holes
            adopter.finish(min(self._spilled_upto, holes[0][0]) if holes else self._spilled_upto)
            if window is not None and not window.active:
                # Overflow to disk again once it works and has room.
                disk = self.disk
                full = disk.disk_bytes >= self.max_bytes
                with buf.lock:
                    window.usable = not disk.failing and not full
                    buf.spill_full_locked(full)
            if now >= self._next_scan:
                self._next_scan = now + SCAN_INTERVAL
                adopter.scan()
        except Exception as exc:  # a bug of ours must not stop the worker
            self.log.error("spill-bug", "spill: unexpected error, going on in memory: %r", exc)

    def _collect_locked(self, buf: Buffer, most: int) -> tuple[int | None, int, list[Any], int]:
        """(void from, first seq, events, fresh) to write: what was queued since the last write
        (``fresh`` events), the first ``most`` of them (what the disk may have room for)."""
        head, queue = buf.head_seq, buf.queue
        refs = self._refs
        while refs and refs[0][0] < head:
            refs.popleft()
        void: int | None = None
        # Shedding takes the newest queued events back, and their sequence numbers are given
        # again: what was written of them is void, and what the disk refused of them was
        # counted (the events now under those numbers are new, to be counted if refused).
        # The buffer keeps the lowest number given back: by now new events may have taken
        # it and more, so ``next_seq`` may not show it.
        while refs and (refs[-1][0] - head >= len(queue) or queue[refs[-1][0] - head] is not refs[-1][1]):
            void = refs.pop()[0]
        # (Not below the head: what left the queue since is not this write's.)
        given_back = max(head, buf.take_given_back_locked())
        if given_back < self._spilled_upto and (void is None or given_back < void):
            void = int(given_back)
        if void is not None:
            self.unwritten.void(void)
        if given_back < _INF:
            self.unwritten.void(int(given_back))
        if self._void is not None and (void is None or self._void < void):
            void = self._void  # (one the disk refused: its events are counted already)
        if void is not None:
            self._spilled_upto = min(self._spilled_upto, void)
        start = max(self._spilled_upto, head)
        new = max(0, head + len(queue) - start)
        take = min(new, most)
        if not take:
            return void, start, [], new
        # The newest, from the tail: the cost is what is new, not the length of the queue.
        events = list(islice(reversed(queue), new - take, new))
        events.reverse()
        return void, start, events, new

    def _write_new(self, buf: Buffer, slicer: Slicer | None) -> None:
        with buf.lock:
            # (finalized: what the close counted lost stays on disk, see _record_progress)
            lowest = -1 if buf.finalized else int(min(buf.lowest_unsettled_locked(), self._spilled_upto))
        if lowest > 0:
            # Settled segments go first: their room is this write's (after an outage that
            # filled the disk, the backend's catching up frees it).
            self.disk.forget_below(lowest)
        # No more events than the disk has room for (a record is at least HEADER bytes): with
        # the disk full, each tick neither copies the queue nor encodes what it cannot write.
        room = self.disk.room()
        with buf.lock:
            void, start, events, new = self._collect_locked(buf, room // HEADER + 1 if room > 0 else 0)
        if void is None and not new:
            return
        at = time.time()
        records: list[tuple[int, bytes]] = [(-1, encode_void(void, at))] if void is not None else []
        done: list[tuple[int, Any, SerializedEvent]] = []
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
                except Exception:
                    # The intake counts it as invalid_event when it takes it; written as a
                    # record with no body all the same (as the stretch writes one), so that a
                    # successor adopting it counts it invalid_event too (a close counts it
                    # spilled_at_close, on disk: it must be, or it is lost and counted nowhere).
                    records.append((start + offset, encode_event(start + offset, at, _UNWRITABLE)))
                    continue
            done.append((start + offset, event, ser))
            records.append((start + offset, encode_event(start + offset, at, ser)))
        wrote = self.disk.append(records, at, count=False)
        self._void = void if void is not None and not wrote else None
        # The first event the disk did not take: the next write begins there.
        upto = next((seq for seq, _ in records[wrote:] if seq >= 0), start + len(events))
        with buf.lock:
            _replace_locked(buf, self._refs, done, upto)
        self.unwritten.count(records[wrote:])
        self.unwritten.count_range(start + len(events), start + new)  # (not collected)
        self._spilled_upto = upto

    def _release(self, buf: Buffer, slicer: Slicer | None) -> int:
        """Write the overflow to the stretch (``_spillstretch``), and move the write position
        past it.  Returns how many events were released."""
        released = self.stretch.release(buf, slicer, self._spilled_upto)
        if released is None:
            # Queued events not written yet (emit filled the queue after the write): first
            # them.  The overflow is active, so emit cannot queue more meanwhile.
            self._write_new(buf, slicer)
            released = self.stretch.release(buf, slicer, self._spilled_upto)
            if released is None:
                return 0
        if released:
            self._spilled_upto = released.stop
        return len(released)

    def cover(self, buf: Buffer, items: list[Any]) -> None:
        """Events just taken from the buffer (``Held``, serialized) that no write took yet (an
        emit raced the last one): written now, before any transport sees them."""
        if self._closed:
            return
        # A shed since the last write (that write's own measure, or the intake's) gave numbers
        # back, and the events now under them may be among these: what was written at those
        # numbers is void, and these are written anew (no later write sees them again).
        with buf.lock:
            given_back = buf.take_given_back_locked()
        void = int(given_back) if given_back < self._spilled_upto else None
        if given_back < _INF:
            self.unwritten.void(int(given_back))
        if self._void is not None and (void is None or self._void < void):
            void = self._void  # (one the disk refused: ahead of this write, as in _write_new)
        if void is not None:
            self._spilled_upto = min(self._spilled_upto, void)
            while self._refs and self._refs[-1][0] >= void:
                self._refs.pop()
        fresh = [item for item in items if item.seq >= self._spilled_upto]
        if not fresh and void is None:
            return
        at = time.time()
        records = [(-1, encode_void(void, at))] if void is not None else []
        records += [(item.seq, encode_event(item.seq, at, item.event)) for item in fresh]
        wrote = self.disk.append(records, at, count=False)
        self._void = void if void is not None and not wrote else None
        missed = [record for record in records[wrote:] if record[0] >= 0]
        if missed:
            # They leave the queue now: no later write can take them.  Not on disk until settled.
            self.unwritten.hole(missed[0][0], missed[-1][0] + 1)
            self.unwritten.count(missed)
        if fresh:
            self._spilled_upto = fresh[-1].seq + 1

    def _record_progress(self, buf: Buffer) -> None:
        """Checkpoint the oldest unsettled event; delete the segments below it."""
        with buf.lock:
            if buf.finalized:
                # The close's report was made without the worker (it overran the deadline):
                # what it counted as lost is still on disk, and stays there for a successor.
                return
            unsettled = buf.lowest_unsettled_locked()
        self.unwritten.settled(unsettled)
        lowest = int(min(unsettled, self._spilled_upto))
        self._lowest = lowest
        if lowest == self._checkpoint:
            return
        self.disk.forget_below(lowest)
        if time.monotonic() < self._checkpoint_retry_at:
            return
        try:
            tmp = self._path(".ckpt.tmp")
            with open(tmp, "w") as f:
                f.write(f"{lowest}\n")
            os.replace(tmp, self._path(".ckpt"))
            self._checkpoint = lowest
        except OSError as exc:
            # A failing disk, as the segments meet it: counted by errno, the same one warning,
            # tried again RETRY_AFTER later (not every interval).  The segments go on meanwhile:
            # an open one may still take appends where no new file can be made (EACCES).
            self._checkpoint_retry_at = time.monotonic() + RETRY_AFTER
            self.disk.failed(exc)

    def close(self, buf: Buffer) -> int:
        """The worker is done: write the last events and the checkpoint, let go of the files
        (a successor adopts what is unsettled).  Returns how many of the events still held
        are on disk (the outbox counts them ``spilled_at_close``, the rest lost)."""
        if self._closed:
            return 0
        self.tick(buf, None, time.monotonic(), force=True)
        self._closed = True
        with buf.lock:
            held = len(buf.queue) + buf.in_flight + buf.beyond
            head = buf.head_seq
            end = head + len(buf.queue) + buf.beyond  # queue, stretch and overflow: in order
            lowest = int(min(buf.lowest_unsettled_locked(), end))
            on_disk = held - min(held, self.unwritten.missing(self._spilled_upto, head, end, lowest))
            keep = held or buf.finalized  # finalized: see _record_progress
            if self._void is not None and not buf.finalized:  # refused to the last: the files
                on_disk, keep = 0, False  # hold records of events counted lost; none handed on
        # (Events adopted and not yet queued stay in their dead owner's files.)
        self.disk.close(delete=not keep)
        if not keep:
            for suffix in (".ckpt", ".lock"):
                with contextlib.suppress(OSError):
                    os.unlink(self._path(suffix))
        self.adopter.release(self._spilled_upto)
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)
        self.stretch.close()
        return on_disk

    # -- observability ------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """What ``Stats.spill`` shows (read without the lock: a snapshot, maybe a tick old)."""
        disk, window = self.disk, self.stretch.window
        marks = disk.marks
        oldest = marks[0][1] if marks else None
        return {
            "spilled_events": max(0, self._spilled_upto - self._lowest) if disk.written else 0,
            "spilled_bytes": disk.disk_bytes,
            "segments": len(disk),
            "written": disk.written,
            "recovered": self.adopter.recovered,
            "recovering": len(self.adopter.recovering),
            "not_spilled_full": disk.not_spilled.get("spill_full", 0),
            "not_spilled_failed": disk.not_spilled.get("spill_failed", 0),
            **{f"failed_{name.lower()}": n for name, n in dict(disk.failures).items()},
            "overflow_events": len(window.events) if window is not None else 0,
            "stretch_events": window.disk if window is not None else 0,
            "unreadable": self.stretch.unreadable,
            "oldest_age": max(0.0, time.time() - oldest) if oldest is not None else 0.0,
        }


def _replace_locked(
    buf: Buffer, refs: deque[tuple[int, Any]], done: list[tuple[int, Any, SerializedEvent]], upto: int
) -> None:
    """Objects serialized here take their serialized form's place in the queue (the
    intake then does not serialize them again); the references kept of those written
    (below ``upto``) tell a shed later."""
    head, queue = buf.head_seq, buf.queue
    total = count = 0
    for seq, event, ser in done:
        index = seq - head
        if not 0 <= index < len(queue):
            continue  # taken meanwhile (or shed: then the next tick finds it void)
        now = queue[index]
        written = seq < upto  # (not written: serialized in place all the same, written later)
        if now is event:
            if event is not ser:
                if not buf.sizes[index]:
                    count += 1
                    total += weight(ser)
                buf.replace_locked(index, ser)
            if written:
                refs.append((seq, ser))
        elif not written:
            pass
        elif now.__class__ is SerializedEvent and event.__class__ is not SerializedEvent:
            # The intake's sampling serialized it in place meanwhile (it runs at our
            # slices' hand-offs): the same event.  (emit never queues a SerializedEvent.)
            refs.append((seq, now))
        else:
            refs.append((seq, event))  # not the one written: the next tick voids it
    if count:
        buf.learn_locked(total // count)
