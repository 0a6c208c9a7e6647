"""A disk that fills, for real: a small tmpfs mounted for a test (root only; CI runs as root),
and a file of someone else's that takes its room until ENOSPC, then gives it back."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

FILLER = "filler"


@contextlib.contextmanager
def small_disk(size: str = "1m", inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``) and ``inodes`` files at most (``nr_inodes=``),
    unmounted and removed on exit.

    Raises:
        OSError: it cannot be mounted here (not root, or no ``mount``): the message says why.
    """
    path = Path(tempfile.mkdtemp(prefix="small-disk-"))
    try:
        done = subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={size}" + (f",nr_inodes={inodes}" if inodes else ""),
                "tmpfs",
                str(path),
            ],
            capture_output=True,
            text=True,
        )
    except OSError as exc:
        shutil.rmtree(path, ignore_errors=True)
        raise OSError(f"cannot mount a tmpfs here: {exc}") from exc
    if done.returncode:
        shutil.rmtree(path, ignore_errors=True)
        raise OSError(f"cannot mount a tmpfs here (root only): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        shutil.rmtree(path, ignore_errors=True)


def fill(disk: Path, leave: int = 0) -> int:
    """Fill the filesystem of ``disk`` with the file ``disk/filler`` until ENOSPC (growing it
    if it is there already), then give back ``leave`` bytes of it.  Returns the bytes it holds."""
    fd = os.open(disk / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        size = max(0, os.fstat(fd).st_size - leave)
        os.ftruncate(fd, size)
        return size
    finally:
        os.close(fd)


def free(disk: Path) -> None:
    """Give back what :func:`fill` took."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(disk / FILLER)


def take_inodes(disk: Path) -> list[str]:
    """Empty files of someone else's in ``disk/inodes`` until the filesystem has no inode left
    (room for bytes, none for a file); returns their paths, to give them back."""
    folder = disk / "inodes"
    folder.mkdir(exist_ok=True)
    first = len(os.listdir(folder))  # (taken again: past those taken before)
    taken: list[str] = []
    with contextlib.suppress(OSError):
        while True:
            path = str(folder / str(first + len(taken)))
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
            taken.append(path)
    return taken
