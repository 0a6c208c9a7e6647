"""Lifecycle hooks: what happens to a process's outboxes at interpreter exit and in a forked
child.  (Signals are ``Outbox.close_on_signal``, in ``_signals``.)

- Exit: every sidecar that runs and closes at exit is closed by one ``atexit`` hook, all at
  once (one ``shutdown_timeout``, the longest, not their sum), so an outbox dropped without
  ``close()`` still gets its events flushed.
- Fork: a child gets a fresh, empty runtime and a fresh transport for every outbox; what it
  inherited from the parent (loops, clients, sidecars) is kept referenced and never touched,
  since it shares the parent's sockets and epoll instance.  Once a sidecar runs, a fork waits
  (within a bound) for the log records in progress on the handlers our loggers reach: a child
  must not inherit a stream that a sidecar thread was writing to.
- A ``multiprocessing`` child (any start method) ends with ``os._exit``: ``atexit`` never runs
  there.  ``multiprocessing`` runs its own finalizers first (``util._exit_function`` in
  ``Process._bootstrap``), so the first sidecar started in such a child registers one
  (``multiprocessing.util.Finalize``) that closes them as the exit hook would.
- Either way, an outbox with ``close_at_exit=False`` that still holds events as the process ends
  is named in a warning (nothing else would count what it loses).  (Registered at the sidecar's
  start, not in the fork hook: ``_bootstrap`` clears the finalizers after the fork hooks ran.)
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._observability._log import never_silent
from .._observability._metrics import forget_after_fork as metrics_after_fork

if TYPE_CHECKING:
    from .._worker._sidecar import Sidecar

T = TypeVar("T")

__all__ = [
    "INHERITED",
    "WeakCall",
    "close_all",
    "hold_weakly",
    "no_longer_closes_at_exit",
    "started",
    "track",
]

# -- exit ---------------------------------------------------------------------------------------

# Sidecars that run and must be closed at interpreter exit (strong references: an outbox
# dropped without close() still gets its events flushed).
_OPEN: set[Sidecar] = set()
_OPEN_LOCK = threading.Lock()


# Every sidecar started in this process (weakly): the multiprocessing exit warns of those that
# do not close at exit and still hold events.
_STARTED: weakref.WeakSet[Sidecar] = weakref.WeakSet()


def started(sidecar: Sidecar, close_at_exit: bool) -> None:
    """``sidecar`` runs: close it at interpreter exit (if ``close_at_exit``), and at the end of
    a ``multiprocessing`` child, which never reaches ``atexit``."""
    with _OPEN_LOCK:
        _STARTED.add(sidecar)
        if close_at_exit:
            _OPEN.add(sidecar)
    _hook_multiprocessing_exit()


def no_longer_closes_at_exit(sidecar: Sidecar) -> None:
    with _OPEN_LOCK:
        _OPEN.discard(sidecar)


def close_all(sidecars: list[Sidecar], why: str = "at exit") -> None:
    """Close several sidecars at once: every deadline starts now, so the whole takes one
    ``shutdown_timeout`` (the longest), not their sum.  Each one's close warns of what it did
    not deliver (``Sidecar.finish``)."""
    now = time.monotonic()
    deadlines = []
    for sidecar in sidecars:
        deadline = now + sidecar.shutdown_timeout
        sidecar.request_close(deadline, why)
        deadlines.append(deadline)
    for sidecar, deadline in zip(sidecars, deadlines, strict=True):
        if sidecar.worker is not None:
            sidecar.wait(deadline)
        sidecar.finish()


def _close_all_at_exit(where: str = "this process") -> None:
    with _OPEN_LOCK:
        sidecars = [s for s in _OPEN if s.active]
    try:
        close_all(sidecars)
    except Exception as exc:  # never fail interpreter exit
        never_silent(logging.WARNING, "closing the outboxes at exit failed: %r", exc)
    _warn_of_unclosed(where)


atexit.register(_close_all_at_exit)

# Sidecars already warned of (a spawn child reaches both multiprocessing's finalizers and atexit).
_WARNED: weakref.WeakSet[Sidecar] = weakref.WeakSet()


def _warn_of_unclosed(where: str) -> None:
    """Nothing lost silently: an outbox that does not close at exit and still holds events as
    the process ends says so (its events are lost, and nothing else would count them)."""
    with _OPEN_LOCK:
        unclosed = [s for s in _STARTED if s.active and not s.close_at_exit and s not in _WARNED]
    for sidecar in unclosed:
        _WARNED.add(sidecar)
        try:
            held = sidecar.held()
        except Exception:  # never fail interpreter exit
            continue
        if held:
            never_silent(
                logging.WARNING,
                "outbox %r: %s (pid %d) ends with %d event(s) not delivered, and close_at_exit=False: "
                "they are lost; call close() before it ends",
                sidecar.name,
                where,
                os.getpid(),
                held,
            )


# -- the end of a multiprocessing child ------------------------------------------------------

# The process whose multiprocessing finalizer is registered (a fork child inherits the value
# but not the registration: its pid differs).
_MP_HOOKED_PID = 0


def _hook_multiprocessing_exit() -> None:
    """In a ``multiprocessing`` child, once: a finalizer that ``multiprocessing`` runs before
    ``os._exit``.  Nothing in any other process (``multiprocessing`` is not imported for it)."""
    global _MP_HOOKED_PID
    pid = os.getpid()
    if pid == _MP_HOOKED_PID:
        return
    process = sys.modules.get("multiprocessing.process")
    if process is None or process.parent_process() is None:
        return  # not a multiprocessing child: atexit runs at its end
    from multiprocessing import util

    _MP_HOOKED_PID = pid
    # Priority above multiprocessing's own (queues 10, pools 15): the outboxes close first,
    # while the child's queues and pipes still work.
    util.Finalize(None, _close_at_multiprocessing_exit, exitpriority=100)


def _close_at_multiprocessing_exit() -> None:
    _close_all_at_exit("this multiprocessing child")


# -- fork -----------------------------------------------------------------------------------------


class WeakCall(Generic[T]):
    """A bound method held weakly: calling it calls the method while its object lives, else
    returns None.  (Not weakref.WeakMethod: its callback can fail at interpreter exit,
    printing a traceback, when the two die together.)"""

    __slots__ = ("_func", "_ref")

    def __init__(self, method: Callable[[], T], on_dead: Callable[[Any], None] | None = None) -> None:
        self._ref = weakref.ref(method.__self__, on_dead)  # type: ignore[attr-defined]
        self._func = method.__func__  # type: ignore[attr-defined]

    def __call__(self) -> T | None:
        obj = self._ref()
        return None if obj is None else self._func(obj)


def hold_weakly(registry: dict[int, WeakCall[T]], method: Callable[[], T]) -> None:
    """Put ``method`` (a bound method) in ``registry``, from which it goes when its object dies."""
    token = id(method.__self__)  # type: ignore[attr-defined]

    def forget(_: object) -> None:
        registry.pop(token, None)

    registry[token] = WeakCall(method, forget)


# What each outbox of this process does in a forked child: its bound method, held weakly
# (none is kept alive), so that this module knows of outboxes only that each has one.
_AFTER_FORK: dict[int, WeakCall[None]] = {}
# What forked children inherited from their parent and must never touch nor collect: an
# inherited event loop shares its epoll instance with the parent's (closing it would
# unregister the parent's sockets), an inherited client its connections.
INHERITED: list[Any] = []


def track(after_fork_in_child: Callable[[], None]) -> None:
    """Call ``after_fork_in_child`` (a bound method) in every forked child while its object
    lives."""
    hold_weakly(_AFTER_FORK, after_fork_in_child)


def _forget_open_sidecars() -> list[Sidecar]:
    """In a forked child: the parent's sidecars are not ours to close."""
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()
    inherited = list(_OPEN)
    _OPEN.clear()
    _STARTED.clear()
    _WARNED.clear()
    return inherited


# -- fork: log records in progress ------------------------------------------------------------

#: Seconds a fork waits, at most, for the log records in progress (then it forks regardless).
FORK_LOG_WAIT = 1.0
_held_for_fork: list[Any] = []


def _handlers_reached() -> list[logging.Handler]:
    """The handlers a record of our loggers (``outbox`` and below) can reach."""
    manager = logging.Logger.manager
    loggers = [logging.getLogger("outbox")]
    loggers += [
        item
        for name, item in list(manager.loggerDict.items())
        if name.startswith("outbox.") and isinstance(item, logging.Logger)
    ]
    found: dict[int, logging.Handler] = {}
    for start in loggers:
        current: logging.Logger | None = start
        while current is not None:
            for handler in current.handlers:
                found[id(handler)] = handler
            current = current.parent if current.propagate else None
    if not found and logging.lastResort is not None:
        found[id(logging.lastResort)] = logging.lastResort
    return list(found.values())


def _before_fork() -> None:
    """A sidecar thread writing a log record as another thread forks would leave the child a
    stream whose buffer lock (``io.BufferedWriter``'s) no thread there will release: logging
    re-creates its handlers' locks in the child, not their streams'.  The child's first record
    to that handler, ours or the program's, would then wait forever.  A thread writing a
    record holds its handler's lock: take them all (within ``FORK_LOG_WAIT``) so that none is
    mid-write at the fork."""
    if not _STARTED:
        return  # no sidecar thread in this process: none of our threads is logging
    try:
        deadline = time.monotonic() + FORK_LOG_WAIT
        for handler in _handlers_reached():
            lock = handler.lock
            if lock is not None and lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                _held_for_fork.append(lock)
    except Exception:  # (a hook must not fail the fork; a handler without a usual lock)
        pass


def _release_after_fork() -> None:
    """After the fork, in the parent and in the child.  (In the child logging has usually
    re-created these locks already: releasing a fresh one raises, and is not needed.)"""
    while _held_for_fork:
        with contextlib.suppress(RuntimeError):
            _held_for_fork.pop().release()


os.register_at_fork(
    before=_before_fork, after_in_parent=_release_after_fork, after_in_child=_release_after_fork
)


def _after_fork_in_child() -> None:
    metrics_after_fork()
    INHERITED.extend(_forget_open_sidecars())
    for hook in list(_AFTER_FORK.values()):
        hook()


os.register_at_fork(after_in_child=_after_fork_in_child)
