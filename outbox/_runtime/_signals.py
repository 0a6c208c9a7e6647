"""``Outbox.close_on_signal``: close on SIGTERM (or any signal), then hand the signal on.

A Python signal handler runs on the main thread, between two bytecodes of whatever that
thread was doing: inside ``emit`` holding the buffer's lock, inside ``close`` waiting for
the sidecar, inside a logging call holding a handler's lock.  Waiting there for anything
that thread holds deadlocks.  So the handler only posts the signal to a closer thread
(``queue.SimpleQueue.put`` is documented as safe in signal handlers) and returns.  The
closer closes every outbox registered for that signal at once (one ``shutdown_timeout``),
then raises the signal again; the handler, seeing the close done, hands it on to the
previous handler or the default action.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._observability._log import never_silent
from ._lifecycle import WeakCall, close_all, hold_weakly
from ._threads import block_async_signals

if TYPE_CHECKING:
    from .._worker._sidecar import Sidecar

    SidecarOf = Callable[[], Sidecar]

__all__ = ["close_on_signal"]


@dataclass
class _Registration:
    """Our handler for one signal: the sidecars it closes and the handler before it.

    Each outbox is held as a weak reference to its ``sidecar`` getter (a bound method), not
    as the sidecar itself: a forked child gives the outbox a new sidecar, and the signal must
    close that one.  Weak: a registration keeps no outbox alive."""

    signum: int
    previous: Any
    sidecars: dict[int, WeakCall[Sidecar]] = field(default_factory=dict)
    #: The closer took the signal; a second one while it closes is not a second close.
    requested: bool = False
    #: The close has ended: the next delivery is handed on.
    done: bool = False
    #: The handler handed the signal on.
    handed_on: bool = False

    def handle(self, signum: int, frame: Any) -> None:
        if self.done:
            self.handed_on = True
            _hand_on(self.previous, signum, frame)
        elif not self.requested:
            self.requested = True
            if not _closer.post(self):
                # No closer thread in this process (it could not start): hand on now
                # rather than swallow the signal.
                self.done = True
                _hand_on(self.previous, signum, frame)


_registrations: dict[int, _Registration] = {}
_install_lock = threading.Lock()


def close_on_signal(sidecar_of: SidecarOf, signums: tuple[int, ...]) -> bool:
    """Close the sidecar ``sidecar_of()`` returns (a bound method) on each of ``signums``."""
    if threading.current_thread() is not threading.main_thread():
        # Python installs signal handlers from the main thread only.  Said where it reaches
        # the user (stderr if no logging is configured): the exit hook flushes at a normal
        # exit, but SIGTERM's default action ends the process without one.
        never_silent(
            logging.WARNING,
            "close_on_signal() was called on thread %r, not the main thread, where Python cannot "
            "install a signal handler: a SIGTERM ends this process without closing its outboxes "
            "(the events they hold are lost); call it from the main thread, or close the outbox "
            "in your runtime's shutdown hook",
            threading.current_thread().name,
        )
        return False
    with _install_lock:
        _closer.start()
        for signum in signums or (signal.SIGTERM,):
            registration = _registrations.get(signum)
            current = signal.getsignal(signum)
            if registration is None or current != registration.handle:
                # First time, or someone installed another handler since ours: chain to it.
                registration = _Registration(signum, current)
                _registrations[signum] = registration
                signal.signal(signum, registration.handle)
            hold_weakly(registration.sidecars, sidecar_of)
    return True


def _hand_on(previous: Any, signum: int, frame: Any) -> None:
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL or previous is None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    # SIG_IGN: the signal was ignored before us; it still is.


class _Closer:
    """One daemon thread per process that performs the closes signals ask for."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Registration] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def start(self) -> None:
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        self._requests = queue.SimpleQueue()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="outbox-signal-closer", daemon=True)
        self._thread.start()

    def post(self, registration: _Registration) -> bool:
        thread = self._thread
        if thread is None or self._pid != os.getpid() or not thread.is_alive():
            return False
        self._requests.put(registration)
        return True

    def _run(self) -> None:
        block_async_signals()
        while True:
            registration = self._requests.get()
            try:
                _close_for(registration)
            except BaseException as exc:  # the signal must be handed on whatever happens
                never_silent(
                    logging.ERROR, "closing the outboxes on signal %d failed: %r", registration.signum, exc
                )
            registration.done = True
            # To the main thread itself: it runs Python's handlers, and a signal sent to it
            # interrupts whatever system call it is blocked in.  Again until handled: one
            # that lands just before the main thread enters a blocking call (after its last
            # check for signals) would wait for that call to end.
            main = threading.main_thread().ident or 0
            for _ in range(50):
                signal.pthread_kill(main, registration.signum)
                time.sleep(0.1)
                if registration.handed_on:
                    break


def _close_for(registration: _Registration) -> None:
    sidecars = [sidecar_of() for sidecar_of in list(registration.sidecars.values())]
    open_ones = [sidecar for sidecar in sidecars if sidecar is not None and sidecar.report is None]
    close_all(open_ones, why=f"on signal {registration.signum}")


_closer = _Closer()


def _after_fork_in_child() -> None:
    # The closer thread is the parent's; signals in the child need one of their own.
    for registration in _registrations.values():
        registration.requested = registration.done = False
    if _closer._thread is not None:
        _closer.start()


os.register_at_fork(after_in_child=_after_fork_in_child)
