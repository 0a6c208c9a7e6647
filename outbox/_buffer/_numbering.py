"""The buffer's sequence numbers: every accepted event gets the next one, and no number is ever
given twice.

The queue is a deque, so an event's number is not stored beside it: ``queue[i]`` has number
``head + i``, unless events were shed from the queue's tail (``drop_newest`` and ``block``
shed the newest queued events when the sidecar finds them larger than their estimate).  A
shed *retires* those numbers: the next event queued takes the position of the shed ones but
not their numbers.  Such a skip is a *jump*: ``[position, k]``, the event at that position (a
running count of queue positions, ``pos0`` being queue[0]'s) and every later one numbered
``k`` higher.  Sheds are rare, so jumps are few and short-lived (gone once the queue's head
passes them), and every method is O(1) without them.

Why it matters: whatever happens to an event later (delivered, shed, evicted, written to the
spill) is said about its number, so a number must name one event for ever (the spill's log
records settlements by number: ``_spill``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["DELIVERED", "Journal", "Numbering"]

#: The outcome a journal notes for events the backend took (a loss notes its reason).
DELIVERED = "delivered"


class Numbering:
    """The numbers of one buffer's queue (see the module's docstring).  ``n`` is always the
    queue's length; the caller holds the buffer's lock."""

    __slots__ = ("head", "jumped", "jumps", "lag")

    def __init__(self) -> None:
        #: The number of queue[0] (of the next event queued, while the queue is empty).
        self.head = 0
        #: ``head`` less queue[0]'s position (``pos0``).  Without jumps, an event leaving the
        #: head moves both by one and the lag stays: ``drop_oldest``'s eviction (once an emit
        #: into a full buffer) moves ``head`` alone.
        self.lag = 0
        #: ``[position, k]``, oldest first: from that position on, numbers are ``k`` higher.
        self.jumps: deque[list[int]] = deque()
        #: The sum of the jumps' ``k``.
        self.jumped = 0

    @property
    def pos0(self) -> int:
        """queue[0]'s position: positions count every event ever queued, shed or not."""
        return self.head - self.lag

    def end(self, n: int) -> int:
        """The number the next event queued after the queue's ``n`` events gets."""
        return self.head + n + self.jumped

    def seq_at(self, index: int) -> int:
        """The number of ``queue[index]``."""
        seq = self.head + index
        at = self.pos0 + index
        for position, k in self.jumps:
            if position > at:
                break
            seq += k
        return seq

    def index_from(self, seq: int, n: int) -> int:
        """The index of the first queued event numbered ``seq`` or more (``n``: none)."""
        index = seq - self.head
        if index <= 0:
            return 0
        for position, k in self.jumps:
            rel = position - self.pos0
            if rel >= index:
                break
            # Events from ``rel`` on are numbered k higher: ``seq`` is k positions earlier,
            # or, if it fell in the retired numbers, the event at ``rel`` is the first after.
            index = max(rel, index - k)
        return min(index, n)

    def index_of(self, seq: int, n: int) -> int | None:
        """The index of the queued event numbered ``seq``, if it is queued."""
        index = self.index_from(seq, n)
        if index < n and self.seq_at(index) == seq:
            return index
        return None

    def advance(self, count: int) -> range | list[int]:
        """``count`` events left the queue's head: their numbers, oldest first."""
        first, jumps = self.head, self.jumps
        end_pos = self.pos0 + count
        if not jumps or jumps[0][0] >= end_pos:
            seqs: range | list[int] = range(first, first + count)
            self.head = first + count  # (the lag as it was)
        else:
            seqs = [self.seq_at(i) for i in range(count)]
            self.head = seqs[-1] + 1
            while jumps and jumps[0][0] < end_pos:
                self.jumped -= jumps.popleft()[1]
        if jumps and jumps[0][0] == end_pos:
            # The new head is the first event after a jump.
            k = jumps.popleft()[1]
            self.head += k
            self.jumped -= k
        self.lag = self.head - end_pos
        return seqs

    def retire_tail(self, n: int) -> int:
        """The newest queued event (``queue[n - 1]``) was shed: its number is retired (the
        next event queued gets the number after it).  Returns that number."""
        seq = self.seq_at(n - 1)
        pos0 = self.pos0
        position = pos0 + n - 1  # where the next event will be queued
        jumps = self.jumps
        self.jumped += 1
        if jumps and jumps[-1][0] >= position:
            jumps[-1][0] = position
            jumps[-1][1] += 1
            if len(jumps) > 1 and jumps[-2][0] == position:
                jumps[-2][1] += jumps.pop()[1]
        else:
            jumps.append([position, 1])
        if position == pos0:  # the queue is empty: the next event is its head
            k = jumps.pop()[1]
            self.head += k
            self.lag += k
            self.jumped -= k
        return seq

    def retire_next(self, n: int, count: int) -> int:
        """The ``count`` numbers right after the queue's ``n`` events (events accepted beyond
        the queue, gone before they joined it) are retired.  Returns the first of them."""
        first = self.end(n)
        position = self.pos0 + n
        jumps = self.jumps
        if n == 0:
            self.head += count
            self.lag += count
        elif jumps and jumps[-1][0] == position:
            jumps[-1][1] += count
            self.jumped += count
        else:
            jumps.append([position, count])
            self.jumped += count
        return first

    def restore(self, seqs: list[int]) -> None:
        """Events that left the head (numbered ``seqs``, in order, the newest of the last
        ``advance``) are back at the head."""
        count = len(seqs)
        before, old_head = self.pos0 - count, self.head
        # The gaps between them, and between the last of them and the old head, were jumps.
        after = [*seqs[1:], old_head]
        gaps = [[before + i + 1, b - a - 1] for i, (a, b) in enumerate(zip(seqs, after, strict=True))]
        jumps = deque(gap for gap in gaps if gap[1] > 0)
        jumps.extend(self.jumps)  # (all beyond the old head's position)
        self.jumps = jumps
        self.jumped = sum(k for _, k in jumps)
        self.head, self.lag = seqs[0], seqs[0] - before

    def clear(self, n: int, beyond: int) -> None:
        """Everything queued (``n``) and ``beyond`` it left at once: numbering goes on after."""
        end_pos = self.pos0 + n
        self.head = self.end(n) + beyond
        self.lag = self.head - end_pos
        self.jumps.clear()
        self.jumped = 0


class Journal:
    """The numbers settled since a reader last took them, as ``[first, end, outcome]``
    ranges in the order they settled (neighbours of one outcome merged): what a durable log
    (the spill's) writes down.  Kept only while such a reader exists; written under the
    buffer's lock."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[list[Any]] = []

    def note(self, first: int, end: int, outcome: str) -> None:
        entries = self.entries
        if entries:
            last = entries[-1]
            if last[1] == first and last[2] == outcome:
                last[1] = end
                return
        entries.append([first, end, outcome])

    def take(self) -> list[list[Any]]:
        """What was noted since the last take, oldest first."""
        entries, self.entries = self.entries, []
        return entries
