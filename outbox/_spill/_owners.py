"""Owners: who holds which files of a spill directory, and the hand-over of a dead one's.

Each outbox (each process) is an *owner* with a directory of its own in the spill directory,
named by its id (the time it started, its pid, a random part: ``18f0c...-4d2-9a1b2c3d``), holding
a ``lock`` file it keeps an ``flock`` on for its whole life (the kernel lets go of it however the
process dies).  The directory is made under a temporary name (``.tmp-ID``) with its lock taken,
then renamed: no scanner ever sees an owner without its lock held.

Adoption is one ``rename``: a dead owner's directory (one whose lock can be taken) is moved, whole,
into the adopter's, where it is a subdirectory (and any owners *it* had adopted, subdirectories of
it).  A rename is atomic, so a crash at any point leaves the files either with the dead owner
(adoptable) or with the adopter (adoptable with it, once the adopter dies): never both, never
neither.  Exactly one process adopts a dead owner: the one that holds its lock while renaming.

Only what looks like ours is touched: a directory named like an owner id, holding a ``lock`` file
that begins with ``LOCK_TEXT``.  Anything else in the spill directory is left alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import time

from .._errors import ConfigError

__all__ = ["LOCK", "LOCK_TEXT", "Home", "dead_owners", "is_owner", "new_owner_id"]

LOCK = "lock"
LOCK_TEXT = b"lineage-outbox spill owner 1\n"
_OWNER = re.compile(r"^[0-9a-f]{16}-[0-9a-f]{1,8}-[0-9a-f]{8}$")


def new_owner_id() -> str:
    """An id that sorts by the time the owner started."""
    return f"{time.time_ns():016x}-{os.getpid() & 0xFFFFFFFF:x}-{secrets.token_hex(4)}"


def is_owner(name: str) -> bool:
    return bool(_OWNER.match(name))


def _holds_our_lock(path: str) -> bool:
    try:
        with open(os.path.join(path, LOCK), "rb") as file:
            return file.read(len(LOCK_TEXT)) == LOCK_TEXT
    except OSError:
        return False


class Home:
    """This owner's directory in ``root`` (made, with its lock held).

    Raises:
        ConfigError: ``root`` cannot be made, is not a directory, or is not writable.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.owner = new_owner_id()
        self.path = os.path.join(root, self.owner)
        try:
            os.makedirs(root, exist_ok=True)
            if not os.path.isdir(root):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", root)
            tmp = os.path.join(root, f".tmp-{self.owner}")
            os.mkdir(tmp)
            fd = os.open(os.path.join(tmp, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.write(fd, LOCK_TEXT)
                os.rename(tmp, self.path)
            except BaseException:
                os.close(fd)
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        except OSError as exc:
            raise ConfigError(
                f"spill_dir={root!r} is not usable: {exc.strerror or exc}; pass a writable "
                "directory on local disk (it is made if missing)"
            ) from None
        self.lock_fd = fd
        st = os.stat(self.path)
        self.identity = (st.st_dev, st.st_ino)

    def vanished(self) -> bool:
        """Whether this owner's directory or lock was removed (or replaced) under it."""
        try:
            if os.fstat(self.lock_fd).st_nlink == 0:
                return True
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.identity

    def release(self) -> None:
        """Let go of the lock (a successor may adopt what is left)."""
        with contextlib.suppress(OSError):
            os.close(self.lock_fd)
        self.lock_fd = -1

    def remove(self) -> None:
        """Nothing is left: the directory goes (only if it holds nothing but the lock)."""
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.path, LOCK))
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


def dead_owners(root: str, me: str) -> list[tuple[str, int]]:
    """The owners of ``root`` that are gone: (name, the fd of their lock, which we now hold),
    oldest first.  An owner whose lock another process holds is alive (or being adopted)."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = []
    for name in names:
        if name == me or not is_owner(name):
            continue
        path = os.path.join(root, name)
        if not _holds_our_lock(path):
            continue
        try:
            fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # alive, or being adopted
            continue
        found.append((name, fd))
    return found
