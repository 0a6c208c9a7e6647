"""Adoption: the dead owners this one takes over, each handed over in order (``_owners``), their
files replayed (``_streams``); what is live waits here (``pending``) to join the stretch, and what
could not be taken (``left``) is named at close."""

from __future__ import annotations

import contextlib
import errno
import os

from .._observability._log import RateLimitedLog, logger
from ._order import flatten, hand_over, next_key, segment_paths
from ._owners import RESERVE, Home, dead_owners, prune_all
from ._streams import Kept, Run, Streams

__all__ = ["Adoption"]

_LIST_FIXES = {
    errno.ENAMETOOLONG: "nested past PATH_MAX by an earlier release: move the owner directories "
    "nested in it up (mv)",
}


class Adoption:
    """The dead owners of ``directory`` that this owner takes over (see the module's docstring)."""

    def __init__(self, directory: str, log: RateLimitedLog) -> None:
        self.directory = directory
        self.log = log
        #: Adopted runs not yet in the stretch.
        self.pending: list[Run] = []
        #: Dead owners whose directory could not be taken over (or looked at) at the last look.
        self.not_taken: set[str] = set()
        #: Dead owners taken over whose files could not be listed yet (out of descriptors).
        self.unread: list[tuple[str, list[str]]] = []
        #: Dead owners taken over that hold files no path can name (nested past PATH_MAX by an
        #: earlier release): what could be listed was replayed; the rest is named at every close.
        self.unreachable: set[str] = set()
        #: The ``HANDED`` key of the next owner taken over (None: this owner's directory not
        #: looked at yet; it is the only process that writes there).
        self.next_key: int | None = None
        self.owners_adopted = 0
        #: Dead owners in hand: taken (or to be listed again) by the look under way, and neither
        #: left nor pending yet (a close reported meanwhile is not complete).
        self.in_hand = 0
        #: Owners' directories this process may not open, as the last warning named them.
        self.refused: frozenset[str] = frozenset()

    def waiting(self) -> bool:
        """Whether adopted events wait to join the stretch, or files to be listed."""
        return bool(self.pending or self.unread)

    def remaining(self) -> int:
        """Adopted events not in the stretch yet."""
        return sum(run.remaining for run in self.pending)

    def owners_left(self) -> int:
        """Dead owners that could not be taken over, or whose files could not all be read."""
        return len(self.not_taken) + len(self.unread) + len(self.unreachable)

    def left(self) -> dict[str, int]:
        """What a close leaves: adopted events not taken in yet, and :meth:`owners_left` with
        those in hand."""
        return {"events": self.remaining(), "owners": self.owners_left() + self.in_hand}

    def adopt(self, home: Home, streams: Streams, room: int = 0, most: int = 0) -> None:
        """Take over every dead owner's directory into ``home``'s and replay its files into
        ``streams``: what is live waits in ``pending``.  One owner's events that fit ``room``
        bytes and ``most`` events are kept as the replay reads them (its run does not read its
        files again)."""
        try:
            self._look(home, streams, room, most)
        finally:
            self.in_hand = 0

    def _look(self, home: Home, streams: Streams, room: int, most: int) -> None:
        # Each owner is in hand (counted) before it leaves unread or home.taken, and until it is
        # pending, left or gone; the last look's not_taken stays until this one's replaces it
        # (an owner counted twice for a moment at most, never not at all).
        left, refused = set[str](), set[str]()
        if (taken := home.taken) is not None:  # (its directory, taken over on a full disk)
            self.in_hand += 1
            home.taken = None
            name, paths, unreachable = taken
            self._unreachable(name, unreachable)
            room = self._replay(streams, name, paths, room, most)
        self.in_hand = len(self.unread)
        unread, self.unread = self.unread, []
        for name, dirs in unread:  # (adopted, but their files could not be listed then)
            room = self._take_in(home, streams, name, dirs, room, most)
            self.in_hand -= 1
        for name, fd in dead_owners(self.directory, home.owner, left, refused):
            self.in_hand = 1
            if left:  # (an older one is left: the younger wait for it, in order)
                os.close(fd)
                left.add(name)
            elif (handed := self._take(home, name, fd, left)) is not None:
                target, order = handed
                # What it had adopted, beside it, in the order handed on: one level, however
                # many starts an outage sees (not if one could not be keyed: then inside it).
                moved = flatten(target, home.path, order)
                room = self._take_in(home, streams, name, [*moved, target], room, most)
            self.in_hand = 0
        self.not_taken = left
        if refused and refused != self.refused:  # (said again only when they change)
            logger.warning(
                "spill: %d owner directory(ies) in %s may not be opened by this process (another "
                "user's?), e.g. %s: alive or gone, their events are not its to deliver; give it "
                "access to them if their processes are gone",
                len(refused),
                self.directory,
                min(refused),
            )
        self.refused = frozenset(refused)
        if self.not_taken or self.unread:
            self.log.warning(
                "spill-left",
                "spill: %d process(es) in %s could not be looked at or taken over (out of file "
                "descriptors?): tried again at the next look",
                len(self.not_taken) + len(self.unread),
                self.directory,
            )

    def _take(self, home: Home, name: str, fd: int, left: set[str]) -> tuple[str, list[str]] | None:
        """Hand the dead owner ``name`` (``fd``: its lock, held, closed here) over to ``home``:
        marked with its order, then renamed into its directory.  Returns where it is now and
        the owners it holds that are to move up beside it, in order (None: not taken, counted in
        ``left`` unless another process took it first)."""
        source, target = os.path.join(self.directory, name), os.path.join(home.path, name)
        try:
            if self.next_key is None:  # (a directory taken over may hold marked owners)
                self.next_key = next_key(home.path)
            handed = hand_over(source, self.next_key)
            if handed is None:  # (not even by renaming a file it holds: no inode left)
                raise OSError(errno.ENOSPC, "no order mark could be written in it", source)
            os.rename(source, target)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) and not os.path.lexists(source):
                return None  # another process adopted it first
            # (or this owner has no directory to take it into: started on a full disk; or it
            # could not look, out of descriptors)
            left.add(name)
            self.log.warning("spill-adopt", "spill: cannot take over %s in %s: %s", name, self.directory, exc)
            return None
        finally:
            os.close(fd)
        self.next_key = handed[0] + 1
        with contextlib.suppress(OSError):  # (its settlements are this owner's, in its room)
            os.unlink(os.path.join(target, RESERVE))
        return target, handed[1]

    def _take_in(self, home: Home, streams: Streams, name: str, dirs: list[str], room: int, most: int) -> int:
        """Replay the files in ``dirs`` (the dead owner ``name``'s, and those of the owners it had
        adopted), once they can be listed: out of descriptors, they wait for the next look
        (``unread``), as do those taken after one that waits (in the order they were taken).
        Returns the ``room`` left (see :meth:`_replay`)."""
        if self.unread:
            self.unread.append((name, dirs))
            return room
        unreachable: list[OSError] = []
        try:
            paths = [path for directory in dirs for path in segment_paths(directory, True, unreachable)]
        except OSError:
            self.unread.append((name, dirs))
            return room
        self._unreachable(name, unreachable)
        if not paths:  # (nothing to replay: gone at once, with the owners it had adopted)
            for directory in dirs:
                prune_all(directory, [home.path])
        return self._replay(streams, name, paths, room, most)

    def _unreachable(self, name: str, errors: list[OSError]) -> None:
        """The dead owner ``name`` holds directories that could not be listed (``errors``):
        named at every close, and said why."""
        for exc in errors:
            self.unreachable.add(name)
            self.log.warning(
                f"spill-unreachable-{exc.errno}",
                "spill: %s holds a directory this process cannot list (%s: %s): its events are "
                "not delivered, and it is named at every close; %s, then start an outbox on %s",
                name,
                exc.filename,
                exc.strerror or exc,
                _LIST_FIXES.get(exc.errno or 0, "make it readable by this process"),
                self.directory,
            )

    def _replay(self, streams: Streams, name: str, paths: list[str], room: int, most: int) -> int:
        """The files of the dead owner ``name``, adopted: what is live waits to join the stretch.
        Returns the ``room`` left for the next one's events to be kept as they are read."""
        self.owners_adopted += 1
        kept = Kept()
        run = Run(0, paths, streams.replay(paths, logger.warning, kept, room, most), kept=kept)
        if kept:
            run.index, room = len(paths), 0
        if run.remaining:
            logger.warning(
                "spill: adopting %d undelivered event(s) of a process that is gone (%s) from %s",
                run.remaining,
                name,
                self.directory,
            )
            self.pending.append(run)
        return room
