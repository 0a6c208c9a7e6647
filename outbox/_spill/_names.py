"""What looks ours in a spill directory: the names of owners' directories and of the files an
owner keeps beside its segments, how a file is opened by such a name (:func:`open_own`), and
the errors that say this process could not look."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat

__all__ = [
    "HANDED",
    "LOCK",
    "LOCKS_DIRECTORY",
    "LOCK_TEXT",
    "RESERVE",
    "SCARCE",
    "WAS",
    "is_owner",
    "make_own",
    "open_own",
]

LOCK = "lock"
#: A file of the owner's allocated for its settlements on a full disk (``_disk``).
RESERVE = "reserve"
LOCK_TEXT = b"lineage-outbox spill owner 1\n"
#: ``WAS + ID``: an empty file saying that the directory was owner ID's (taken over on a full
#: disk), whose segments it holds under that name.
WAS = "was-"
#: An empty file an owner makes in its directory: it locks the directory itself (this release
#: on), so that the directory, its lock file removed or damaged, is still adoptable once gone.
#: A directory without it (an earlier release's owner, which locks its lock file only) is not.
LOCKS_DIRECTORY = "locks-directory"
#: ``HANDED + KEY``: an empty file in an adopted owner's directory saying when it was handed on
#: among its adopter's (``KEY``: 16 hex digits, larger than those of the owners the adopter held
#: and of those the adopted one held): owners are read in that order wherever they are moved.
HANDED = "handed-"
_OWNER = re.compile(r"^[0-9a-f]{16}-[0-9a-f]{1,8}-[0-9a-f]{8}$")


def is_owner(name: str) -> bool:
    return bool(_OWNER.match(name))


#: Errors that say nothing of an owner but that this process could not look (out of file
#: descriptors or memory): the owner is neither alive nor gone to it.
SCARCE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOLCK})


def open_own(path: str, flags: int = os.O_WRONLY | os.O_CREAT) -> int:
    """Open (or make) the file of ours named ``path``: never through a link, never waiting on
    a FIFO, and only a regular file no other name links to; its fd.  Whatever stands in a
    spill directory may be anyone's: a mark, a lock file or a reserve opened through a link
    planted there would make, fill or cut a file elsewhere, and a FIFO would hold the open for
    ever.  Raises OSError otherwise (ELOOP, ENXIO, EISDIR; EEXIST for another kind of file)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_nlink > 1:
            raise OSError(errno.EEXIST, "not a file of ours: another kind of file, or linked elsewhere", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


#: What :func:`open_own` raises for something at the name that is not a file of ours.
_NOT_OURS = frozenset({errno.ELOOP, errno.ENXIO, errno.EEXIST, errno.EISDIR})


def make_own(path: str) -> int:
    """:func:`open_own` a name of an owner's own, in a directory this process holds (its own,
    or a dead owner's whose lock it holds): what stands there and is not a file of ours (a
    link, a FIFO, a file linked elsewhere, an empty directory) is removed, and the file made
    anew.  Raises OSError if it still cannot be."""
    try:
        return open_own(path)
    except OSError as exc:
        if exc.errno not in _NOT_OURS:
            raise
        with contextlib.suppress(OSError):  # (a name of its own: what stands there goes, never what it names)
            (os.rmdir if exc.errno == errno.EISDIR else os.unlink)(path)
    return open_own(path)
