"""Waiting for the buffer without spinning: for room under the ``block`` policy (a thread, or
a coroutine that must not block its loop), and for progress (``flush``, ``aflush``).  Off the hot path:
``emit_async`` comes here only under ``block``; a thread that blocks in ``emit`` waits in
``Buffer.put``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._buffer import REFUSED, Buffer, Reason

if TYPE_CHECKING:
    from .._worker._fanout import FanOut

__all__ = ["flush_target", "put_async", "settled", "settled_async", "wait_async"]


async def put_async(buf: Buffer, event: Any, nbytes: int, deadline: float) -> int:
    """Offer an event, waiting for room until ``deadline`` without blocking the running loop
    (``emit_async`` under ``block``).  Returns what :meth:`Buffer.put_locked` returns
    (``REFUSED``: refused, and counted)."""
    with buf.lock:
        if buf.holdings.closed:
            buf.refuse_locked()
            return REFUSED
        result = buf.put_locked(event, nbytes)
        if not result and nbytes > buf.holdings.max_bytes:
            buf.drop_offered_locked(Reason.TOO_LARGE)
            return REFUSED
        if not result:
            buf.wake_for_room()  # (as ``Buffer.put`` does before it waits, the lock held)
    while not result:
        await wait_async(
            buf,
            lambda: (
                buf.holdings.closed
                or (buf.holdings.has_room_locked(nbytes) and not buf.holdings.held_back_locked(nbytes))
            ),
            deadline,
        )
        with buf.lock:
            if buf.holdings.closed:
                buf.drop_offered_locked(Reason.DROPPED_SHUTDOWN)
                return REFUSED
            result = buf.put_locked(event, nbytes)
            if not result and time.monotonic() >= deadline:
                # As ``Buffer.put`` counts it: ``dropped_spill_full`` while the spill is full.
                buf.drop_offered_locked(buf.full_reason)
                return REFUSED
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
            buf.watch_locked(waiter)
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
                buf.watch_locked(waiter, watching=False)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def flush_target(buf: Buffer, wake: Callable[[], None]) -> int | None:
    """Ask the worker (woken by ``wake``) to send everything emitted so far now: the sequence
    number to wait for, or None if nothing is pending."""
    with buf.lock:
        target = buf.holdings.next_seq - 1
        if buf.holdings.lowest_unsettled_locked() > target:
            return None
        buf.ask_flush_locked(target)
    wake()
    return target


def settled(buf: Buffer, target: int | None, members: FanOut | None, deadline: float) -> bool:
    """``flush``'s wait, until ``deadline``: every event of ``buf`` up to ``target`` (None:
    none pending) settled, then, for a composite, what each member was handed (now each
    member's own sending).  Whether they all were in time."""
    if target is not None and not _settled_by(buf, target, deadline):
        return False
    if members is None:
        return True
    return all(_settled_by(b, t, deadline) for b, t in members.flush_targets())


async def settled_async(buf: Buffer, target: int | None, members: FanOut | None, deadline: float) -> bool:
    """:func:`settled` without blocking the running loop (``aflush``)."""
    if target is not None and not await wait_async(buf, _settled_past(buf, target), deadline):
        return False
    if members is None:
        return True
    for member_buf, member_target in members.flush_targets():
        if not await wait_async(member_buf, _settled_past(member_buf, member_target), deadline):
            return False
    return True


def _settled_past(buf: Buffer, target: int) -> Callable[[], bool]:
    return lambda: buf.holdings.lowest_unsettled_locked() > target


def _settled_by(buf: Buffer, target: int, deadline: float) -> bool:
    """Wait until every event of ``buf`` up to ``target`` is settled, or ``deadline``."""
    with buf.lock:
        while buf.holdings.lowest_unsettled_locked() <= target:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            buf.progress.wait(remaining)
    return True
