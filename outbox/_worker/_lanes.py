"""Lanes: how many requests the worker keeps in flight at once, adapted to what the backend and
this process can take (additive increase, multiplicative decrease, as TCP and Vector's adaptive
request concurrency do).  Pure: every observation is passed in.

A lane carries whole keys (a run's events, in order) and a key is in one lane at a time, so
order never depends on the lane count; only throughput does.
"""

from __future__ import annotations

__all__ = ["FIRST_LANES", "Lanes", "lane_size"]

#: Lanes to start with (then: doubling while the latency holds, halving on overload).
FIRST_LANES = 4
#: A period in which the sending thread was on the CPU for more than this share of the time was
#: limited by that CPU, not by the backend's latency: fewer lanes, not more.
BUSY_SHARE = 0.5
#: The CPU share is judged over at least this many seconds.
BUSY_PERIOD = 0.1
#: An answer slower than this many times the latency that holds says the backend is filling up.
SLOW_FACTOR = 2.0


class Lanes:
    """The number of lanes in use, between 1 and ``most``.

    Each answer moves it: an overloaded backend (a 429, a 503, a timeout, a connection that
    failed) halves it, at most once per latency (answers to requests sent before the cut say
    nothing new); a thread that computed rather than waited halves it too; an answer much
    slower than the latency that holds takes one lane away; an answer while more work waited
    than the lanes could carry adds one, spread over the lanes in use (one more per round
    trip), or doubles it per round trip until the backend first says it is overloaded (slow
    start).
    """

    __slots__ = ("_cpu_at", "_cut_at", "_wall_at", "count", "latency", "most", "slow_start")

    def __init__(self, most: int) -> None:
        self.most = most
        self.count = float(min(FIRST_LANES, most))
        self.latency: float | None = None
        self.slow_start = True
        self._cut_at = float("-inf")
        self._wall_at = self._cpu_at = float("nan")

    @property
    def current(self) -> int:
        return max(1, int(self.count))

    def _cut(self, now: float, sent_at: float) -> None:
        if sent_at < self._cut_at:
            return  # on the wire before the last cut: already counted
        self.count = max(1.0, self.count / 2)
        self._cut_at = now

    def overloaded(self, now: float, sent_at: float) -> None:
        """The backend said it is overloaded, to a request sent at ``sent_at``."""
        self.slow_start = False
        self._cut(now, sent_at)

    def busy(self, now: float, cpu: float) -> bool:
        """Whether the sending thread has been computing (``cpu``: its CPU time now) for more
        than ``BUSY_SHARE`` of the last ``BUSY_PERIOD`` seconds or more; if so, fewer lanes."""
        if self._wall_at != self._wall_at:  # nan: the first look
            self._wall_at, self._cpu_at = now, cpu
            return False
        wall = now - self._wall_at
        if wall < BUSY_PERIOD:
            return False
        share = (cpu - self._cpu_at) / wall
        self._wall_at, self._cpu_at = now, cpu
        if share > BUSY_SHARE:
            self._cut(now, now)
            return True
        return False

    def answered(self, elapsed: float, *, waiting: bool) -> None:
        """A request came back delivered after ``elapsed`` seconds; ``waiting``: more work
        waited for a lane when it was sent."""
        base = self.latency
        self.latency = elapsed if base is None else min(elapsed, base * 0.9 + elapsed * 0.1)
        if base is not None and elapsed > SLOW_FACTOR * base:
            self.count = max(1.0, self.count - 1 / self.count)
        elif waiting and self.count < self.most:
            step = 1.0 if self.slow_start else 1 / self.count  # per answer: x2 or +1 per round trip
            self.count = min(float(self.most), self.count + step)


def lane_size(waiting: int, lanes: int, smallest: int, largest: int) -> int:
    """The most events one lane carries: the work that waits spread evenly over the lanes (so a
    lane does not take a whole batch where each request carries one event and the others go
    idle), at least ``smallest`` (what is worth a request of its own), at most ``largest``."""
    share = -(-waiting // max(1, lanes))
    return max(1, min(largest, max(smallest, share)))
