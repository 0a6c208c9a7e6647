"""Adoption: a dead owner's undelivered events, taken over by this owner (see ``_spill``).

:class:`Adopter` owns the adoption: it finds an owner of the spill directory whose lock it can
take (a dead one: the kernel let go of its lock when it died), holds that lock while adopting
(so that exactly one process adopts it), queues the owner's events in this owner's buffer as
room allows, and, once they are all queued here and written to our own segments, deletes the
owner's files, its lock file last.  A close cut short marks what was queued here as settled in
the dead owner's checkpoint, and lets its lock go for the next adopter.

:class:`Recovered` reads a dead owner's events back, a bounded amount at a time.  Two passes
over its segments, each a record at a time (``_spillread``): the first notes the void records
(the owner's newest events taken back, their sequence numbers given again: rare, and only their
positions are kept) and warns once per torn or corrupt stretch; the second hands out the events
above the checkpoint that no later void took back, each once (a record written twice after a
failed write counts once), in order, as :meth:`Recovered.fill` asks: memory holds only what the
buffer has room for, however large the dead owner's spill.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections import deque
from collections.abc import Iterator

from ._buffer import Buffer
from ._log import logger
from ._serde import SerializedEvent, weight
from ._spilldisk import owner_segments, read_checkpoint
from ._spillfmt import EVENT
from ._spillread import StretchReader
from ._window import Window

__all__ = ["Adopter", "Recovered"]

#: What takes the place of a record with no body (see ``_spillstretch._UNREADABLE``).
_UNREADABLE = b"\x00"


def _records(
    paths: list[str], reader_out: list[StretchReader]
) -> Iterator[tuple[int, int, SerializedEvent | None]]:
    """(kind, seq, event) of every sound record of ``paths``, in order."""
    if not paths:
        return
    reader = StretchReader(lambda n: paths[n])
    reader_out.append(reader)
    last = len(paths) - 1
    try:
        while True:
            record = reader._next(last)
            if record is None:
                if reader.tail_left():
                    reader.corrupt.append((paths[reader.seg_no], reader.offset))
                return
            yield record.kind, record.seq, record.event
    finally:
        reader.close()


class Recovered:
    """The events of a dead owner's ``paths`` at or above ``settled``, in order."""

    def __init__(self, paths: list[str], settled: int) -> None:
        self.paths, self.settled = paths, settled
        voids: list[tuple[int, int]] = []
        count = 0
        readers: list[StretchReader] = []
        for index, (kind, seq, _) in enumerate(_records(paths, readers)):
            if kind != EVENT:
                voids.append((index, seq))
            elif seq >= settled:
                count += 1
        for path, offset in readers[0].corrupt if readers else []:
            logger.warning("spill: a torn or corrupt record at byte %d of %s was skipped", offset, path)
        # The least void sequence number from each void on: a record is taken back if a void
        # after it is at or below its number.
        floor: list[int] = []
        least = 1 << 64
        for _, seq in reversed(voids):
            least = min(least, seq)
            floor.append(least)
        floor.reverse()
        self._voids, self._floor = [index for index, _ in voids], floor
        #: About how many events are left (exact without voids and rewrites).
        self.estimate = count
        self.ready: deque[tuple[int, SerializedEvent]] = deque()
        self._source = self._kept()
        self._done = not paths

    def _kept(self) -> Iterator[tuple[int, SerializedEvent]]:
        voids, floor = self._voids, self._floor
        next_void = 0
        last = -1
        for index, (kind, seq, event) in enumerate(_records(self.paths, [])):
            while next_void < len(voids) and voids[next_void] <= index:
                next_void += 1
            if kind != EVENT:
                last = min(last, seq - 1)
                continue
            if seq < self.settled or event is None or seq <= last:
                continue
            if next_void < len(floor) and floor[next_void] <= seq:
                continue  # taken back by a later void
            last = seq
            yield seq, event

    def fill(self, max_events: int, max_bytes: int) -> None:
        """Read ahead until ``max_events`` (or ``max_bytes``, at least one) are ready."""
        ready = self.ready
        nbytes = sum(weight(event) for _, event in ready)
        while not self._done and len(ready) < max_events and (not ready or nbytes < max_bytes):
            item = next(self._source, None)
            if item is None:
                self._done = True
                break
            ready.append(item)
            nbytes += weight(item[1])
            self.estimate = max(0, self.estimate - 1)

    def __bool__(self) -> bool:
        return bool(self.ready) or not self._done

    def __len__(self) -> int:
        return len(self.ready) + (0 if self._done else self.estimate)


class _Adoption:
    """A dead owner being adopted: its lock, held; the last of its events queued here (its
    sequence number there, ``fed``, and here, ``last``)."""

    __slots__ = ("fd", "fed", "last", "owner")

    def __init__(self, owner: str, fd: int) -> None:
        self.owner, self.fd, self.fed, self.last = owner, fd, -1, -1


class Adopter:
    """The adoption of the dead owners of ``directory`` by ``owner`` (see the module's
    docstring), one owner at a time."""

    def __init__(self, directory: str, owner: str) -> None:
        self.directory, self.owner = directory, owner
        #: Events of dead owners read and not yet queued; owners being adopted.
        self.recovering = Recovered([], 0)
        self.adopting: list[_Adoption] = []
        #: Events of dead owners queued here, in all.
        self.recovered = 0

    def _path(self, suffix: str, owner: str) -> str:
        return os.path.join(self.directory, f"{owner}{suffix}")

    def scan(self) -> None:
        """Adopt the first dead owner found, if none is being adopted."""
        if self.adopting or self.recovering:
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
            events = Recovered(
                owner_segments(self.directory, owner), read_checkpoint(self._path(".ckpt", owner))
            )
            self.recovering = events
            self.adopting.append(_Adoption(owner, fd))
            if events:
                logger.warning(
                    "spill: adopting %d undelivered event(s) of a process that is gone (%s) from %s",
                    len(events),
                    owner,
                    self.directory,
                )
            return

    def fill(self, buf: Buffer, window: Window | None) -> None:
        """Read a dead owner's events ahead, as many as the buffer has room for (outside its
        lock: ``emit`` never waits on the disk), so that memory holds at most its bounds."""
        with buf.lock:
            held = len(buf.queue) + buf.in_flight
            held_bytes = buf.held_bytes_locked()
            if window is not None:
                held += len(window.events)
                held_bytes += window.bytes(buf.estimate)
        self.recovering.fill(max(1, buf.max_events - held), max(1, buf.max_bytes - held_bytes))

    def feed_locked(self, buf: Buffer) -> int:
        """Queue recovered events while the buffer has room (caller holds its lock).
        Returns how many were queued."""
        recovered = self.recovering.ready
        n = 0
        fed = -1
        while recovered:
            seq, event = recovered[0]
            size = weight(event) or 1
            # A record with no body: an event its owner could not serialize.  Queued as text
            # that is not JSON, which the intake counts invalid_event (sent as it is, the
            # empty body would reach the backend).
            item = event if event.body else _UNREADABLE
            if buf.closed or not buf.has_room_locked(size) or not buf.put_locked(item, size):
                break
            recovered.popleft()
            fed = seq
            n += 1
        if n:
            self.recovered += n
            if self.adopting:
                adoption = self.adopting[-1]
                adoption.fed, adoption.last = fed, buf.next_seq - 1
        return n

    def finish(self, spilled_upto: int) -> None:
        """A dead owner whose events are all queued here, and written to our own segments
        or settled (below ``spilled_upto``, the first event held here that is not on disk):
        its files go, the lock file last."""
        if self.recovering or not self.adopting:
            return
        adoption = self.adopting[0]
        if adoption.last >= spilled_upto:
            return
        owner = adoption.owner
        for path in (
            *owner_segments(self.directory, owner),
            self._path(".ckpt", owner),
            self._path(".lock", owner),
        ):
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(adoption.fd)
        self.adopting.pop(0)

    def release(self, spilled_upto: int) -> None:
        """Closing with a dead owner's events not all queued: what was queued here (and is in
        our own segments, below ``spilled_upto``) is marked settled in its checkpoint, so that
        the next adopter does not send it again; the rest stays in its files, its lock let go."""
        for adoption in self.adopting:
            if adoption.fed >= 0 and adoption.last < spilled_upto:
                path = self._path(".ckpt", adoption.owner)
                with contextlib.suppress(OSError):
                    with open(path + ".tmp", "w") as f:
                        f.write(f"{adoption.fed + 1}\n")
                    os.replace(path + ".tmp", path)
            with contextlib.suppress(OSError):
                os.close(adoption.fd)
        self.adopting.clear()
