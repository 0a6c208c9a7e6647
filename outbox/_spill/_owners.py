"""Owners: who holds which files of a spill directory, and the hand-over of a dead one's.

An owner keeps an ``flock`` on its directory (named by its id: ``18f0c...-4d2-9a1b2c3d``) for its
life (the kernel lets go however the process dies), and one on the ``lock`` file in it, which says
the directory is ours (and keeps releases that lock only that file off a live owner); it is made
as ``.tmp-ID`` with both taken, then renamed, so no scanner sees an owner unlocked.  The lock file
removed or replaced (an ``rm``, a restore) is made again by its live owner; a dead owner's
directory without one is adopted if it holds segments of its name.  Adoption marks a dead
owner's directory with the order it is handed on (``HANDED``; and the owners it holds, keyed
again before it in the order they are read there), then renames it, whole, into the
adopter's (on a disk too full to make one, to the adopter's name: its lock and files then the
adopter's): atomic, so after a crash the files are with one of them (adoptable), never both,
never neither; only the process holding its lock can adopt it.  The owners it had adopted then
move up beside it, read in the order of their marks wherever they are.
Only what looks ours is touched: a directory named like an owner id whose ``lock`` begins with
``LOCK_TEXT``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import stat
import time
from collections import Counter
from collections.abc import Collection, Generator
from typing import Any

from .._errors import ConfigError
from . import _order
from ._format import Event, NotOurs, SegmentReader
from ._names import (
    HANDED,
    LOCK,
    LOCK_TEXT,
    LOCKS_DIRECTORY,
    RESERVE,
    SCARCE,
    WAS,
    is_owner,
    make_own,
    open_own,
)
from ._order import segment_paths

__all__ = [
    "HANDED",
    "LOCK_TEXT",
    "RESERVE",
    "WAS",
    "Home",
    "dead_owners",
    "inspect_dir",
    "is_owner",
    "prune",
    "prune_all",
]

#: What an owner's directory holds besides its segments and marks.
_OWNERS_OWN = frozenset({LOCK, LOCK + ".new", LOCKS_DIRECTORY, RESERVE})
#: Errors opening an owner's directory that say this process may not (another user's).
REFUSED = frozenset({errno.EACCES, errno.EPERM})
#: Tries to make an owner's directory while what is made is removed under it.
_MAKE_ATTEMPTS = 5


def _probe(root: str, name: str, how: int) -> int | None:
    """If ``name`` is an owner of ours in ``root`` that is gone: its directory's fd, locked
    ``how`` by us now; else None (alive, being adopted, or not ours).  Gone: no one holds the
    directory's lock, nor its lock file's (what a live owner of an earlier release locks).  Ours:
    its lock file begins with ``LOCK_TEXT`` (a FIFO there, on which no open waits, is not); or,
    its lock file removed or damaged, it says it locks its directory (``LOCKS_DIRECTORY``) and
    holds a segment whose header names it.  ``name`` may be one being made (``.tmp-ID``): only
    one ``STALE_AFTER`` old is probed (a younger one's maker may be about to lock it).  Raises
    OSError if this process could not look (``SCARCE``), or may not (``REFUSED``: another
    user's directory, alive or not)."""
    if not is_owner(name.removeprefix(".tmp-")) or (name.startswith(".tmp-") and not _old(name)):
        return None
    path = os.path.join(root, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in SCARCE or exc.errno in REFUSED:
            raise
        return None
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        if _lock_file_free(path, how) if _has_lock_text(path) else _locks_itself(path, name):
            return fd
    except OSError as exc:
        if exc.errno in SCARCE:
            os.close(fd)
            raise
    os.close(fd)
    return None


def _has_lock_text(path: str) -> bool:
    """Whether the owner's directory ``path`` holds a lock file of ours (a regular file, not a
    link, beginning with ``LOCK_TEXT``)."""
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in SCARCE:
            raise
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, len(LOCK_TEXT), 0) == LOCK_TEXT
    except OSError:
        return False
    finally:
        os.close(fd)


def _lock_file_free(path: str, how: int) -> bool:
    """Whether no one holds the lock file's lock (an earlier release's live owner holds only it)."""
    fd = os.open(os.path.join(path, LOCK), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _locks_itself(path: str, name: str) -> bool:
    """A directory of this release's (it locks itself) with no usable lock file: ours if a
    segment names it; a ``.tmp-ID`` never is."""
    return (
        not name.startswith(".tmp-")
        and os.path.isfile(os.path.join(path, LOCKS_DIRECTORY))
        and _names_itself(path, name)
    )


def _old(name: str) -> bool:
    """Whether the ``.tmp-ID`` ``name`` was begun ``STALE_AFTER`` ago or more (``ID`` says when)."""
    try:
        return time.time_ns() - int(name[5:21], 16) >= STALE_AFTER * 1e9
    except ValueError:
        return False


def _names_itself(path: str, name: str) -> bool:
    """Whether the directory ``path`` holds a segment of ours whose header names ``name``."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(path):
            if entry.name.endswith(".seg") and entry.is_file(follow_symlinks=False):
                reader = SegmentReader(entry.path, bodies=False)
                try:
                    if reader.open() == name:
                        return True
                except (OSError, NotOurs):
                    pass
                finally:
                    reader.close()
    return False


def _new_owner() -> str:
    """An owner id, which sorts by the time the owner started."""
    return f"{time.time_ns():016x}-{os.getpid() & 0xFFFFFFFF:x}-{secrets.token_hex(4)}"


class Home:
    """This owner's directory in ``root``, made with its lock held.  Raises ConfigError if
    ``root`` cannot be made, is not a directory, or is not writable."""

    def __init__(self, root: str) -> None:
        self.root, self.owner = root, _new_owner()
        self.path = os.path.join(root, self.owner)
        #: The lock file's fd, locked for this owner's life (-1: none could be made).
        self.marker_fd = -1
        #: (name, segments, directories that could not be listed) of the dead owner whose
        #: directory this one took over, to replay.
        self.taken: tuple[str, list[str], list[OSError]] | None = None
        try:
            if what := _not_a_directory(root):  # (makedirs would say "File exists")
                raise NotADirectoryError(errno.ENOTDIR, f"it is {what}, not a directory", root)
            try:
                fd = self._make_in_root()
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # A disk full of dead owners' spill: their reserves are of no use to them now (a
                # successor settles in its own files) and make room for this owner's lock; with
                # none, the oldest dead owner's directory becomes this owner's.
                fd = self._make() if _free_reserves(root, self.owner) else self._take_over(exc)
        except OSError as exc:
            raise ConfigError(
                f"spill_dir={root!r} is not usable: {exc.strerror or exc}; pass a writable "
                "directory on local disk (it is made if missing; OUTBOX_SPILL_DIR)"
            ) from exc
        #: The directory's fd, locked for this owner's life.
        self.lock_fd = fd
        self.identity: os.stat_result | None = None
        with contextlib.suppress(OSError):  # (removed the instant it was made: vanished, noticed
            self.identity = os.stat(self.path)  # at the first write, as any removal is)
        self._keep_marker()

    @classmethod
    def unmade(cls, root: str) -> Home:
        """An owner whose directory could not be made (a full disk): vanished from the start."""
        home = cls.__new__(cls)
        home.root, home.owner, home.lock_fd, home.identity, home.taken = root, _new_owner(), -1, None, None
        home.path, home.marker_fd = os.path.join(root, home.owner), -1
        return home

    def _make_in_root(self) -> int:
        """The root made if missing, then :meth:`_make`; both again if what was made is removed
        as it is made (an operator's ``rm -rf`` racing the start), ``_MAKE_ATTEMPTS`` times."""
        for _ in range(_MAKE_ATTEMPTS - 1):
            # (FileExistsError: makedirs found the root, then not a directory there: removed)
            with contextlib.suppress(FileNotFoundError, FileExistsError):
                os.makedirs(self.root, exist_ok=True)
                return self._make()
        os.makedirs(self.root, exist_ok=True)
        return self._make()

    def _make(self) -> int:
        """Make the directory under a temporary name with its locks taken, then rename it.
        Returns the directory's fd (``marker_fd``: the lock file's); nothing is left behind
        if it fails."""
        tmp = os.path.join(self.root, f".tmp-{self.owner}")
        os.mkdir(tmp)
        fd = marker = -1
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            marker = open_own(os.path.join(tmp, LOCK), os.O_RDWR | os.O_CREAT | os.O_EXCL)
            fcntl.flock(marker, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(marker, LOCK_TEXT)
            os.close(open_own(os.path.join(tmp, LOCKS_DIRECTORY)))
            os.rename(tmp, self.path)
        except BaseException:
            for opened in (fd, marker):
                if opened >= 0:
                    os.close(opened)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.marker_fd = marker
        return fd

    def _keep_marker(self) -> None:
        """The lock file: this owner's (locked by it), or made again if it was removed or
        replaced (the one there taken if it is ours and no one's, as on a full disk, a directory
        taken over; else a new one renamed in place).  Best effort: the directory's lock is the
        owner's, whatever happens to the file."""
        path = os.path.join(self.path, LOCK)
        with contextlib.suppress(OSError):
            if os.path.samestat(os.lstat(path), os.fstat(self.marker_fd)) and _has_lock_text(self.path):
                return
        with contextlib.suppress(OSError):  # (a directory taken over from an earlier release)
            os.close(make_own(os.path.join(self.path, LOCKS_DIRECTORY)))
        fd = -1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
            if not stat.S_ISREG(os.fstat(fd).st_mode) or os.pread(fd, len(LOCK_TEXT), 0) != LOCK_TEXT:
                raise FileNotFoundError
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if fd >= 0:
                os.close(fd)
            fd = _new_marker(self.path)
        if self.marker_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.marker_fd)
        self.marker_fd = fd

    def _take_over(self, full: OSError) -> int:
        """On a disk too full to make a directory: rename the oldest dead owner's to this owner's
        name (no block needed on any filesystem), its lock (locked by us) this owner's lock, its
        files this owner's to replay (``taken``), marked ``WAS + name`` for whoever reads them.
        Raises ``full`` if there is none, or that fails."""
        found = dead_owners(self.root, self.owner)
        name, fd = next(found, ("", -1))
        found.close()
        if fd < 0:
            raise full
        source = os.path.join(self.root, name)
        try:  # (the mark first: after a crash it is harmless in a directory of the same name)
            os.close(make_own(os.path.join(source, WAS + name)))
            os.rename(source, self.path)
        except OSError:
            os.close(fd)
            raise full from None
        unreachable: list[OSError] = []
        try:  # (strict: files left out of the list would never be replayed, nor counted)
            self.taken = (name, _order.segment_paths(self.path, True, unreachable), unreachable)
        except OSError:
            os.close(fd)  # (the directory, of this owner's name now, is a dead owner's again)
            raise full from None
        return fd

    def vanished(self) -> bool:
        """Whether this owner's directory was removed (or replaced) under it.  Its lock file
        alone removed or replaced is made again: no successor takes a live owner's directory."""
        try:
            if os.fstat(self.lock_fd).st_nlink == 0:
                return True
            if self.identity is None or not os.path.samestat(os.stat(self.path), self.identity):
                return True
        except OSError:
            return True
        self._keep_marker()
        return False

    def release(self) -> None:
        """Let go of the locks (a successor may adopt what is left)."""
        for fd in (self.lock_fd, self.marker_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.lock_fd = self.marker_fd = -1


def _new_marker(directory: str) -> int:
    """A lock file made in ``directory``, locked, written and renamed in place of what is there;
    its fd (-1 if that fails: a full or failing disk)."""
    made = os.path.join(directory, LOCK + ".new")
    fd = -1
    try:
        with contextlib.suppress(FileNotFoundError):  # (one a crash left: made anew, whatever it is)
            os.unlink(made)
        fd = open_own(made, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.write(fd, LOCK_TEXT) != len(LOCK_TEXT):
            raise OSError(errno.ENOSPC, "cut short")
        os.rename(made, os.path.join(directory, LOCK))
        return fd
    except OSError:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(made)
        return -1


def _not_a_directory(path: str) -> str | None:
    """What is at ``path`` if it is there and not a directory (nor a link to one): one look
    (a directory removed between two looks is missing, made again, not "a file")."""
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            return None
    except FileNotFoundError:  # (missing, or a link to nothing: a volume not mounted?)
        return "a broken symbolic link" if os.path.islink(path) else None
    except OSError:
        return None
    return "a file"


def prune_all(path: str, keep: Collection[str]) -> None:
    """:func:`prune` ``path`` and the owners' directories in it (adopted, files or not)."""
    dirs = set()
    for root, names, _ in os.walk(path):
        names[:] = [name for name in names if is_owner(name)]  # (no one else's)
        dirs.add(root)
    prune(dirs, keep)


def prune(dirs: set[str], keep: Collection[str]) -> None:
    """Remove the owner directories ``dirs`` that hold nothing but their lock and reserve, then
    their parents the same way, deepest first; never one of ``keep`` nor one above it."""
    while dirs:
        path = max(dirs, key=len)
        dirs.discard(path)
        if any(kept == path or kept.startswith(path + os.sep) for kept in keep):
            continue
        try:  # (a directory that holds more keeps its lock and marks: its files are read by them)
            names = os.listdir(path)
        except OSError:
            continue
        if any(name not in _OWNERS_OWN and not name.startswith((WAS, HANDED)) for name in names):
            continue
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(path, name))
        with contextlib.suppress(OSError):
            os.rmdir(path)
            dirs.add(os.path.dirname(path))


def dead_owners(
    root: str, me: str, unseen: set[str] | None = None, refused: set[str] | None = None
) -> Generator[tuple[str, int], None, None]:
    """The owners of ``root`` that are gone, oldest first, one at a time: (name, the fd of their
    lock, which we now hold and the caller closes before the next; thousands of dead owners never
    hold thousands of descriptors).  An owner whose lock another process holds is alive (or being
    adopted); one this process could not look at (out of descriptors) is added to ``unseen``
    (``root`` itself, if it could not be listed), and one it may not open to ``refused``."""
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        if unseen is not None and exc.errno in SCARCE:
            unseen.add(root)
        return
    for name in names:
        if name == me:
            continue
        try:
            fd = _probe(root, name, fcntl.LOCK_EX)
        except OSError as exc:
            if name.startswith(".tmp-"):
                continue
            if exc.errno in REFUSED:
                if refused is not None:
                    refused.add(name)
            elif unseen is not None:
                unseen.add(name)
            continue
        if name.startswith(".tmp-"):  # (one a process died making: its lock alone, or not yet written)
            if fd is not None or _stale(root, name):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            if fd is not None:
                os.close(fd)
        elif fd is not None:
            yield name, fd


#: Seconds after which a ``.tmp-ID`` whose lock was never written is no longer being made.
STALE_AFTER = 60.0


def _stale(root: str, name: str) -> bool:
    """Whether ``.tmp-ID`` was begun ``STALE_AFTER`` ago or more (``ID`` says when) and no one
    holds its directory's lock nor its lock file's (an earlier release's maker locks the file
    only): its maker died before its lock file's first line was written."""
    if not _old(name):
        return False
    for path, flags in (
        (os.path.join(root, name), os.O_DIRECTORY | os.O_NOFOLLOW),
        (os.path.join(root, name, LOCK), 0),
    ):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | flags)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        finally:
            os.close(fd)
    return True


def _free_reserves(root: str, me: str) -> int:
    """Delete the reserves of the dead owners of ``root`` (each under its lock, so none is being
    adopted meanwhile); returns how many of them freed room."""
    freed = 0
    for name, fd in dead_owners(root, me):
        path = os.path.join(root, name, RESERVE)
        try:  # (a link, or a file linked elsewhere, frees nothing)
            found = os.lstat(path)
            os.unlink(path)
            freed += stat.S_ISREG(found.st_mode) and found.st_nlink <= 1 and found.st_blocks > 0
        except OSError:
            pass
        finally:
            os.close(fd)
    return freed


def inspect_dir(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``outbox check`` shows of a spill directory, taking nothing over: whether it is
    writable, its owners, segments, bytes, oldest event's age, and entries not ours."""
    path = os.fspath(directory)
    state: dict[str, Any] = {"path": path, "exists": os.path.isdir(path)}
    if what := _not_a_directory(path):  # (an outbox refuses it)
        return {**state, "writable": False, "not_a_directory": what}
    if not state["exists"]:
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):  # (an outbox refuses it: "Not a directory")
            return {**state, "writable": False, "not_a_directory": f"under a file ({parent})"}
        state["writable"] = os.access(parent, os.W_OK | os.X_OK)
        return state
    state["writable"] = os.access(path, os.W_OK | os.X_OK)
    counts = Counter(owners_alive=0, owners_gone=0, segments=0, bytes=0, foreign=0)
    oldest = []
    for name in sorted(os.listdir(path)):
        if name.startswith("."):
            continue
        if not is_owner(name) or not os.path.isdir(os.path.join(path, name)):
            counts["foreign"] += 1
            continue
        try:
            fd = _probe(path, name, fcntl.LOCK_SH)
        except OSError:  # (out of descriptors: neither)
            counts["owners_unknown"] += 1
            fd = None
        else:
            counts["owners_gone" if fd is not None else "owners_alive"] += 1
        if fd is not None:
            os.close(fd)
        for seg in segment_paths(os.path.join(path, name)):
            counts["segments"] += 1
            reader = SegmentReader(seg, bodies=False)  # (an event's time is all it needs)
            with contextlib.suppress(OSError, NotOurs):
                reader.open()
                counts["bytes"] += os.fstat(reader.fd).st_size
                first = next((record for record in reader.records() if isinstance(record, Event)), None)
                oldest += [first.at] if first is not None else []
            reader.close()
    state.update(counts, oldest_event_age=max(0.0, time.time() - min(oldest)) if oldest else None)
    return state
