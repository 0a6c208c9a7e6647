"""Reading a spill directory as its next owner would, without taking anything over: the spill
tests' eyes on the disk (the library reads the same way, in ``outbox/_spill``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from outbox._run._serde import SerializedEvent
from outbox._spill._format import SegmentReader
from outbox._spill._order import segment_paths
from outbox._spill._owners import is_owner
from outbox._spill._streams import Run, Streams


def waiting(directory: Any) -> list[tuple[str, int, SerializedEvent]]:
    """The events a successor would hand on from ``directory`` now (every owner's, live or
    gone): (stream, number, event), in the order it would."""
    out: list[tuple[str, int, SerializedEvent]] = []
    root = Path(directory)
    for owner in sorted(root.iterdir()) if root.is_dir() else []:
        if not is_owner(owner.name) or not owner.is_dir():
            continue
        paths = segment_paths(str(owner))
        run = Run(0, paths, Streams().replay(paths, lambda *args: None))
        events, origins = run.read(run.remaining, 1 << 30)
        run.close()
        numbers = [(stream, seq) for stream, first, n in origins for seq in range(first, first + n)]
        out.extend(
            (stream, seq, event)
            for (stream, seq), event in zip(numbers, events, strict=True)
            if event is not None
        )
    return out


def records(data: bytes) -> list[Any]:
    """The records of a segment file's bytes, in order: an ``int`` (the offset) for each
    stretch of bytes that is not a sound record."""
    with tempfile.NamedTemporaryFile(suffix=".seg", delete=False) as file:
        file.write(data)
    reader = SegmentReader(file.name)
    try:
        reader.open()
        out = list(reader.records())
        if reader.tail_left():
            out.append(reader.offset)
        return out
    finally:
        reader.close()
        os.unlink(file.name)
