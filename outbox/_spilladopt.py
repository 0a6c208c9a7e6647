"""A dead owner's events, read back for adoption a bounded amount at a time (see ``_spill``).

Two passes over its segments, each a record at a time (``_spillread``): the first notes the
void records (the owner's newest events taken back, their sequence numbers given again: rare,
and only their positions are kept) and warns once per torn or corrupt stretch; the second hands
out the events above the checkpoint that no later void took back, each once (a record written
twice after a failed write counts once), in order, as :meth:`Recovered.fill` asks: memory holds
only what the buffer has room for, however large the dead owner's spill.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from ._log import logger
from ._serde import SerializedEvent
from ._spillfmt import EVENT
from ._spillread import StretchReader

__all__ = ["Recovered"]


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
        nbytes = sum(len(event.body) for _, event in ready)
        while not self._done and len(ready) < max_events and (not ready or nbytes < max_bytes):
            item = next(self._source, None)
            if item is None:
                self._done = True
                break
            ready.append(item)
            nbytes += len(item[1].body)
            self.estimate = max(0, self.estimate - 1)

    def __bool__(self) -> bool:
        return bool(self.ready) or not self._done

    def __len__(self) -> int:
        return len(self.ready) + (0 if self._done else self.estimate)
