"""What this owner holds on disk: its files and, for each stream (the owner that wrote the events:
this one, or one it adopted), which numbers are *live* (an event record on disk, not settled) and
which are settled.  Recovery is a replay: every file read, events less settlements is what lives.

A file goes once none of its events is live; but its settlements may still be the only word on
events of other files, so before such a file goes a *checkpoint* (every stream's settled numbers,
restated) is written to a segment that stays.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from ._format import Event, NotOurs, SegmentReader, Settle, encode_settle
from ._owners import prune
from ._ranges import Ranges

__all__ = ["SegFile", "Stream", "Streams"]


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
    """The numbers of one stream: live (on disk, unsettled) and settled."""

    live: Ranges = field(default_factory=Ranges)
    settled: Ranges = field(default_factory=Ranges)

    def settle(self, first: int, end: int) -> None:
        self.settled.add(first, end)
        self.live.remove(first, end)

    def written(self, first: int, end: int) -> None:
        """Event records ``[first, end)`` are on disk: live, unless settled meanwhile."""
        for a, b in self.settled.outside(first, end):
            self.live.add(a, b)


class Streams:
    """Every stream and file this owner holds; ``home`` is its own stream (never forgotten).
    ``damage`` counts what replays could not use: ``corrupt_records``, ``torn_records``,
    ``unreadable_files``, ``foreign_files`` (no header of ours: never read further)."""

    def __init__(self, home: str = "") -> None:
        self.home = home
        self.streams: dict[str, Stream] = {}
        self.files: list[SegFile] = []
        self.damage: Counter[str] = Counter(
            corrupt_records=0, torn_records=0, unreadable_files=0, foreign_files=0
        )
        #: The file holding the last checkpoint (never deleted while anything is live).
        self.checkpoint_file: SegFile | None = None

    def stream(self, name: str) -> Stream:
        return self.streams.setdefault(name, Stream())

    def live(self) -> int:
        """Events on disk not settled, of every stream."""
        return sum(len(stream.live) for stream in list(self.streams.values()))

    def replay(self, paths: list[str], warn: Callable[..., None]) -> dict[str, Ranges]:
        """Read ``paths`` (an adopted owner's): their files join this owner's; returns the live
        numbers of each stream found (what is to be handed on).  Each damage is ``warn``-ed."""
        present: dict[str, Ranges] = {}
        settled: dict[str, Ranges] = {}

        def damaged(kind: str, what: str, *args: object) -> None:
            self.damage[kind] += 1
            warn("spill: " + what + "; skipped", *args)

        for path in paths:
            reader, seg = SegmentReader(path, bodies=False), None
            try:
                named = reader.open()
                if named != os.path.basename(os.path.dirname(path)):
                    raise NotOurs(path)  # (an owner's segments name it: a copy, or forged)
                seg = SegFile(path, named, os.fstat(reader.fd).st_size)
                numbers = seg.numbers
                for record in reader.records():
                    if record.__class__ is Event:
                        numbers.add(record.seq, record.seq + 1)
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
        """The files none of whose events is live (not the last checkpoint's while any is)."""
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
        """Settlement records restating what is settled of every stream with live events, or
        with event records in a file that may stay (the checkpoint's own, say: their
        settlements may be in the files about to go)."""
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
        """Delete ``dead`` files, and the adopted owners' directories they leave empty (never
        one of ``keep``: this owner's own, while it lives)."""
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
        for name in [name for name, stream in self.streams.items() if not stream.live and name not in kept]:
            del self.streams[name]
        prune(dirs, {os.path.dirname(seg.path) for seg in self.files} | set(keep))
