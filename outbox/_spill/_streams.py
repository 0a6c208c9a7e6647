"""What this owner holds on disk: its files, and for each stream (the owner that wrote the
events: this one, or one it adopted) which numbers are *live* (an event record on disk, not
settled) and which are settled.  Recovery is a replay: read every file, take the events, take
away what the settlements settle, and what is left is live.

A file may be deleted once none of its events is live, but its settlements may still be the only
word on events of other files: before such a file goes, a *checkpoint* (every stream's settled
numbers, restated) is written to this owner's current segment.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from ._format import Event, Settle, encode_settle
from ._ranges import Ranges
from ._reader import NotOurs, SegmentReader

__all__ = ["Damage", "SegFile", "Stream", "Streams", "segment_paths"]

_SEG = ".seg"


@dataclass(slots=True, eq=False)
class SegFile:
    """One segment file: its stream, the numbers of the events in it, its size, and whether
    it holds settlements."""

    path: str
    stream: str
    size: int = 0
    numbers: Ranges = field(default_factory=Ranges)
    settles: bool = False


@dataclass(slots=True)
class Stream:
    """The numbers of one stream: live (on disk, unsettled) and settled."""

    live: Ranges = field(default_factory=Ranges)
    settled: Ranges = field(default_factory=Ranges)

    def settle(self, first: int, end: int) -> int:
        """Settle ``[first, end)``; returns how many of them were live."""
        self.settled.add(first, end)
        return self.live.remove(first, end)

    def written(self, first: int, end: int) -> None:
        """Event records ``[first, end)`` are on disk: live, unless settled meanwhile."""
        for a, b in _minus(first, end, self.settled):
            self.live.add(a, b)


def _minus(first: int, end: int, ranges: Ranges) -> Iterator[tuple[int, int]]:
    at = first
    for a, b in ranges.clip(first, end):
        if a > at:
            yield at, a
        at = b
    if at < end:
        yield at, end


@dataclass(slots=True)
class Damage:
    """What a replay could not use, by kind (``stats().spill``)."""

    #: Stretches of bytes that were not a sound record (a bad checksum, garbage).
    corrupt_records: int = 0
    #: A record cut short at the end of a file (a crash mid-write).
    torn_records: int = 0
    #: Files that could not be opened or read (permissions, a directory, I/O errors).
    unreadable_files: int = 0
    #: Files that are not segments of ours (no header): left alone.
    foreign_files: int = 0


def segment_paths(directory: str) -> list[str]:
    """The segment files of an owner's directory and, before them, of the owners it adopted
    (its subdirectories, each the same way, by name: oldest first): the order their events
    were first handed on."""
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        return []
    paths: list[str] = []
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                paths.extend(segment_paths(entry.path))
    paths.extend(entry.path for entry in entries if entry.name.endswith(_SEG))
    return paths


class Streams:
    """Every stream and file this owner holds (see the module's docstring); ``home`` is its
    own stream (never forgotten)."""

    def __init__(self, home: str = "") -> None:
        self.home = home
        self.streams: dict[str, Stream] = {}
        self.files: list[SegFile] = []
        self.damage = Damage()
        #: The file holding the last checkpoint (never deleted while anything is live).
        self.checkpoint_file: SegFile | None = None

    def stream(self, name: str) -> Stream:
        stream = self.streams.get(name)
        if stream is None:
            stream = self.streams[name] = Stream()
        return stream

    def live(self) -> int:
        """Events on disk not settled, of every stream."""
        return sum(len(stream.live) for stream in list(self.streams.values()))

    def replay(self, paths: list[str], warn: object) -> dict[str, Ranges]:
        """Read ``paths`` (a dead owner's files, adopted): their files join this owner's, their
        streams' live numbers are computed.  Returns the live numbers of each stream found
        (what is to be handed on).  ``warn(message, *args)`` is told of each damage."""
        present: dict[str, Ranges] = {}
        settled: dict[str, Ranges] = {}
        for path in paths:
            reader = SegmentReader(path)
            try:
                name = reader.open()
            except NotOurs:
                self.damage.foreign_files += 1
                continue
            except OSError as exc:
                self.damage.unreadable_files += 1
                warn("spill: %s cannot be read (%s); left where it is", path, exc.strerror or exc)  # type: ignore[operator]
                continue
            seg = SegFile(path, name)
            try:
                seg.size = os.fstat(reader.fd).st_size
                numbers = present.setdefault(name, Ranges())
                while True:
                    record = reader.next()
                    if record is None:
                        if reader.tail_left():
                            self.damage.torn_records += 1
                            warn("spill: a record cut short at the end of %s was skipped", path)  # type: ignore[operator]
                        break
                    if isinstance(record, int):
                        self.damage.corrupt_records += 1
                        warn("spill: a damaged record at byte %d of %s was skipped", record, path)  # type: ignore[operator]
                    elif isinstance(record, Event):
                        numbers.add(record.seq, record.seq + 1)
                        seg.numbers.add(record.seq, record.seq + 1)
                    elif isinstance(record, Settle):
                        seg.settles = True
                        target = settled.setdefault(record.stream, Ranges())
                        for a, b in record.ranges:
                            target.add(a, b)
            except OSError as exc:
                self.damage.unreadable_files += 1
                warn("spill: reading %s failed (%s); left where it is", path, exc.strerror or exc)  # type: ignore[operator]
                continue
            finally:
                reader.close()
            self.files.append(seg)
        handed: dict[str, Ranges] = {}
        for name, numbers in present.items():
            stream = self.stream(name)
            done = settled.get(name, Ranges())
            top = numbers.last()
            if top is None:
                continue
            for a, b in numbers:
                for x, y in _minus(a, b, done):
                    stream.live.add(x, y)
            # Numbers absent from every file were settled, or never written: either way not
            # live, and said so in a checkpoint.
            stream.settled.add(0, top + 1)
            for a, b in stream.live:
                stream.settled.remove(a, b)
            handed[name] = Ranges(stream.live)
        return handed

    def deletable(self) -> list[SegFile]:
        """The files none of whose events is live."""
        anything_live = any(stream.live for stream in self.streams.values())
        dead = []
        for seg in self.files:
            stream = self.streams.get(seg.stream)
            if stream is not None and any(stream.live.overlaps(a, b) for a, b in seg.numbers):
                continue
            if seg is self.checkpoint_file and anything_live:
                continue
            dead.append(seg)
        return dead

    def needs_checkpoint(self, dead: list[SegFile]) -> bool:
        return any(seg.settles for seg in dead) and any(stream.live for stream in self.streams.values())

    def checkpoint(self) -> list[bytes]:
        """Settlement records restating what is settled of every stream with live events."""
        records = []
        for name, stream in self.streams.items():
            if not stream.live:
                continue
            top = max((seg.numbers.last() or 0 for seg in self.files if seg.stream == name), default=0)
            ranges = stream.settled.clip(0, top + 1)
            for i in range(0, len(ranges), 4096):
                records.append(encode_settle(name, "settled", ranges[i : i + 4096]))
        return records

    def forget(self, dead: list[SegFile], home: str) -> int:
        """Delete ``dead`` files (and the directories of adopted owners left empty, never
        ``home``, this owner's own).  Returns the bytes of this owner's own segments freed."""
        freed = 0
        gone = {id(seg) for seg in dead}
        dirs = set()
        for seg in dead:
            with contextlib.suppress(FileNotFoundError):
                try:
                    os.unlink(seg.path)
                except OSError:
                    gone.discard(id(seg))  # (kept: tried again later)
                    continue
            freed += seg.size if seg.stream == self.home else 0
            dirs.add(os.path.dirname(seg.path))
        self.files = [seg for seg in self.files if id(seg) not in gone]
        if self.checkpoint_file is not None and id(self.checkpoint_file) in gone:
            self.checkpoint_file = None
        held = {os.path.dirname(seg.path) for seg in self.files} | {home}
        kept = {seg.stream for seg in self.files} | {self.home}
        for name in [name for name, stream in self.streams.items() if not stream.live and name not in kept]:
            del self.streams[name]
        _prune(dirs, held)
        return freed


def _prune(dirs: set[str], held: set[str]) -> None:
    """Remove adopted owners' directories that hold no file of ours any more (their lock
    file, then the directory, deepest first, and then their parents the same way; never one
    in ``held``, nor a parent of one)."""
    todo = set(dirs)
    while todo:
        path = max(todo, key=len)
        todo.discard(path)
        if path in held or any(h.startswith(path + os.sep) for h in held):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(path, "lock"))
        try:
            os.rmdir(path)
        except OSError:
            continue
        todo.add(os.path.dirname(path))
