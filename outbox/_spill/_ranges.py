"""A set of integers kept as sorted, disjoint half-open ranges: the spill's sets of sequence
numbers (live on disk, settled), which are long runs with few gaps."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

__all__ = ["Ranges"]


class Ranges:
    """Integers as ranges ``[first, end)``, sorted, disjoint and not touching.  ``len()`` is
    how many integers; adding after the last range or removing from the first is O(1)."""

    __slots__ = ("_ends", "_starts", "size")

    def __init__(self, pairs: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.size = 0
        for first, end in pairs:
            self.add(first, end)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends, strict=True)

    def __repr__(self) -> str:
        return f"Ranges({list(self)!r})"

    def __contains__(self, x: int) -> bool:
        i = bisect_right(self._starts, x) - 1
        return i >= 0 and x < self._ends[i]

    def first(self) -> int | None:
        return self._starts[0] if self._starts else None

    def last(self) -> int | None:
        """The largest integer in the set."""
        return self._ends[-1] - 1 if self._ends else None

    def add(self, first: int, end: int) -> None:
        if first >= end:
            return
        starts, ends = self._starts, self._ends
        if not starts or first > ends[-1]:
            starts.append(first)
            ends.append(end)
        elif first == ends[-1]:  # (the common case: the next numbers)
            ends[-1] = end
        else:
            i = bisect_left(ends, first)  # the first range that ends at or after ``first``
            j = bisect_right(starts, end)  # ranges from i to j touch or overlap [first, end)
            if i < j:
                self.size -= sum(ends[k] - starts[k] for k in range(i, j))
                first, end = min(first, starts[i]), max(end, ends[j - 1])
            starts[i:j] = [first]
            ends[i:j] = [end]
        self.size += end - first

    def remove(self, first: int, end: int) -> int:
        """Take ``[first, end)`` out; returns how many integers were in the set."""
        if first >= end:
            return 0
        starts, ends = self._starts, self._ends
        if starts and starts[0] == first and end < ends[0]:  # (the common case: the oldest first)
            starts[0] = end
            self.size -= end - first
            return end - first
        i = bisect_right(ends, first)  # the first range that ends after ``first``
        j = bisect_left(starts, end)  # ranges from i to j overlap [first, end)
        if i >= j:
            return 0
        removed = self.count(first, end)
        pieces = [(starts[i], first)] if starts[i] < first else []
        pieces += [(end, ends[j - 1])] if ends[j - 1] > end else []
        starts[i:j] = [a for a, _ in pieces]
        ends[i:j] = [b for _, b in pieces]
        self.size -= removed
        return removed

    def count(self, first: int, end: int) -> int:
        """How many integers of ``[first, end)`` are in the set."""
        return sum(b - a for a, b in self.clip(first, end))

    def outside(self, first: int, end: int) -> list[tuple[int, int]]:
        """The ranges of ``[first, end)`` not in the set."""
        out, at = [], first
        for a, b in self.clip(first, end):
            if a > at:
                out.append((at, a))
            at = b
        if at < end:
            out.append((at, end))
        return out

    def clip(self, first: int, end: int) -> list[tuple[int, int]]:
        """The set's ranges within ``[first, end)``."""
        starts, ends = self._starts, self._ends
        i, j = bisect_right(ends, first), bisect_left(starts, end)
        return [(max(starts[k], first), min(ends[k], end)) for k in range(i, j)]
