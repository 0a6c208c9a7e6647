"""What looks ours in a spill directory: the names of owners' directories and of the files an
owner keeps beside its segments, and the errors that say this process could not look."""

from __future__ import annotations

import errno
import re

__all__ = ["HANDED", "LOCK", "LOCKS_DIRECTORY", "LOCK_TEXT", "RESERVE", "SCARCE", "WAS", "is_owner"]

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
