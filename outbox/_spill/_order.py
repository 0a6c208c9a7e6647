"""The order of hand-over: an adopted owner's ``HANDED`` mark, the keys of the owners a dead one
holds (taken again past its adopter's, in the order they are read, so that two adopters' counts
never meet), the moves up beside the adopter, and the order a directory is read in
(:func:`segment_paths`).  The invariant: what one directory holds is read in one order, and a
hand-over, stopped at any write, never changes it."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from ._names import HANDED, RESERVE, SCARCE, is_owner, open_own

__all__ = ["flatten", "hand_over", "next_key", "segment_paths"]


def segment_paths(
    directory: str, strict: bool = False, unreachable: list[OSError] | None = None
) -> list[str]:
    """The segments of an owner's directory, after those of the owners it adopted (its
    subdirectories named as owners, each the same way, in the order they were handed on: by their ``HANDED``
    key; an earlier release's, unmarked, first, by name): the order their events were handed on.
    What cannot be listed is left out; with ``strict``, raises OSError if this process could not
    look (``SCARCE``): a list made without looking would leave events out, or misorder them.
    A directory there that cannot be listed for a reason of its own (its path too long: an
    earlier release's backlog nested past ``PATH_MAX``; no permission) is added, as the error,
    to ``unreachable``: its events are there, and not read."""
    entries: list[os.DirEntry[str]] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError as exc:
        if strict and exc.errno in SCARCE:
            raise
        if unreachable is not None and exc.errno not in (*SCARCE, errno.ENOENT, errno.ENOTDIR):
            unreachable.append(exc)
    nested = []
    for entry in entries:
        with _tolerant(strict):
            if is_owner(entry.name) and entry.is_dir(follow_symlinks=False):  # (no one else's)
                nested.append((_handed(entry.path, strict), entry.name, entry.path))
    paths = [path for *_, owner in sorted(nested) for path in segment_paths(owner, strict, unreachable)]
    return paths + [entry.path for entry in entries if entry.name.endswith(".seg")]


@contextlib.contextmanager
def _tolerant(strict: bool = True) -> Iterator[None]:
    """Go on past an OSError (a file gone meanwhile, a permission), unless ``strict`` and this
    process could not look (``SCARCE``)."""
    try:
        yield
    except OSError as exc:
        if strict and exc.errno in SCARCE:
            raise


def _handed(path: str, strict: bool = True) -> int:
    """The ``HANDED`` key of the owner's directory ``path`` (-1: none, an earlier release's);
    only a file is a mark.  Raises OSError if this process could not look (``strict``)."""
    return _look(path, strict)[0]


def _look(path: str, strict: bool = True) -> tuple[int, frozenset[int], list[str]]:
    """The ``HANDED`` key of the owner's directory ``path`` (see :func:`_handed`), the keys that
    what is named like a mark there and is none takes (a link, a FIFO, a directory: no mark is
    made over it), and the owners' directories in it, in one listing."""
    keys, owners = [-1], []
    blocked: set[int] = set()
    with _tolerant(strict):
        for entry in os.scandir(path):
            if (key := _name_key(entry.name)) is not None:
                if _mark_key(entry) is not None:
                    keys.append(key)
                else:
                    blocked.add(key)
            elif is_owner(entry.name) and entry.is_dir(follow_symlinks=False):
                owners.append(entry.path)
    return max(keys), frozenset(blocked), owners


#: Keys past this are no adopter's (each adds a few to the largest it finds): not marks.
_MOST_KEY = 1 << 62


def _name_key(name: str) -> int | None:
    """The key ``name`` says if it is a mark's: ``HANDED`` and 16 hex digits, below ``_MOST_KEY``."""
    if not (name.startswith(HANDED) and len(name) == len(HANDED) + 16):
        return None
    try:
        key = int(name[len(HANDED) :], 16)
    except ValueError:
        return None
    return key if key < _MOST_KEY else None


def _mark_key(entry: os.DirEntry[str]) -> int | None:
    """The key of ``entry`` if it is a mark: a regular file named as one."""
    key = _name_key(entry.name)
    try:
        return key if key is not None and entry.is_file(follow_symlinks=False) else None
    except OSError:
        return None


def next_key(directory: str) -> int:
    """The ``HANDED`` key past those of every owner ``directory`` holds (0: none).  Raises
    OSError if this process could not look: a key chosen without looking may come too early."""
    return max([0, *(_handed(path) + 1 for path in _look(directory)[2])])


def _nested(owners: list[str], strict: bool = True) -> list[tuple[int, frozenset[int], str]]:
    """The owners nested in the owners' directories ``owners`` (those of one directory) and
    those, at any depth, as (``HANDED`` key, keys taken there, path: see :func:`_look`), in the
    order :func:`segment_paths` reads them there: each one's own nested ones before it (an
    earlier release's, unmarked, first).  Raises OSError if this process could not look
    (``strict``): a rank taken without looking is wrong."""
    found = [(*_look(path, strict), os.path.basename(path), path) for path in owners]
    found.sort(key=lambda item: (item[0], item[3]))
    return [
        owner
        for key, blocked, inner, _, path in found
        for owner in (*_nested(inner, strict), (key, blocked, path))
    ]


def _keys(first: int, blocked: list[frozenset[int]]) -> list[int]:
    """Increasing keys from ``first``, one for each directory, none a key taken in it."""
    keys, key = [], first
    for taken in blocked:
        while key in taken:
            key += 1
        keys.append(key)
        key += 1
    return keys


def _mark(path: str, key: int, marked: bool = True) -> bool:
    """Mark the owner's directory ``path`` with ``key``, larger than its marks (``marked``: it
    may have some): the new mark first, then the old ones removed (after a crash between the two
    it reads as the new one).  On a disk with no inode left, an old mark, or the dead owner's
    reserve (emptied), is renamed to it (atomic: one mark or the other); False if it has neither."""
    mark = f"{HANDED}{key:016x}"
    try:
        os.close(open_own(os.path.join(path, mark)))
    except OSError:
        if not _rename_to(path, mark):
            return False
    if marked:
        with contextlib.suppress(OSError):
            for entry in list(os.scandir(path)):
                if entry.name != mark and _mark_key(entry) is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
    return True


def _rename_to(path: str, mark: str) -> bool:
    """Make ``mark`` in the owner's directory ``path`` of a regular file it holds: an old mark,
    else its reserve (its settlements are its adopter's now), emptied."""
    with contextlib.suppress(OSError):
        entries = [
            entry
            for entry in os.scandir(path)
            if _mark_key(entry) is not None
            or (entry.name == RESERVE and entry.is_file(follow_symlinks=False))
        ]
        for entry in sorted(entries, key=lambda entry: entry.name == RESERVE):
            target = os.path.join(path, mark)
            os.rename(entry.path, target)
            with contextlib.suppress(OSError):
                fd = open_own(target, os.O_WRONLY)
                try:
                    os.ftruncate(fd, 0)
                finally:
                    os.close(fd)
            return True
    return False


def hand_over(source: str, floor: int) -> tuple[int, list[str]] | None:
    """Mark the dead owner's directory ``source`` (its lock held) with the order it is handed
    on, and the owners nested in it with the order they are read in it, all past ``floor``
    (every owner its adopter holds) and past every key it holds: the owners it had adopted are
    ranked as they are read in it (their own nested ones first), then it.  Each is keyed again
    largest first, so that at any crash siblings compare as before, and a successor that takes
    it over ranks it all again.  Returns its key, and the owners it holds (their paths in it),
    in that order, if every one was keyed again (only then are they moved up beside it:
    :func:`flatten`); None: it could not be marked (no inode left, and no file of its own to
    rename), not to be taken until it can be.  Raises OSError if this process could not look.

    No mark is made at a name something else takes (a link, a FIFO, a directory named like a
    mark): its key is passed.  A forged mark so large that too few keys are left past it is no
    order to keep: they are taken from ``floor`` then."""
    own, blocked, owners = _look(source)
    nested = _nested(owners)
    taken = [names for _, names, _ in nested] + [blocked]
    keys = _keys(max([floor, own + 1, *(key + 1 for key, _, _ in nested)]), taken)
    if keys[-1] >= _MOST_KEY:
        keys = _keys(floor, taken)
    if keys[-1] >= _MOST_KEY:  # (the adopter's own marks forged: none is made until they go)
        return None
    rekeyed = all(_mark(path, key) for key, (*_, path) in reversed(list(zip(keys, nested, strict=False))))
    if not _mark(source, keys[-1], own >= 0):
        return None
    return keys[-1], [os.path.relpath(path, source) for *_, path in nested] if rekeyed else []


def flatten(directory: str, into: str, order: list[str]) -> list[str]:
    """Move the owners nested in ``directory`` (``order``: their paths in it, as :func:`hand_over`
    ranked and keyed them, as they are read there) up into ``into``, beside it, in that order;
    returns their paths there.  Else every start during an outage nests the backlog one level
    deeper, and past ``PATH_MAX`` its oldest files can no longer be listed.  Each move is one
    rename, of an owner whose nested ones have moved: after a crash at any point those moved are
    read before those not yet, in the same order.  The first that cannot move stops the moves:
    the rest are read where they are."""
    moved = []
    for path in order:
        target = os.path.join(into, os.path.basename(path))
        try:
            os.rename(os.path.join(directory, path), target)
        except OSError:
            break
        moved.append(target)
    return moved
