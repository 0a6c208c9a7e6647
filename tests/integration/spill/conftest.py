"""Fixtures of the spill's integration tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.disk import small_disk


@pytest.fixture
def tmpfs() -> Iterator[Path]:
    """A 1 MiB tmpfs: a disk that fills (``support.disk.fill``).  Mounting needs root; CI runs
    as root, where ENOSPC must be proven, never skipped."""
    try:
        disk = small_disk("1m")
        path = disk.__enter__()
    except OSError as exc:
        if os.geteuid() == 0 or os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    try:
        yield path
    finally:
        disk.__exit__(None, None, None)
