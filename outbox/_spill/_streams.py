"""What this owner holds on disk: its files and, for each *stream* (the owner that wrote the
events: this one, or one it adopted), which numbers are *live* (on disk, not settled) and which
are settled; the replay; checkpoints (every stream's settled numbers restated before a file whose
settlements may be the only word on other files' events goes); and the *runs* that read the
stretch (``_window``) back, each record once, in file order; what a run still holds at its last
file's end is a *gap* (lost).  Memory: one record or a 256 KiB chunk, and what a replay kept.
"""

from __future__ import annotations

import os
import stat
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from .._run._serde import SerializedEvent, weight
from ._format import TOMBSTONES, Event, NotOurs, SegmentReader, Settle, encode_settle
from ._owners import WAS, prune
from ._ranges import Ranges

__all__ = ["Kept", "Read", "Run", "SegFile", "Stream", "Streams"]

#: What a run hands out: the events (None: a gap), and their origins ``[stream, first, count]``.
Read = tuple[list[SerializedEvent | None], list[list[Any]]]
#: Events a replay kept: (their stream, whether their file is vouched for, the record).
Kept = deque[tuple[str, bool, Event]]


@dataclass(slots=True, eq=False)
class SegFile:
    """A segment file: its stream, the numbers of its events, its size, whether it settles."""

    path: str
    stream: str
    size: int = 0
    numbers: Ranges = field(default_factory=Ranges)
    settles: bool = False


@dataclass(slots=True)
class Stream:
    """One stream's numbers: live and settled."""

    live: Ranges = field(default_factory=Ranges)
    settled: Ranges = field(default_factory=Ranges)

    def settle(self, first: int, end: int) -> None:
        self.settled.add(first, end)
        self.live.remove(first, end)

    def written(self, first: int, end: int) -> None:
        """Records ``[first, end)`` are on disk: live, unless settled meanwhile."""
        for a, b in self.settled.outside(first, end):
            self.live.add(a, b)


class Streams:
    """Every stream and file this owner holds; ``home`` is its own stream (never forgotten).
    ``damage`` counts what replays and reads could not use, by kind."""

    def __init__(self, home: str = "") -> None:
        self.home = home
        self.streams: dict[str, Stream] = {}
        self.files: list[SegFile] = []
        self.damage: Counter[str] = Counter(
            corrupt_records=0, torn_records=0, unreadable_files=0, foreign_files=0
        )
        #: The last checkpoint's file (kept while anything is live).
        self.checkpoint_file: SegFile | None = None

    def stream(self, name: str) -> Stream:
        return self.streams.setdefault(name, Stream())

    def live(self) -> int:
        """Events on disk not settled, of every stream."""
        return sum(len(stream.live) for stream in list(self.streams.values()))

    def replay(
        self,
        paths: list[str],
        warn: Callable[..., None],
        kept: Kept | None = None,
        room: int = 0,
        most: int = 0,
    ) -> dict[str, Ranges]:
        """Read ``paths`` (an adopted owner's) into this owner's files; returns each stream's live
        numbers.  Each damage is ``warn``-ed.  Every event is kept in ``kept`` if they weigh
        ``room`` and number ``most`` at most (a run need not read them again), else none."""
        present: dict[str, Ranges] = {}
        settled: dict[str, Ranges] = {}
        kept = kept if room > 0 else None

        def damaged(kind: str, what: str, *args: object) -> None:
            self.damage[kind] += 1
            warn("spill: " + what + "; skipped", *args)

        for path in paths:
            reader, seg = SegmentReader(path, bodies=kept is not None), None
            try:
                if (named := _stream_of(path, reader)) is None:  # (nothing in it: gone with the rest)
                    self.files.append(SegFile(path, os.path.basename(os.path.dirname(path))))
                    continue
                seg = SegFile(path, named, os.fstat(reader.fd).st_size)
                numbers = seg.numbers
                for record in reader.records():
                    if record.__class__ is Event:
                        numbers.add(record.seq, record.seq + 1)
                        if kept is not None:
                            room -= weight(record.event)
                            if room >= 0 and len(kept) < most:
                                kept.append((named, reader.vouched, record))
                            else:
                                kept.clear()
                                kept = None  # (too many: read back from the files)
                    elif record.__class__ is Settle:
                        seg.settles = True
                        for a, b in record.ranges:
                            settled.setdefault(record.stream, Ranges()).add(a, b)
                    else:
                        damaged("corrupt_records", "a damaged record at byte %d of %s", record, path)
                if reader.tail_left():
                    damaged("torn_records", "a record cut short at the end of %s", path)
                self.files.append(seg)
            except NotOurs:
                self.damage["foreign_files"] += 1
            except OSError as exc:
                damaged(
                    "unreadable_files", "%s cannot be read (%s), left where it is", path, exc.strerror or exc
                )
            finally:
                reader.close()
                if seg is not None:  # (what was read before a failure counts too)
                    found = present.setdefault(seg.stream, Ranges())
                    for a, b in seg.numbers:
                        found.add(a, b)
        return self._live(present, settled)

    def _live(self, present: dict[str, Ranges], settled: dict[str, Ranges]) -> dict[str, Ranges]:
        """Live, by stream: events ``present`` less ``settled``."""
        handed: dict[str, Ranges] = {}
        for name, numbers in present.items():
            stream, done, top = self.stream(name), settled.get(name, Ranges()), numbers.last()
            for a, b in numbers:
                for x, y in done.outside(a, b):
                    stream.live.add(x, y)
            # Numbers absent from every file were settled, or never written: not live either way.
            stream.settled.add(0, (top if top is not None else -1) + 1)
            for a, b in stream.live:
                stream.settled.remove(a, b)
            handed[name] = Ranges(stream.live)
        return handed

    def deletable(self) -> list[SegFile]:
        """The files none of whose events is live (not the checkpoint's while any is)."""
        anything = any(stream.live for stream in self.streams.values())
        return [
            seg
            for seg in self.files
            if not any(self.stream(seg.stream).live.clip(a, b) for a, b in seg.numbers)
            and not (seg is self.checkpoint_file and anything)
        ]

    def needs_checkpoint(self, dead: list[SegFile]) -> bool:
        return any(seg.settles for seg in dead) and any(stream.live for stream in self.streams.values())

    def checkpoint(self) -> list[bytes]:
        """Settlement records restating the settled numbers of every stream with live events or
        with event records in a file that may stay (their settlements may be in those that go)."""
        records = []
        on_disk = {seg.stream for seg in self.files if seg.numbers}
        for name, stream in self.streams.items():
            if stream.live or name in on_disk:
                top = max((seg.numbers.last() or 0 for seg in self.files if seg.stream == name), default=0)
                ranges = stream.settled.clip(0, top + 1)
                records += [
                    encode_settle(name, "settled", ranges[i : i + 4096]) for i in range(0, len(ranges), 4096)
                ]
        return records

    def forget(self, dead: list[SegFile], keep: Collection[str]) -> None:
        """Delete ``dead`` files (one that fails stays) and the directories they empty, but ``keep``."""
        gone, dirs = set(), set()
        for seg in dead:
            try:
                os.unlink(seg.path)
            except (FileNotFoundError, NotADirectoryError):
                pass  # (gone with its directory)
            except OSError:
                continue  # (kept: tried again later)
            gone.add(id(seg))
            dirs.add(os.path.dirname(seg.path))
        self.files = [seg for seg in self.files if id(seg) not in gone]
        if id(self.checkpoint_file) in gone:
            self.checkpoint_file = None
        kept = {seg.stream for seg in self.files} | {self.home}
        self.streams = {name: stream for name, stream in self.streams.items() if stream.live or name in kept}
        prune(dirs, {os.path.dirname(seg.path) for seg in self.files} | set(keep))


def _stream_of(path: str, reader: SegmentReader) -> str | None:
    """The stream of the segment ``path``, opened by ``reader``; None if the file is empty (its
    maker died before its header).  Raises NotOurs if it is not ours where it is: neither in its
    owner's directory nor in one taken over from it (marked ``WAS + owner``): a copy, or forged."""
    found = os.lstat(path)
    if not stat.S_ISREG(found.st_mode):  # (a FIFO, a device, a link: not a file we wrote)
        raise NotOurs(path)
    if not found.st_size:
        return None
    named, where = reader.open(), os.path.dirname(path)
    if named != os.path.basename(where) and not os.path.exists(os.path.join(where, WAS + named)):
        raise NotOurs(path)
    return named


@dataclass(slots=True, eq=False)
class Run:
    """Events numbered here from ``first``, read from ``paths``; ``todo``: those not handed out."""

    first: int
    paths: list[str]
    todo: dict[str, Ranges]
    own: bool = False
    index: int = 0
    reader: SegmentReader | None = None
    records: Iterator[tuple[str, bool, Event | Settle | int]] | None = None
    #: Where a damaged record is counted: an own run's files (an adopted one's replay did).
    damage: Counter[str] | None = None
    #: All the events of its files, if the replay kept them (they are not read again).
    kept: Kept = field(default_factory=deque)
    #: The bytes of the event the last read stopped short of, left for the next (0: none).
    wants: int = 0

    @property
    def remaining(self) -> int:
        return sum(len(numbers) for numbers in self.todo.values())

    def extend(self, stream: str, first: int, end: int, path: str) -> None:
        """More of this owner's events, written to ``path``."""
        self.todo.setdefault(stream, Ranges()).add(first, end)
        if not self.paths or self.paths[-1] != path:
            self.paths.append(path)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = self.records = None

    def read(self, want: int, max_bytes: int, first_anyway: bool = True) -> Read:
        """Up to ``want`` events and ``max_bytes`` (the first past them if ``first_anyway``), in
        file order, and their origins; once the last file is read to its end, what is left comes
        as gaps.  A body not a JSON object comes as the ``invalid_event`` tombstone.  Raises
        OSError if the disk fails."""
        events: list[SerializedEvent | None] = []
        origins: list[list[Any]] = []
        last: list[Any] = ["", -2, 0]  # (the origin the next number may extend)
        nbytes = 0
        self.wants = 0
        if self.records is None:
            self.records = self._records()
        for stream, vouched, record in self.records:
            if record.__class__ is Event:
                seq, _, event = record
                numbers = self.todo.get(stream)
                if numbers is not None and seq in numbers:
                    size = weight(event)
                    if (events or not first_anyway) and nbytes + size > max_bytes:
                        self._unread(stream, vouched, record)
                        self.wants = size
                        return events, origins
                    numbers.remove(seq, seq + 1)
                    if not (vouched or event.body[:1] != b"{" or _is_json_object(event.body)):
                        event = TOMBSTONES["invalid_event"]
                    events.append(event)
                    if last[1] + last[2] == seq and last[0] == stream:
                        last[2] += 1
                    else:
                        origins.append(last := [stream, seq, 1])
                    nbytes += size
                    if len(events) >= want or nbytes >= max_bytes:
                        return events, origins
            elif record.__class__ is int and self.damage is not None:
                self.damage["corrupt_records"] += 1
        self.records = None
        # What it still holds is not there (each was written whole before this run had it).
        for stream, numbers in self.todo.items():
            while (gap := numbers.first()) is not None and len(events) < want:
                numbers.remove(gap, gap + 1)
                events.append(None)
                origins.append([stream, gap, 1])
        return events, origins

    def _unread(self, stream: str, vouched: bool, record: Event) -> None:
        """The record just read goes back where it was (not into memory): the next read begins there."""
        if self.reader is None:
            self.kept.appendleft((stream, vouched, record))
        else:
            self.reader.offset = self.reader.start
        self.records = None

    def _records(self) -> Iterator[tuple[str, bool, Event | Settle | int]]:
        """The records left, with their stream and whether their file is vouched for: those the
        replay kept, then the files', to the end of what is written of the last one."""
        while self.kept:
            yield self.kept.popleft()
        while self.index < len(self.paths):
            if self.reader is None:
                reader = SegmentReader(self.paths[self.index])
                try:
                    reader.open()
                except (OSError, NotOurs):
                    self.index += 1
                    continue
                self.reader = reader
            stream, vouched = self.reader.stream, self.reader.vouched
            for record in self.reader.records():
                yield stream, vouched, record
            if self.index >= len(self.paths) - 1:
                return
            self.reader.close()
            self.reader = None
            self.index += 1


def _is_json_object(body: bytes) -> bool:
    try:
        return isinstance(orjson.loads(body), dict)
    except orjson.JSONDecodeError:
        return False
