"""Fixtures of the spill's integration tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.disk import small_disk


def _mounted(size: str, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs for one test.  Mounting needs root; CI runs as root, where ENOSPC must be
    proven, never skipped."""
    try:
        disk = small_disk(size, inodes)
        path = disk.__enter__()
    except OSError as exc:
        if os.geteuid() == 0 or os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    try:
        yield path
    finally:
        disk.__exit__(None, None, None)


@pytest.fixture
def tmpfs() -> Iterator[Path]:
    """A 1 MiB tmpfs: a disk that fills (``support.disk.fill``)."""
    yield from _mounted("1m")


@pytest.fixture
def few_inodes() -> Iterator[Path]:
    """An 8 MiB tmpfs of 400 files at most: a disk whose files run out (``support.disk.take_inodes``)."""
    yield from _mounted("8m", inodes=400)
