"""The order of hand-over, held by construction: whatever tree of adopted owners a dead one holds,
and wherever a crash stops its hand-over (a mark written, an old one not yet removed, the rename,
a move up), its segments are read in the order they were read before, and a successor that takes
over what is left reads them in that order too.  Real files; the crash is an exception raised
in place of the next write to the directory tree."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from outbox._spill import _owners
from outbox._spill._order import flatten, hand_over, next_key, segment_paths
from outbox._spill._owners import HANDED


class Crash(BaseException):
    """The process dies here (a BaseException: no ``suppress(OSError)`` takes it)."""


def owner_name(n: int) -> str:
    return f"{n:016x}-{n & 0xFFFF:x}-{n & 0xFFFFFFFF:08x}"


class Tree:
    """Owners with one segment each, nested and marked with keys at random, as adopters of
    earlier releases and this one may leave them (each level's keys its own adopter's count)."""

    def __init__(self, rng: random.Random, root: Path) -> None:
        self.rng, self.count = rng, 0
        self.root = root

    def owner(self, parent: Path, depth: int, key: int | None) -> Path:
        self.count += 1
        path = parent / owner_name(self.rng.randrange(1 << 30) * 1000 + self.count)
        path.mkdir()
        (path / "lock").write_bytes(_owners.LOCK_TEXT)
        (path / "00000001.seg").write_text(path.name)
        if self.rng.random() < 0.5:
            (path / _owners.RESERVE).write_bytes(b"\0" * 4096)
        if key is not None:
            (path / f"{HANDED}{key:016x}").touch()
        if depth and self.rng.random() < 0.7:
            keys = self.rng.sample(range(3 * depth + 4), self.rng.randrange(1, 4))
            for child_key in keys:
                marked = self.rng.random() < 0.9  # (an earlier release's, sometimes)
                self.owner(path, depth - 1, child_key if marked else None)
        return path


def read(directory: Path) -> list[str]:
    """Whose segments, in the order ``directory`` is read."""
    return [Path(path).read_text() for path in segment_paths(str(directory))]


def take(home: Path, dead: Path) -> bool:
    """What ``Adoption._take`` then ``adopt`` do to a dead owner, in that order; False: it
    could not be marked, and is left where it is."""
    handed = hand_over(str(dead), next_key(str(home)))
    if handed is None:
        return False
    target = home / dead.name
    os.rename(dead, target)
    flatten(str(target), str(home), handed[1])
    return True


@pytest.fixture
def crash_at(monkeypatch):
    """``crash_at(n)``: the n-th write to the tree from now on (a file made, one removed, a
    rename) raises Crash instead (or ``error``: it fails); returns the writes counted so far."""
    count = [0, -1]
    raised: list[BaseException] = [Crash()]
    real_open, real_unlink, real_rename = os.open, os.unlink, os.rename

    def write() -> None:
        count[0] += 1
        if count[0] == count[1]:
            raise raised[0]

    def opened(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if flags & os.O_CREAT:
            write()
        return real_open(path, flags, *args, **kwargs)

    def unlinked(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        write()
        return real_unlink(path, *args, **kwargs)

    def renamed(a, b, *args, **kwargs):  # type: ignore[no-untyped-def]
        write()
        return real_rename(a, b, *args, **kwargs)

    monkeypatch.setattr(os, "open", opened)
    monkeypatch.setattr(os, "unlink", unlinked)
    monkeypatch.setattr(os, "rename", renamed)

    def arm(n: int, error: BaseException | None = None) -> list[int]:
        count[:] = [0, n]
        raised[0] = error or Crash()
        return count

    return arm


@pytest.mark.parametrize("seed", range(40))
def test_a_hand_over_stopped_anywhere_reads_in_the_same_order(tmp_path, crash_at, seed):
    for n in range(1, 500):  # stopped at each write of the hand-over in turn, until it ends
        root = tmp_path / str(n) / "root"
        root.mkdir(parents=True)
        tree = Tree(random.Random(seed), root)
        home = tree.owner(root, 1, None)  # an adopter that holds owners it took before
        dead = tree.owner(root, 3, tree.rng.choice([None, 2]))  # (2: marked by one that died)
        before_home, before_dead = read(home), read(dead)
        expected = before_home[:-1] + before_dead + [home.name]
        crash_at(n)
        try:
            take(home, dead)
        except Crash:
            pass
        else:
            assert n > 1  # (it was stopped at least once)
            assert read(home) == expected
            return
        finally:
            crash_at(-1)
        if dead.exists():  # died before the rename: each read as it was, where it is
            assert (read(home), read(dead)) == (before_home, before_dead), n
            taken = sorted([home, dead], key=lambda path: path.name)  # (as dead_owners finds them)
            expected = [name for path in taken for name in read(path)]
        else:
            assert read(home) == expected, n
            taken = [home]
        successor = root / owner_name(1 << 60)
        successor.mkdir()
        for path in taken:
            assert take(successor, path)
        assert read(successor) == expected, n
    raise AssertionError("the hand-over never ran to its end")


@pytest.mark.parametrize("seed", range(40))
def test_a_write_of_a_hand_over_that_fails_keeps_the_order(tmp_path, crash_at, seed):
    """A mark that cannot be made (no inode left: an old mark or the reserve is renamed to it),
    an old one that cannot be removed, a move up that fails: the hand-over goes on, and what it
    took is read in the order it was; an owner it cannot mark at all is left where it is."""
    for n in range(1, 500):
        root = tmp_path / str(n) / "root"
        root.mkdir(parents=True)
        tree = Tree(random.Random(seed), root)
        home = tree.owner(root, 1, None)
        dead = tree.owner(root, 3, tree.rng.choice([None, 2]))
        before_home, before_dead = read(home), read(dead)
        count = crash_at(n, OSError(errno.ENOSPC, "No space left on device"))
        try:
            taken = take(home, dead)
        except OSError:  # (the rename of the dead owner itself)
            taken = False
        finally:
            crash_at(-1)
        if taken:
            assert read(home) == before_home[:-1] + before_dead + [home.name], n
        else:  # (left for the next look: each read as it was)
            assert (read(home), read(dead)) == (before_home, before_dead), n
        if count[0] < n:  # (it wrote fewer than n times: each of its writes has failed once)
            return
    raise AssertionError("the hand-over never ran to its end")
