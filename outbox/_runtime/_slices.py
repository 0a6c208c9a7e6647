"""The sidecar's share of the GIL: its per-event work runs in short slices, and between two
slices it lets go of the GIL long enough for an application thread that waits for it to
take it.

Why a sleep, and not ``time.sleep(0)`` or an ``await``: CPython hands the GIL to a waiting
thread only if that thread wakes up and takes it before the releasing one takes it back.  A
release that lasts a system call (``sleep(0)``, a zero-timeout ``epoll_wait``) is nearly always
won back by the releaser, and each such release restarts the waiter's 5 ms switch interval:
a sidecar that computes between quick releases makes a handler wait for milliseconds (this
was measured: ``python -m outbox.tools.benchmarks tail --work cpu``).  Sleeping ``HANDOFF``
seconds lets the waiter in; if nobody waits, the sidecar has lost a few tens of microseconds
of wall time and no CPU.

The sleeps happen only while handlers emit (an emit within the last ``ACTIVE`` seconds), and
never in attached mode (the worker then runs on the application's own event loop, which a
sleep would hold up).

The price of politeness is paid by the sidecar: a handler that computes without pause gives
the GIL back only when CPython forces it to (every 5 ms, ``sys.getswitchinterval()``), so a
sidecar that hands over after every 30 µs slice would get well under 1% of the time, fall
behind and drop events.  So the slice grows, doubling up to ``LONGEST_SLICE``, while the
sidecar is behind (more than a batch, or a quarter of ``max_events``, waits: queued, in flight
or in a spill's overflow and stretch) and its hand-offs are slow to come back (the handler
computes); it shrinks back by halves once it has caught up, and at each hand-off once none
was slow for ``CONTENDED_FOR`` (a few slow ones, a collection's or the machine's, kept a 5 ms
slice for the rest of a batch: a 5 ms wait for a handler at 20,000 events/s, #37).  Past that
point the handler's tail is traded for not losing its events.
"""

from __future__ import annotations

import selectors
import threading
import time
from collections.abc import Callable

from .._buffer._buffer import Buffer

__all__ = [
    "CONTENDED_FOR",
    "HANDOFF",
    "LONGEST_SLICE",
    "SLICE",
    "SlicedSelector",
    "Slicer",
    "checkpoint",
    "install",
]

#: Seconds of the sidecar's Python work between two hand-offs while handlers emit.
SLICE = 30e-6
#: The longest slice: CPython's default switch interval.
LONGEST_SLICE = 5e-3
#: Seconds the sidecar lets go of the GIL at a hand-off (a waiting thread needs about 10-50 µs
#: to wake up and take it; Linux's default timer slack makes the sleep about 50 µs longer).
HANDOFF = 20e-6
#: A hand-off that took longer than this to come back found a handler computing.
SLOW_HANDOFF = 1e-3
#: Handlers that emitted within this many seconds are taken to be running.
ACTIVE = 0.05
#: A grown slice shrinks at a hand-off once none was slow for this long: a handler that
#: computes without pause makes every other one slow (each a switch interval), at least.
CONTENDED_FOR = 0.02

_local = threading.local()
_INF = float("inf")


class Slicer:
    """Ends the sidecar's slices: :meth:`begin` when a period of work starts, then
    :meth:`checkpoint` between two events of it (cheap: a clock read).

    Args:
        buffer: whose ``emitted`` count tells whether handlers run, and whose queue whether
            the sidecar is behind.
        behind_above: events held (queued, in flight, in a spill's overflow or on its disk
            to be read back) above which the sidecar is behind: a batch's worth, or a quarter
            of ``max_events`` if less (a small buffer, or a spill's window, may never hold a batch).
        on_handoff: called at each hand-off, before the GIL is let go (the worker samples
            what queued objects weigh there, so a long period of work cannot leave the
            estimate stale).
    """

    __slots__ = (
        "_active_until",
        "_budget",
        "_clock",
        "_contended",
        "_emitted",
        "_sleep",
        "_slow_at",
        "_started",
        "behind_above",
        "buffer",
        "enabled",
        "on_handoff",
    )

    def __init__(
        self,
        buffer: Buffer,
        *,
        behind_above: int = 1000,
        on_handoff: Callable[[], None] | None = None,
        enabled: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.buffer = buffer
        self.behind_above = behind_above
        self.on_handoff = on_handoff
        self.enabled = enabled
        self._clock, self._sleep = clock, sleep
        self._started = clock()
        self._budget = SLICE
        self._emitted = -1
        self._active_until = 0.0
        self._contended = False
        self._slow_at = -_INF  # (when a hand-off was last slow)

    @property
    def budget(self) -> float:
        """Seconds of work the current slice may take before a hand-off."""
        return self._budget

    @property
    def contended(self) -> bool:
        """Whether the last hand-off was slow to come back: a handler computes without pause,
        and any wait of the sidecar's gives it the GIL for a switch interval."""
        return self._contended

    def begin(self) -> None:
        """A period of work starts (the sidecar was waiting until now: its slice is fresh)."""
        self._started = self._clock()

    def waited(self, seconds: float) -> None:
        """The sidecar awaited (the GIL free meanwhile) for ``seconds``: if that lasted a
        hand-off, its slice is fresh (:meth:`begin`), and a slice grown while it was behind
        shrinks by half if it is no longer behind (a grown slice reaches a hand-off only
        after that long a period of work, which a sidecar that keeps up may never do)."""
        if seconds >= HANDOFF:
            self._started = self._clock()
            if self._budget > SLICE and not self._behind():
                self._budget = max(SLICE, self._budget / 2)

    def pause(self) -> None:
        """A checkpoint in the sidecar's per-batch steps beyond serializing (into the backlog,
        into a lane, settled, let go): none while a handler computes without pause, whose every
        hand-off costs the sidecar a switch interval (it then hands over between the events it
        serializes only, as :class:`SlicedSelector` does)."""
        if not self._contended:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Between two events: if this slice has lasted its budget, hand the GIL over."""
        now = self._clock()
        if now - self._started < self._budget:
            return
        if self.on_handoff is not None:
            self.on_handoff()
        if self.enabled:
            emitted = self.buffer.emitted
            if emitted != self._emitted:
                self._emitted = emitted
                self._active_until = now + ACTIVE
            if now < self._active_until:
                before = self._clock()
                self._sleep(HANDOFF)
                after = self._clock()
                slow = self._contended = after - before > SLOW_HANDOFF
                if slow:
                    self._slow_at = after
                behind = self._behind()
                if slow and behind:
                    self._budget = min(LONGEST_SLICE, self._budget * 2)
                elif self._budget > SLICE and (not behind or after - self._slow_at > CONTENDED_FOR):
                    # Caught up; or no hand-off was slow for a while: the one that grew the
                    # slice was a collection or the machine, not a handler that computes
                    # without pause (whose hand-offs are slow every other one at least).
                    self._budget = max(SLICE, self._budget / 2)
            else:
                self._budget = SLICE  # nobody emits: no hand-off, and a short slice when they do
                self._contended = False
        self._started = self._clock()

    def _behind(self) -> bool:
        """More than a batch (or a quarter of ``max_events``) is held: queued, in flight, or
        beyond the queue (a spill's overflow)."""
        held = self.buffer.holdings  # (read without the lock: it only sizes the next slice)
        waiting = len(held.queue) + held.in_flight + held.beyond
        return waiting > min(self.behind_above, held.max_events // 4)


class SlicedSelector(selectors.DefaultSelector):
    """The sidecar's event loop's selector: each turn of the loop is work in the worker's
    current slice, whatever code runs in it (the worker's, a transport's, an HTTP client's),
    so the slice ends in a hand-off once it has lasted its budget.  A turn that only polls
    (timeout 0: callbacks are ready) lets go of the GIL for a system call and takes it back
    before a waiting thread can, handing nothing over and restarting that thread's 5 ms
    wait: there, :meth:`Slicer.checkpoint` first, unless the last hand-off found a handler
    that computes without pause (each hand-off then costs the sidecar a switch interval: it
    hands over between the events it serializes only, as before).  A wait that lasted a
    hand-off starts a fresh slice."""

    def __init__(self, slicer: Slicer) -> None:
        super().__init__()
        self._slicer = slicer

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        slicer = self._slicer
        if timeout is not None and timeout <= 0:
            if not slicer.contended:  # (a handler that computes without pause: the slices' own)
                slicer.checkpoint()
            return super().select(timeout)
        before = time.monotonic()
        ready = super().select(timeout)
        slicer.waited(time.monotonic() - before)
        return ready


def install(slicer: Slicer) -> None:
    """Make ``slicer`` the one :func:`checkpoint` uses on this thread (the sidecar's)."""
    _local.slicer = slicer


def checkpoint() -> None:
    """For transports: between two records of a batch, let the application's threads in if
    the sidecar has computed for a slice already.  A no-op outside a sidecar thread."""
    slicer = getattr(_local, "slicer", None)
    if slicer is not None:
        slicer.checkpoint()
