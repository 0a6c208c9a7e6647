"""The spill: one owner's log of what happened to its events, driven by the sidecar.

Every accepted event is written (an *event* record) within ``interval`` of being queued and
before any transport sees it; what becomes of it is written too (a *settlement*, from the
buffer's journal).  Nothing here runs on ``emit``'s path.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from typing import Any

from .._buffer._buffer import Buffer, serialize_held
from .._buffer._numbering import DELIVERED
from .._errors import ConfigError
from .._observability._log import RateLimitedLog, never_silent
from .._run._serde import SerializedEvent
from .._runtime._slices import Slicer
from ._adoption import Adoption
from ._disk import RETRY_AFTER, Disk
from ._format import HEADER
from ._owners import Home
from ._ranges import Ranges
from ._window import Window

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_MAX_BYTES", "SCAN_INTERVAL", "Spill"]

DEFAULT_MAX_BYTES = 1024**3
DEFAULT_INTERVAL = 0.1
#: Seconds between two looks for dead owners while running (and one at start and at close).
SCAN_INTERVAL = 5.0
_INF = float("inf")


class Spill:
    """One owner's spill in ``directory`` (see the module's docstring).

    Raises:
        ConfigError: the directory cannot be made, is not a directory, or is not writable (a full
            disk is not an error: the outbox starts in memory and makes it once there is room).
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
        self.max_bytes, self.interval = max_bytes, interval
        self.log = RateLimitedLog(log_interval)
        self.window = Window()
        self._retry_home_at = 0.0  # (a directory that could not be made, or made again)
        full: OSError | None = None
        try:
            home = Home(self.directory)
        except ConfigError as exc:
            cause = exc.__cause__
            # (ENOENT: what it made was removed as it made it, every try: a cleanup job's loop)
            if not isinstance(cause, OSError) or cause.errno not in (
                errno.ENOSPC,
                errno.EDQUOT,
                errno.ENOENT,
            ):
                raise
            home, full = Home.unmade(self.directory), cause
        self._begin(home)
        if full is not None:  # in memory until the disk has room (or a directory stays), as when it vanished
            self.disk.failed(full)
            self._retry_home_at = self.disk.retry_at
        self.recovered = 0
        self._closed = self._scan_now = False
        #: A look is under way (from before ``_scan_now`` is cleared until its owners are pending).
        self._looking = False
        self._last_tick = -_INF
        self._next_scan = time.monotonic() + SCAN_INTERVAL
        self._adopt_at_attach = adopt

    def _begin(self, home: Home) -> None:
        """This owner's files start (anew after its directory vanished: what the last ones
        counted is carried on, so that ``stats()`` never goes back)."""
        disk = Disk(home, self.max_bytes, self.log)
        if (before := getattr(self, "disk", None)) is not None:
            disk.carry_counts(before)  # (before it is seen: stats() reads without a lock)
        self.home, self.disk = home, disk
        if (adoption := getattr(self, "adoption", None)) is None:
            self.adoption = adoption = Adoption(self.directory, self.log)
        adoption.next_key = None  # (a new directory: looked at before the next hand-over)
        #: Own queued events below this number are written (or were refused, and counted).
        self.written_upto = 0

    # -- adoption ---------------------------------------------------------------------------

    def _place_locked(self, buf: Buffer) -> None:
        """Adopted events join the stretch (not past events the overflow holds in memory)."""
        adoption = self.adoption
        if adoption.pending and not self.window.events and not buf.finalized:
            self.recovered += adoption.remaining()
            self.window.place_locked(buf.holdings, adoption.pending)
            adoption.pending = []

    def attach(self, buf: Buffer) -> None:
        """Give the buffer its memory window and its journal, adopt the dead owners, and put their
        events first."""
        with buf.lock:
            self.window.attach(buf.holdings)
            buf.holdings.keep_journal_locked()
        if self._adopt_at_attach:
            self.adoption.adopt(
                self.home, self.disk.streams, self.window.share_bytes, self.window.share_events
            )
        with buf.lock:
            self._place_locked(buf)

    def has_pending(self) -> bool:
        """Whether dead owners' events wait to join the stretch (or a look for them is due, or under way)."""
        return bool(self.adoption.waiting() or self._scan_now or self._looking or self.home.taken)

    def begin_close(self) -> None:
        """A close began: look for dead owners at the next tick."""
        self._scan_now = True

    # -- the worker's side ------------------------------------------------------------------

    def due(self, buf: Buffer, now: float) -> float:
        """Seconds until :meth:`tick` has something to do (read without the lock)."""
        window = self.window
        if self._closed or buf.holdings.overflow is not window:
            return _INF
        if window.active and (
            window.wants_write(buf.holdings)
            or (
                window.disk
                and not buf.holdings.queue
                and window.readable(buf.holdings)[0] > 0
                and now >= window.read_again_at
            )
        ):
            return 0.0
        journal = buf.holdings.journal
        if (
            buf.holdings.beyond
            or buf.holdings.next_seq > self.written_upto
            or (journal is not None and journal.entries)
            or self.disk.unsettled
            or self.has_pending()
        ):
            return max(0.0, self._last_tick + self.interval - now)
        return max(0.0, self._next_scan - now)

    def tick(self, buf: Buffer, slicer: Slicer | None, now: float, force: bool = False) -> None:
        """Once an interval: write the events and settlements, delete what is settled, read the
        stretch back, adopt dead owners.  Never raises: the outbox goes on in memory."""
        window = self.window
        if self._closed or buf.holdings.overflow is not window:
            return
        try:
            if window.active:
                window.refill(buf, self.log)
                if window.wants_write(buf.holdings):
                    self._write(buf, slicer)
            if not force and now < self._last_tick + self.interval:
                return
            self._last_tick, window.stuck = now, False
            if self.home.lock_fd < 0:  # no directory (a full disk, or it vanished): tried again
                self._start_over(buf)
            # Settled files go first: their room is this write's (after an outage that filled
            # the disk, the backend's catching up frees it).
            self._settle(buf)
            self.disk.make_room()
            self._write(buf, slicer)
            self._settle(buf)
            self.disk.write_settlements()
            window.refill(buf, self.log)
            if now >= self._next_scan or self._scan_now or self.home.taken or self.adoption.unread:
                self._looking = True
                self._next_scan, self._scan_now = now + SCAN_INTERVAL, False
                try:
                    self.adoption.adopt(self.home, self.disk.streams)
                finally:
                    self._looking = False
            disk = self.disk
            with buf.lock:
                if not window.active:  # overflow to disk again once it works and has room
                    full = disk.room() <= 0 and not disk.refusing
                    window.usable = not disk.refusing and not full
                    buf.spill_full_locked(full)
                self._place_locked(buf)
        except Exception as exc:  # a bug of ours must not stop the worker
            self.log.error("spill-bug", "spill: unexpected error, going on in memory: %r", exc)

    def cover(self, buf: Buffer, items: list[Any]) -> None:
        """Events just taken from the buffer (``Held``, serialized) that no write took yet:
        written now, before any transport sees them.  Never raises: the batch was taken, and
        goes on to the transport whatever the disk does."""
        if self._closed or not items:
            return
        try:
            self._cover(buf, items)
        except Exception as exc:  # a bug of ours must not orphan the batch (tick's rule too)
            self.log.error("spill-bug", "spill: unexpected error, going on in memory: %r", exc)

    def _cover(self, buf: Buffer, items: list[Any]) -> None:
        journal = buf.holdings.journal
        if journal is not None and any(entry[2] != DELIVERED for entry in list(journal.entries)):
            # Losses first: else a successor could deliver an event counted lost here.
            self._settle(buf)
            self.disk.write_settlements()
        foreign, upto = self.window.foreign, self.written_upto
        fresh = [(item.seq, item.event) for item in items if item.seq >= upto and item.seq not in foreign]
        self.written_upto = max(upto, items[-1].seq + 1)
        if fresh:
            self._append(buf, fresh)

    def _append(self, buf: Buffer, events: list[tuple[int, SerializedEvent]]) -> int:
        """This owner's events to disk (its directory made again first, if it vanished)."""
        if not events:
            return 0
        if self.home.vanished() and not self._start_over(buf):
            self.disk.refused(events[0][0], events[-1][0] + 1, len(events))
            return 0
        return self.disk.append(events, buf.lock, lambda: self._settle(buf))

    # -- writing and settling ---------------------------------------------------------------

    def _write(self, buf: Buffer, slicer: Slicer | None) -> None:
        """Write this owner's events not written yet, in the order of their numbers: the queued
        ones (serialized in place in the buffer) as the disk has room, then the overflow,
        released from memory once on disk.  A queued event that cannot be serialized, or is
        larger than the whole spill, stays in memory only; an overflow one is a tombstone."""
        room, window, held = self.disk.room(), self.window, buf.holdings
        with buf.lock:
            numbers, queue, foreign = held.numbers, held.queue, window.foreign
            n = len(queue)
            end = numbers.end(n)
            start = max(self.written_upto, numbers.head)
            todo = []
            if foreign.outside(start, end):  # (events read back from the stretch are on disk)
                index = numbers.index_from(start, n)
                todo = [(numbers.seq_at(i), queue[i]) for i in range(index, n)]
                todo = [(seq, event) for seq, event in todo if seq not in foreign]
            over = [] if buf.finalized else list(window.events)
            first = held.next_seq - len(over)
        most = room // HEADER + 1 if room > 0 else 0
        checkpoint = None
        if slicer is not None:
            slicer.begin()
            checkpoint = slicer.checkpoint
        done = [(seq, e, ser) for seq, e, ser in serialize_held(todo[:most], checkpoint) if ser is not None]
        batch = [(seq, ser) for seq, _, ser in done if self.disk.holds(ser)]
        if len(batch) < len(done):
            self.disk.not_spilled["spill_full"] += len(done) - len(batch)
        if len(todo) > most:
            over = []  # (the overflow waits for the queued events below it)
        overflow = [
            (seq, window.writable(ser, self.disk))
            for seq, _, ser in serialize_held(list(enumerate(over, first)), checkpoint)
        ]
        wrote = self._append(buf, batch + overflow)
        with buf.lock:
            buf.serialized_in_place_locked(done)
            if over:
                window.released_locked(buf, first, max(0, wrote - len(batch)), len(over), self.disk)
        refused = batch[wrote][0] if wrote < len(batch) else todo[most][0] if len(todo) > most else None
        if refused is not None:
            self.disk.refused(refused, end)
        self.written_upto = end if refused is None else refused

    def _settle(self, buf: Buffer) -> None:
        """What the buffer settled since the last look, by the stream each event is in: out of
        the live sets, and to be written down."""
        with buf.lock:
            entries = buf.holdings.journal.take() if buf.holdings.journal is not None else []
            if not entries:
                return
            foreign, owner = self.window.foreign, self.home.owner
            by: dict[tuple[str, str], Ranges] = {}
            for first, end, outcome in entries:
                for a, b in foreign.outside(first, end):
                    by.setdefault((owner, outcome), Ranges()).add(a, b)
                for a, b in foreign.clip(first, end):
                    for stream, x, y in self.window.origins(a, b):
                        by.setdefault((stream, outcome), Ranges()).add(x, y)
            self.disk.settled(by)

    def _start_over(self, buf: Buffer) -> bool:
        """This owner's directory was removed (or replaced) under it: the stretch is counted lost,
        once, and a new directory made (tried again ``RETRY_AFTER`` later).  Returns whether
        there is one to write to."""
        if time.monotonic() < self._retry_home_at:
            return False
        if self.home.lock_fd >= 0:  # (once per directory lost: its lock is let go of here)
            self.home.release()
            self.disk.drop_all(keep=[self.directory])  # (its directory too, if it is still there)
            with buf.lock:
                lost = self.window.lose_disk_locked(buf)
                if buf.holdings.journal is not None:
                    buf.holdings.journal.take()  # (about files that are gone)
            never_silent(
                logging.WARNING,
                "spill: this outbox's files in %s were removed under it: %d event(s) only on disk are "
                "lost (counted spill_lost); the rest are written again once it can make a new one",
                self.directory,
                lost,
            )
        try:
            home = Home(self.directory)
        except ConfigError as exc:  # (counted by errno, as a failed write: failed_enotdir, ...)
            self.disk.failures[errno.errorcode.get(getattr(exc.__cause__, "errno", None) or 0, "EOTHER")] += 1
            self._retry_home_at = time.monotonic() + RETRY_AFTER
            with buf.lock:
                self.window.usable = False
            return False
        with buf.lock:
            self._begin(home)
            self.written_upto = buf.holdings.head_seq
        return True

    # -- the end ------------------------------------------------------------------------------

    def close(self, buf: Buffer) -> int:
        """The worker is done: write the last events and settlements, let go of the files.  Returns
        how many of the events still held are on disk (counted ``spilled_at_close``)."""
        if self._closed:
            return 0
        if self.home.vanished():  # (its files gone: what is held is written again, if it can be)
            self._start_over(buf)
        self.tick(buf, None, time.monotonic(), force=True)
        self._settle(buf)
        disk = self.disk
        disk.write_settlements()
        self._closed = True
        self.window.close()
        disk.rotate()
        on_disk = self.on_disk()
        if lost := disk.unsettled_events(losses=True):
            # Losses not written down: a successor would deliver them.  Nothing is handed on.
            self.log.error(
                "spill-unsettled",
                "spill: the last settlements could not be written to %s: its files are deleted and "
                "the events held counted dropped_shutdown",
                self.directory,
            )
            on_disk = 0
            disk.drop_all(spare={path for run in self.adoption.pending for path in run.paths})
        left = self.left()
        if any(left.values()):
            never_silent(
                logging.WARNING,
                "spill: %d event(s) of processes that are gone were not taken in by the close's "
                "deadline, and %d such process(es)' files could not be taken over: left in %s",
                left["events"],
                left["owners"],
                self.directory,
            )
        if not (disk.streams.live() or disk.streams.damage["unreadable_files"]):
            disk.drop_all(keep=[self.directory])  # (this owner's directory too)
        if not lost and disk.streams.files:  # (files that stay: a successor reads them)
            disk.tell_unsettled_deliveries()
        self.home.release()
        return on_disk

    def left(self) -> dict[str, int]:
        """Adopted events not taken in yet, and dead owners that could not be taken over."""
        return self.adoption.left()

    def on_disk(self, journal: list[list[Any]] | None = None) -> int:
        """Of the events held, how many are live on disk, less those settled in ``journal`` (a
        close reported without the worker, under the lock)."""
        live = self.disk.streams.live() - self.adoption.remaining()
        own, foreign = self.disk.own.live, self.window.foreign
        for first, end, _ in journal or []:
            live -= sum(own.count(a, b) for a, b in foreign.outside(first, end))
            live -= foreign.count(first, end)
        return max(0, live)

    def for_child(self) -> Spill:
        """In a forked child: let go of the parent's files and start the child's own spill."""
        self.window.close()
        for fd in (self.home.lock_fd, self.home.marker_fd, self.disk.fd):
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

    def stats(self) -> dict[str, float]:
        """What ``Stats.spill`` shows (read without the lock: maybe a tick old)."""
        disk, window, streams = self.disk, self.window, self.disk.streams
        return {
            "spilled_events": streams.live(),
            "spilled_bytes": sum(seg.size for seg in list(streams.files)),
            "segments": len(streams.files),
            "written": disk.written,
            "recovered": self.recovered,
            "recovering": window.adopted() + self.adoption.remaining(),
            "owners_adopted": self.adoption.owners_adopted,
            "owners_left": self.adoption.owners_left(),
            "not_spilled_full": disk.not_spilled.get("spill_full", 0),
            "not_spilled_failed": disk.not_spilled.get("spill_failed", 0),
            **{f"failed_{name.lower()}": n for name, n in dict(disk.failures).items()},
            "overflow_events": len(window.events),
            "stretch_events": window.disk,
            **streams.damage,
            "lost_records": window.lost,
            "invalid_bodies": window.invalid,
            "oldest_age": disk.oldest_age(),
        }
