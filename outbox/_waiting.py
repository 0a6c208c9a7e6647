"""Waiting for the buffer without spinning: for room under the ``block`` policy (a thread, or
a coroutine that must not block its loop), and for progress (``aflush``).  Off the hot path:
``emit_async`` comes here only under ``block``; a thread that blocks in ``emit`` waits in
``Buffer.put``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from ._buffer import Buffer, Reason

__all__ = ["put_async", "wait_async"]


async def put_async(buf: Buffer, event: Any, nbytes: int, deadline: float) -> int:
    """Offer an event, waiting for room until ``deadline`` without blocking the running loop
    (``emit_async`` under ``block``).  Returns what :meth:`Buffer.put_locked` returns (0:
    refused, and counted)."""
    with buf.lock:
        if buf.closed:
            buf.refuse_locked()
            return 0
        result = buf.put_locked(event, nbytes)
        if not result and nbytes > buf.max_bytes:
            buf.drop_offered_locked(Reason.TOO_LARGE)
            return 0
    while not result:
        await wait_async(buf, lambda: buf.closed or buf.has_room_locked(nbytes), deadline)
        with buf.lock:
            if buf.closed:
                buf.drop_offered_locked(Reason.DROPPED_SHUTDOWN)
                return 0
            result = buf.put_locked(event, nbytes)
            if not result and time.monotonic() >= deadline:
                buf.drop_offered_locked(Reason.DROPPED_FULL)
                return 0
    return result


async def wait_async(buf: Buffer, ready: Callable[[], bool], deadline: float) -> bool:
    """Wait, without blocking the running loop, until ``ready()`` (checked under the buffer's
    lock) or ``deadline``.  Returns ``ready()``."""
    loop = asyncio.get_running_loop()
    while True:
        future: asyncio.Future[None] = loop.create_future()

        def waiter(future: asyncio.Future[None] = future) -> None:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(_resolve, future)

        with buf.lock:
            if ready():
                return True
            buf.async_waiters.add(waiter)
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                with buf.lock:
                    return ready()
            try:
                await asyncio.wait_for(future, remaining)
            except TimeoutError:
                with buf.lock:
                    return ready()
        finally:
            with buf.lock:
                buf.async_waiters.discard(waiter)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
