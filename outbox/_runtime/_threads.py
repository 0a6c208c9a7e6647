"""The outbox's own threads: each blocks the signals the application handles, and none
keeps the interpreter from exiting (the sidecar's, the resolver's, the adapter's, the
signal closer's)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["DaemonExecutor", "block_async_signals", "read_when_done"]

# Signals a process gets from outside (kill, a terminal, a timer).  Our threads block them, so
# the kernel delivers them to a thread of the application, normally the main thread, where
# Python runs its handlers: delivered to a thread of ours, they would leave a main thread
# that is blocked in a system call (sleep, a lock, a socket) unaware until that call ends.
_ASYNC_SIGNALS = {
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD")
    if hasattr(signal, name)
}


def block_async_signals() -> None:
    """Block, in the calling thread (and the threads it starts), the signals an application
    handles; call it first thing in every thread the outbox starts."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)


def read_when_done(future: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """``future``, whose exception, if one comes, is read then, whoever awaits it: a round
    that ends first (its deadline, or cancelled by the worker's) leaves it unread, and asyncio
    would log it raw as "Future exception was never retrieved" (a transport's exception can
    quote a token; the round has already answered for it)."""
    future.add_done_callback(_read)
    return future


def _read(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """The sidecar loop's default executor: at most 4 daemon threads, never joined at exit.

    ``ThreadPoolExecutor``'s threads are joined when the interpreter exits, so one
    ``getaddrinfo`` stuck on an unresolvable broker name kept the process alive for
    seconds after ``close()``.  (asyncio requires a ``ThreadPoolExecutor``; this one uses
    none of its machinery.)
    """

    _MAX_THREADS = 4

    def __init__(self, name: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self._name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = 0
        self._count = 0
        self._guard = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((future, fn, args, kwargs))
        with self._guard:
            if self._idle == 0 and self._count < self._MAX_THREADS:
                self._count += 1
                thread = threading.Thread(target=self._run, name=f"{self._name}-{self._count}", daemon=True)
                thread.start()
        return future

    def _run(self) -> None:
        block_async_signals()
        while True:
            with self._guard:
                self._idle += 1
            job = self._jobs.get()
            with self._guard:
                self._idle -= 1
            if job is None:
                return
            future, fn, args, kwargs = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        # Never waits: a resolver thread stuck in getaddrinfo must not hold anyone.
        for _ in range(self._count):
            self._jobs.put(None)
