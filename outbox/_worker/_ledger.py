"""The poison ledger: the evidence that tells an event the backend cannot take from a backend
that is down.  Per event (by sequence number): when it was first refused in an answer about the
events, and how many answers about it alone refused it; and when the backend last took anything.

An event is poison when ``attempts`` answers about it alone refused it *and* the backend took
other events since it was first refused: a backend that takes nothing at all is down, and
nothing is settled as poison then.  Pure: time is passed in.
"""

from __future__ import annotations

__all__ = ["Ledger"]

_INF = float("inf")


class Ledger:
    __slots__ = ("_blame", "_first_failure", "attempts", "last_delivery")

    def __init__(self, attempts: int) -> None:
        self.attempts = attempts
        #: When the backend last took an event.
        self.last_delivery = -_INF
        self._first_failure: dict[int, float] = {}
        self._blame: dict[int, int] = {}

    def __bool__(self) -> bool:
        """Whether any event is on record (most of the time none is: nothing to forget)."""
        return bool(self._first_failure)

    def took(self, now: float) -> None:
        """The backend took an event."""
        self.last_delivery = now

    def refused(self, seq: int, now: float) -> None:
        """An answer about the events (not about the backend) refused event ``seq``."""
        self._first_failure.setdefault(seq, now)

    def taken_since_refused(self, seq: int) -> bool:
        """Whether the backend took other events since ``seq`` was first refused."""
        first = self._first_failure.get(seq)
        return first is not None and self.last_delivery >= first

    def judge(self, seq: int, alone: bool, now: float) -> bool:
        """Event ``seq`` was refused again; ``alone``: the answer was about it alone.  Returns
        whether it is poison now: refused alone ``attempts`` times, and the backend took
        others since it was first refused."""
        blame = self._blame.get(seq, 0)
        if alone:
            blame = self._blame[seq] = blame + 1
        return blame >= self.attempts and self.last_delivery >= self._first_failure.get(seq, now)

    def forget(self, seq: int) -> None:
        """Event ``seq`` is settled."""
        self._first_failure.pop(seq, None)
        self._blame.pop(seq, None)

    def clear(self) -> None:
        self._first_failure.clear()
        self._blame.clear()
