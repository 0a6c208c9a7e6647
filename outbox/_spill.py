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
owner's records are read a record at a time and only as far as the buffer has room
(``_spilladopt``).

The memory window (``_window``): when the buffer's queue holds half of its bounds,
``emit`` appends to the buffer's small overflow instead; each tick (or sooner, woken by
``emit``) :meth:`Spill._release` writes the overflow to the segment and releases it from
memory (the *stretch*), and :meth:`Spill._refill` reads the stretch back (``_spillread``) as
the queue drains, in order, before the overflow.  An outage longer than the buffer then costs
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

from ._buffer import Buffer, Reason
from ._errors import ConfigError
from ._log import RateLimitedLog, logger
from ._serde import SerializedEvent, serialize
from ._slices import Slicer
from ._spilladopt import Recovered
from ._spilldisk import Segments, inspect_dir, read_checkpoint
from ._spillfmt import encode_event, encode_void
from ._spillread import StretchReader
from ._window import Window

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_MAX_BYTES", "Spill", "inspect_dir"]

DEFAULT_MAX_BYTES = 1024**3
DEFAULT_INTERVAL = 0.1
#: Seconds between two looks for dead owners while running.
SCAN_INTERVAL = 5.0
_INF = float("inf")
#: What takes the place of an event of the stretch that cannot be read back (or could not be
#: serialized): text that is not JSON, which the intake counts ``invalid_event``.
_UNREADABLE = b"\x00"


class _Adoption:
    """A dead owner being adopted: its lock, held; the last of its events queued here (its
    sequence number there, ``fed``, and here, ``last``)."""

    __slots__ = ("fd", "fed", "last", "owner")

    def __init__(self, owner: str, fd: int) -> None:
        self.owner, self.fd, self.fed, self.last = owner, fd, -1, -1


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
        self._spilled_upto = 0  # the next sequence number to write
        self._refs: deque[tuple[int, Any]] = deque()  # written, maybe still queued
        self._checkpoint = -1
        self._lowest = 0
        self._last_tick = -_INF
        self._next_scan = time.monotonic() + SCAN_INTERVAL
        self._closed = False
        #: Events of dead owners read and not yet queued; owners being adopted.
        self._recovered = Recovered([], 0)
        self._adopting: list[_Adoption] = []
        self.recovered = 0
        self.window: Window | None = None
        self.reader = StretchReader(self.disk.path_of)
        self.unreadable = 0
        self._stuck = False
        if adopt:
            self._scan()

    def attach(self, buf: Buffer) -> None:
        """Give the buffer its memory window, and queue what was adopted at construction:
        ahead of anything newer, the queue's window first, the rest through the overflow to
        our own segments (so that memory holds only a window however much was adopted)."""
        self.window = Window(buf)
        while self._recovered:
            self._fill(buf)
            with buf.lock:
                fed = self.feed_locked(buf)
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

    def _path(self, suffix: str, owner: str | None = None) -> str:
        return os.path.join(self.directory, f"{owner or self.owner}{suffix}")

    def for_child(self) -> Spill:
        """In a forked child: let go of the parent's files (the parent still owns them) and
        start a spill of the child's own."""
        self.reader.close()
        for fd in (self._lock_fd, self.disk.fd, *(a.fd for a in self._adopting)):
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

    # -- adoption -------------------------------------------------------------------------

    def _scan(self) -> None:
        """Adopt the first dead owner found, if none is being adopted."""
        if self._adopting or self._recovered:
            return
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in sorted(names):
            if not name.endswith(".lock") or name.startswith(".") or name[:-5] == self.owner:
                continue
            owner = name[:-5]
            try:
                fd = os.open(os.path.join(self.directory, name), os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # alive
                continue
            events = Recovered(self._owner_segments(owner), read_checkpoint(self._path(".ckpt", owner)))
            self._recovered = events
            self._adopting.append(_Adoption(owner, fd))
            if events:
                logger.warning(
                    "spill: adopting %d undelivered event(s) of a process that is gone (%s) from %s",
                    len(events),
                    owner,
                    self.directory,
                )
            return

    def _owner_segments(self, owner: str) -> list[str]:
        prefix = f"{owner}-"
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        segs = [n for n in names if n.startswith(prefix) and n.endswith(".seg")]
        return [os.path.join(self.directory, n) for n in sorted(segs)]

    def _fill(self, buf: Buffer) -> None:
        """Read a dead owner's events ahead, as many as the buffer has room for (outside its
        lock: ``emit`` never waits on the disk), so that memory holds at most its bounds."""
        window = self.window
        with buf.lock:
            held = len(buf.queue) + buf.in_flight
            held_bytes = buf.held_bytes_locked()
            if window is not None:
                held += len(window.events)
                held_bytes += window.bytes(buf.estimate)
        self._recovered.fill(max(1, buf.max_events - held), max(1, buf.max_bytes - held_bytes))

    def feed_locked(self, buf: Buffer) -> int:
        """Queue recovered events while the buffer has room (caller holds its lock).
        Returns how many were queued."""
        recovered = self._recovered.ready
        n = 0
        fed = -1
        while recovered:
            seq, event = recovered[0]
            size = len(event.body) or 1
            if buf.closed or not buf.has_room_locked(size) or not buf.put_locked(event, size):
                break
            recovered.popleft()
            fed = seq
            n += 1
        if n:
            self.recovered += n
            if self._adopting:
                adoption = self._adopting[-1]
                adoption.fed, adoption.last = fed, buf.next_seq - 1
        return n

    def _finish_adoptions(self) -> None:
        """A dead owner whose events are all queued here, and written to our own segments:
        its files go, the lock file last."""
        if self._recovered or not self._adopting:
            return
        adoption = self._adopting[0]
        if adoption.last >= self._spilled_upto:
            return
        owner = adoption.owner
        for path in (*self._owner_segments(owner), self._path(".ckpt", owner), self._path(".lock", owner)):
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(adoption.fd)
        self._adopting.pop(0)

    def _release_adoptions(self) -> None:
        """Closing with a dead owner's events not all queued: what was queued here (and is in
        our own segments) is marked settled in its checkpoint, so that the next adopter does
        not send it again; the rest stays in its files, its lock let go."""
        for adoption in self._adopting:
            if adoption.fed >= 0 and adoption.last < self._spilled_upto:
                path = self._path(".ckpt", adoption.owner)
                with contextlib.suppress(OSError):
                    with open(path + ".tmp", "w") as f:
                        f.write(f"{adoption.fed + 1}\n")
                    os.replace(path + ".tmp", path)
            with contextlib.suppress(OSError):
                os.close(adoption.fd)
        self._adopting.clear()

    # -- the worker's side ------------------------------------------------------------------

    def due(self, buf: Buffer, now: float) -> float:
        """Seconds until :meth:`tick` has something to do (read without the lock)."""
        if self._closed:
            return _INF
        window = self.window
        if (
            window is not None
            and window.active
            and (
                (len(window.events) >= window.wake_at and not self._stuck)
                # (not while in flight fills the window's bytes: the refill could read
                # nothing, and the worker would spin on its loop until the backend answers)
                or (window.disk and not buf.queue and window.can_refill(buf))
            )
        ):
            return 0.0
        busy = buf.beyond or (
            buf.next_seq != self._spilled_upto
            or buf.lowest_unsettled_locked() != self._checkpoint
            or self._recovered
            or self._adopting
        )
        if busy:
            return max(0.0, self._last_tick + self.interval - now)
        return max(0.0, self._next_scan - now)

    def write(self, buf: Buffer, slicer: Slicer | None) -> None:
        """Write what was queued since the last write, now (before a batch is taken).
        Never raises."""
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
        window = self.window
        if window is not None and window.active:
            try:
                self._refill(buf)
                if len(window.events) >= window.wake_at and not self._stuck:
                    self._write_new(buf, slicer)
                    self._release(buf, slicer)
            except Exception as exc:  # a bug of ours must not stop the worker
                self.log.error("spill-bug", "spill: unexpected error, going on in memory: %r", exc)
        if not force and now < self._last_tick + self.interval:
            return
        self._last_tick = now
        self._stuck = False  # (the disk is tried again once an interval)
        try:
            if self._recovered:
                self._fill(buf)
                with buf.lock:
                    self.feed_locked(buf)
            self._write_new(buf, slicer)
            self._release(buf, slicer)
            self._refill(buf)
            self._record_progress(buf)
            self._finish_adoptions()
            if window is not None and not window.active:
                # Overflow to disk again once it works and has room.
                disk = self.disk
                full = disk.disk_bytes >= self.max_bytes
                with buf.lock:
                    window.usable = not disk.failing and not full
                    buf.full_reason = Reason.DROPPED_SPILL_FULL if full else Reason.DROPPED_FULL
            if now >= self._next_scan:
                self._next_scan = now + SCAN_INTERVAL
                self._scan()
        except Exception as exc:  # a bug of ours must not stop the worker
            self.log.error("spill-bug", "spill: unexpected error, going on in memory: %r", exc)

    def _collect_locked(self, buf: Buffer) -> tuple[int | None, int, list[Any]]:
        """(void from, first seq, events) to write: what was queued since the last write."""
        head, queue = buf.head_seq, buf.queue
        refs = self._refs
        while refs and refs[0][0] < head:
            refs.popleft()
        void: int | None = None
        # Shedding takes the newest queued events back, and their sequence numbers are given
        # again: what was written of them is void.
        while refs and (refs[-1][0] - head >= len(queue) or queue[refs[-1][0] - head] is not refs[-1][1]):
            void = refs.pop()[0]
        if buf.next_seq < self._spilled_upto and (void is None or buf.next_seq < void):
            void = buf.next_seq
        if void is not None:
            self._spilled_upto = min(self._spilled_upto, void)
        start = max(self._spilled_upto, head)
        # The newest, from the tail: the cost is what is new, not the length of the queue.
        fresh = list(islice(reversed(queue), max(0, head + len(queue) - start)))
        fresh.reverse()
        return void, start, fresh

    def _write_new(self, buf: Buffer, slicer: Slicer | None) -> None:
        with buf.lock:
            void, start, events = self._collect_locked(buf)
        if void is None and not events:
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
                except Exception:  # the intake counts it as invalid_event
                    continue
            done.append((start + offset, event, ser))
            records.append((start + offset, encode_event(start + offset, at, ser)))
        end = start + len(events)
        with buf.lock:
            self._replace_locked(buf, done)
        self._spilled_upto = end
        self.disk.append(records, at)

    # -- the memory window (see ``_window``) ---------------------------------------------------

    def _release(self, buf: Buffer, slicer: Slicer | None) -> int:
        """Write the overflow to disk and release what was written from memory.  Returns how
        many events were released."""
        window = self.window
        if window is None:
            return 0
        with buf.lock:
            if not window.events or buf.finalized:
                return 0
            events = list(window.events)
            start = buf.head_seq + len(buf.queue) + window.disk
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
        self._stuck = written < len(records)  # full or failing: not again before the next tick
        with buf.lock:
            if buf.finalized or buf.head_seq + len(buf.queue) + window.disk != start:
                return 0  # cleared meanwhile (a close that reported without the worker)
            full = self.disk.full and not self.disk.failing
            buf.full_reason = Reason.DROPPED_SPILL_FULL if full else Reason.DROPPED_FULL
            window.usable = not self.disk.failing and not full
            if not written:
                return 0
            window.release(written)
            buf.notify_locked()  # room in the overflow for blocked emitters
        if fresh:
            self.reader.start(*self.disk.start, start)
        self._spilled_upto = start + written
        return written

    def _refill(self, buf: Buffer) -> None:
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
        if room <= 0 or room_bytes <= 0:
            return
        try:
            events = self.reader.read(min(room, disk), room_bytes, self.disk.last_segment)
        except OSError as exc:
            self.log.warning("spill-read", "spill: reading back from %s failed: %s", self.directory, exc)
            return
        if not events:
            return
        bad = 0
        with buf.lock:
            if buf.finalized or window.disk != disk:
                return
            queue, sizes = buf.queue, buf.sizes
            total = 0
            for ser in events:
                item: Any = ser if ser is not None and ser.body else _UNREADABLE
                bad += item is _UNREADABLE
                size = len(item.body) if item is not _UNREADABLE else 1
                queue.append(item)
                sizes.append(size)
                total += size
            buf.exact_bytes += total
            buf.exact_count += len(events)
            window.disk -= len(events)
            buf.beyond -= len(events)
            window.settle(buf)
            buf._recompute_locked()
        if bad:
            self.unreadable += bad
            self.log.warning(
                "spill-unreadable",
                "spill: %d event(s) could not be read back from %s (corrupt); counted invalid_event",
                bad,
                self.directory,
            )

    def cover(self, items: list[Any]) -> None:
        """Events just taken from the buffer (``Held``, serialized) that no tick wrote yet (an
        emit raced the last one): written now, before any transport sees them."""
        if self._closed:
            return
        fresh = [item for item in items if item.seq >= self._spilled_upto]
        if not fresh:
            return
        at = time.time()
        self._spilled_upto = fresh[-1].seq + 1
        self.disk.append([(item.seq, encode_event(item.seq, at, item.event)) for item in fresh], at)

    def _replace_locked(self, buf: Buffer, done: list[tuple[int, Any, SerializedEvent]]) -> None:
        """Objects serialized here take their serialized form's place in the queue (the
        intake then does not serialize them again); the references kept tell a shed later."""
        head, queue = buf.head_seq, buf.queue
        total = count = 0
        for seq, event, ser in done:
            index = seq - head
            if not 0 <= index < len(queue):
                continue  # taken meanwhile (or shed: then the next tick finds it void)
            now = queue[index]
            if now is event:
                if event is not ser:
                    if not buf.sizes[index]:
                        count += 1
                        total += len(ser.body)
                    buf.replace_locked(index, ser)
                self._refs.append((seq, ser))
            elif now.__class__ is SerializedEvent and event.__class__ is not SerializedEvent:
                # The intake's sampling serialized it in place meanwhile (it runs at our
                # slices' hand-offs): the same event.  (emit never queues a SerializedEvent.)
                self._refs.append((seq, now))
            else:
                self._refs.append((seq, event))  # not the one written: the next tick voids it
        if count:
            buf.learn_locked(total // count)

    def _record_progress(self, buf: Buffer) -> None:
        """Checkpoint the oldest unsettled event; delete the segments below it."""
        with buf.lock:
            if buf.finalized:
                # The close's report was made without the worker (it overran the deadline):
                # what it counted as lost is still on disk, and stays there for a successor.
                return
            lowest = buf.lowest_unsettled_locked()
        lowest = int(min(lowest, self._spilled_upto))
        self._lowest = lowest
        if lowest == self._checkpoint:
            return
        self.disk.forget_below(lowest)
        try:
            tmp = self._path(".ckpt.tmp")
            with open(tmp, "w") as f:
                f.write(f"{lowest}\n")
            os.replace(tmp, self._path(".ckpt"))
            self._checkpoint = lowest
        except OSError as exc:
            self.log.warning(
                "spill-ckpt", "spill: cannot write the checkpoint in %s: %s", self.directory, exc
            )

    def close(self, buf: Buffer) -> bool:
        """The worker is done: write the last events and the checkpoint, let go of the files
        (a successor adopts what is unsettled).  Returns True if every event still held is
        on disk (then the outbox counts them ``spilled_at_close``, not lost)."""
        if self._closed:
            return False
        self.tick(buf, None, time.monotonic(), force=True)
        self._closed = True
        with buf.lock:
            held = len(buf.queue) + buf.in_flight + buf.beyond
            durable = not self.disk.not_spilled and self._spilled_upto >= buf.next_seq
            keep = held or buf.finalized  # finalized: see _record_progress
        # (Events adopted and not yet queued stay in their dead owner's files.)
        self.disk.close(delete=not keep)
        if not keep:
            for suffix in (".ckpt", ".lock"):
                with contextlib.suppress(OSError):
                    os.unlink(self._path(suffix))
        self._release_adoptions()
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)
        self.reader.close()
        return durable and held > 0

    # -- observability ------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """What ``Stats.spill`` shows (read without the buffer's lock: a snapshot that may be a
        tick old)."""
        disk = self.disk
        marks = disk.marks
        oldest = marks[0][1] if marks else None
        return {
            "spilled_events": max(0, self._spilled_upto - self._lowest) if disk.written else 0,
            "spilled_bytes": disk.disk_bytes,
            "segments": len(disk),
            "written": disk.written,
            "recovered": self.recovered,
            "recovering": len(self._recovered),
            "not_spilled_full": disk.not_spilled.get("spill_full", 0),
            "not_spilled_failed": disk.not_spilled.get("spill_failed", 0),
            **{f"failed_{name.lower()}": n for name, n in dict(disk.failures).items()},
            "overflow_events": len(self.window.events) if self.window is not None else 0,
            "stretch_events": self.window.disk if self.window is not None else 0,
            "unreadable": self.unreadable,
            "oldest_age": max(0.0, time.time() - oldest) if oldest is not None else 0.0,
        }
