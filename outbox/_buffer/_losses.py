"""The buffer's count of lost events, by reason: what ``Stats.dropped`` shows.  Written under
the buffer's lock, read with or without it."""

from __future__ import annotations

__all__ = ["Losses"]


class Losses:
    """Events lost, by reason.  ``put``'s fast path counts its drops for room in a cell of their
    reason (``cell``: an increment, where a dict's update costs twice that, on every emit into a
    full buffer); everything else through :meth:`count`."""

    __slots__ = ("_cells", "_counts")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._cells: dict[str, list[int]] = {}

    def cell(self, reason: str) -> list[int]:
        """The one-item list the fast path adds ``reason``'s drops to."""
        return self._cells.setdefault(reason, [0])

    def count(self, reason: str, n: int = 1) -> None:
        """``n`` more lost under ``reason`` (fewer, with ``n`` below zero: counted under another
        reason now; below zero in ``_counts`` while the fast path's cell holds them)."""
        self._counts[reason] = self._counts.get(reason, 0) + n

    def by_reason(self) -> dict[str, int]:
        """The counts as they are, a new dict (no reason counted zero)."""
        counts = dict(self._counts)
        for reason, (n,) in list(self._cells.items()):
            counts[reason] = counts.get(reason, 0) + n
        return {reason: n for reason, n in counts.items() if n}
