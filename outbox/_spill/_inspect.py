"""What ``outbox check`` reads of a spill directory, without taking anything over: its owners
(live or gone), their segments and bytes, the age of the oldest event, and what is not ours."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from typing import Any

from .._serde import SerializedEvent
from ._format import Event
from ._owners import LOCK, is_owner
from ._reader import NotOurs, SegmentReader
from ._streams import Streams, segment_paths
from ._stretch import Run

__all__ = ["inspect_dir", "waiting"]


def _alive(path: str) -> bool:
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _first_event_at(path: str) -> float | None:
    reader = SegmentReader(path)
    try:
        reader.open()
        for _ in range(64):
            record = reader.next()
            if record is None:
                return None
            if isinstance(record, Event):
                return record.at
    except (OSError, NotOurs):
        return None
    finally:
        reader.close()
    return None


def waiting(directory: str | os.PathLike[str]) -> list[tuple[str, int, SerializedEvent]]:
    """The events a successor would hand on from ``directory`` now (every owner's, live or
    gone): (stream, number, event), in the order it would, read only."""
    root = os.fspath(directory)
    out: list[tuple[str, int, SerializedEvent]] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        full = os.path.join(root, name)
        if not is_owner(name) or not os.path.isdir(full):
            continue
        paths = segment_paths(full)
        run = Run(0, paths, Streams().replay(paths, lambda *args: None))
        while run.remaining:
            got = run.read(run.remaining, 1 << 30)
            run.remaining -= len(got)
            out.extend((stream, seq, event) for stream, seq, event in got if event is not None)
        run.close()
    return out


def inspect_dir(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The state of a spill directory: whether it is writable, its owners (alive or gone),
    segments, bytes, the age of its oldest event, and entries that are not ours."""
    path = os.fspath(directory)
    state: dict[str, Any] = {"path": path, "exists": os.path.isdir(path)}
    if not state["exists"]:
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        state["writable"] = os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)
        return state
    state["writable"] = os.access(path, os.W_OK | os.X_OK)
    alive = gone = segments = size = foreign = 0
    oldest: float | None = None
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.startswith("."):
            continue
        if not is_owner(name) or not os.path.isdir(full):
            foreign += 1
            continue
        if _alive(full):
            alive += 1
        else:
            gone += 1
        for seg in segment_paths(full):
            segments += 1
            with contextlib.suppress(OSError):
                size += os.path.getsize(seg)
            at = _first_event_at(seg)
            if at is not None:
                oldest = at if oldest is None else min(oldest, at)
    state.update(
        owners_alive=alive,
        owners_gone=gone,
        segments=segments,
        bytes=size,
        foreign=foreign,
        oldest_event_age=None if oldest is None else max(0.0, time.time() - oldest),
    )
    return state
