"""The sidecar's worker, the conductor of the parts: it takes events from the buffer (the intake),
holds them by key (the backlog), keeps lanes of requests in flight (as many as the lanes allow,
each answered and settled on its own), and paces attempts while the backend fails (the
breaker).  It runs as one asyncio task; it wakes when a batch is due, when a lane answers, when
a retry's time has come, or when a flush or close asks it to; it never polls for events.

The path of one event: ``emit`` queues it in the buffer; the intake takes it (when a batch is
full, its linger is over, or a flush or close wants it), serializes it and hands it to the
backlog, behind its run's earlier events; when its key is at the front and not muted, a lane
takes it with its run's other events; the transport answers; the backlog settles it
(delivered, or refused for good, or poison), or keeps it at its key's head to be sent again
after a backoff; the buffer's accounts follow.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from typing import Any

from .._buffer._buffer import Buffer, Reason, count_held_locked
from .._buffer._numbering import DELIVERED
from .._config._settings import WorkerSettings
from .._observability._deadletter import DeadLetter
from .._observability._log import RateLimitedLog, logger
from .._runtime._slices import Slicer
from .._spill import Spill
from ..transports._base import Outcome, Transport
from ._backlog import Settled
from ._dispatch import Answer, Dispatch, Lane
from ._held import Held
from ._intake import Intake
from ._retry import CircuitState, backoff_delay
from ._sender import attempt

__all__ = ["CLOSE_GRACE", "CircuitState", "Worker", "backoff_delay"]


_INF = float("inf")
# What close() may take beyond its deadline: cancelling the lanes, closing the transport.
CLOSE_GRACE = 0.4
# Of which closing the transport may take this much.
TRANSPORT_CLOSE_GRACE = 0.3
# How long lanes cut by the close deadline get to settle (a transport that swallows the
# cancellation gets a moment, not close's grace).
_SETTLE_CANCELLED = 0.05
# While a request is on the wire, or a retry waits, the worker looks at the queue this often
# (objects may come, and emit does not wake it for each).
_LOOK_AGAIN = 0.05
# How long new requests get to go out before the worker serializes the next batches.  A request
# needs the loop for a moment to be written (connection, headers, a body larger than the
# socket's buffer); serializing holds the loop for milliseconds, and with it the rest of the
# request, which the backend would wait for: one lane would send and serialize in turn.
_ON_THE_WIRE = 0.001
# The fewest events the backlog takes ahead of the lanes (a batch size of 1 must not leave a
# refused event the only thing to send).
_MIN_LOOKAHEAD = 64
# Events a step of the sidecar's per-batch work handles between two checkpoints, where a step
# is not one per key (a batch into the backlog, a settled lane freed): each is some tens of
# microseconds, where a batch whole held the GIL for hundreds (#37: the whole invocation).
_PIECE = 64


class Worker:
    def __init__(
        self,
        buffer: Buffer,
        transport: Transport,
        settings: WorkerSettings,
        metrics: Any,
        dead_letter: DeadLetter | None = None,
        spill: Spill | None = None,
        log_prefix: str = "",
    ) -> None:
        self.buffer = buffer
        self.spill = spill
        self.transport = transport
        self.settings = settings
        self.metrics = metrics
        self.dead_letter = dead_letter
        self.log = RateLimitedLog(settings.log_interval, prefix=log_prefix)
        self.wakeup = asyncio.Event()
        #: A wake-up is on its way to the loop (``_sidecar._waker``): emitters send no other.
        self.wake_pending = False
        hint = getattr(transport, "lane_events", None)
        self.dispatch = Dispatch(
            max_batch_events=settings.max_batch_events,
            max_batch_bytes=settings.max_batch_bytes,
            max_concurrency=settings.max_concurrency,
            backoff_base=settings.backoff_base,
            backoff_cap=settings.backoff_cap,
            circuit_threshold=settings.circuit_threshold,
            poison_attempts=settings.poison_attempts,
            max_retry_after=settings.max_retry_after,
            lane_events=hint if isinstance(hint, int) else None,
        )
        self.backlog = self.dispatch.backlog
        #: Ends the worker's slices of per-event work (off in attached mode: see ``_runtime._slices``).
        self.slicer = Slicer(buffer, behind_above=settings.max_batch_events)
        self.intake = Intake(
            buffer,
            max_batch_events=settings.max_batch_events,
            max_batch_bytes=settings.max_batch_bytes,
            linger=settings.linger,
            slicer=self.slicer,
            log=self.log,
            dead_letter=dead_letter,
            lowest_held=self.backlog.lowest_seq,
        )
        # At each slice's end, the intake samples what queued objects weigh (a long period of
        # work cannot leave the estimate stale); the backlog's per-batch loops pause per key.
        self.slicer.on_handoff, self.backlog.keys.pause = self.intake.sample, self.slicer.pause
        #: Set once the drain loop runs (a thread that builds an outbox waits for it: see
        #: Sidecar.start_thread).
        self.ready = threading.Event()
        self.last_error: str | None = None
        self.errors = 0  # unexpected errors caught (the worker goes on after each)
        self.closing = self.done = False
        self._in_flight: dict[asyncio.Future[list[Outcome]], Lane] = {}
        self._due_in = _INF
        self._deadline = _INF
        self._drain_task: asyncio.Task[None] | None = None
        self._deadline_handle: asyncio.TimerHandle | None = None
        self._logged_drops: dict[str, int] = {}

    @property
    def circuit(self) -> CircuitState:
        return self.dispatch.breaker.circuit

    # -- control, called in the worker's loop -------------------------------------------------

    def wake(self) -> None:
        self.wake_pending = False
        self.wakeup.set()

    def begin_close(self, deadline: float) -> None:
        """Stop lingering and drain until ``deadline`` (a ``time.monotonic()`` value)."""
        self.closing = True
        self._deadline = min(self._deadline, deadline)
        self.dispatch.begin_close(self._deadline)
        if self.spill is not None:
            self.spill.begin_close()  # dead owners' events are delivered by the deadline too
        loop = asyncio.get_running_loop()
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
        # loop.time() is time.monotonic() for the default loops; convert anyway.
        when = loop.time() + (self._deadline - time.monotonic())
        self._deadline_handle = loop.call_at(when, self._on_deadline)
        self.wakeup.set()

    def _on_deadline(self) -> None:
        if self._drain_task is not None and not self._drain_task.done():
            self._drain_task.cancel()

    # -- the task -------------------------------------------------------------------------

    async def run(self) -> None:
        """Drain until closed; then settle what is left and close the transport."""
        self._drain_task = asyncio.create_task(self._supervise(), name="outbox-drain")
        try:
            await asyncio.wait({self._drain_task})
        except asyncio.CancelledError:
            # The loop is going away (attached mode): settle, then let cancellation through.
            self._drain_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain_task
            self._settle_answered(time.monotonic())
            for future in self._in_flight:
                future.cancel()
            self._abandon()
            raise
        finally:
            if self._deadline_handle is not None:
                self._deadline_handle.cancel()
        await self._finish_lanes()
        self._abandon()
        try:
            await asyncio.wait_for(self.transport.aclose(), TRANSPORT_CLOSE_GRACE)
        except BaseException as exc:  # a transport that fails to close must not fail close()
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
            logger.warning("closing the transport failed: %r", exc)
        finally:
            self.done = True

    async def _finish_lanes(self) -> None:
        """The close deadline came: what the lanes that did answer delivered is delivered (the
        rest is counted at shutdown), not lost with the others."""
        self._settle_answered(time.monotonic())
        if not self._in_flight:
            return
        for future in self._in_flight:
            future.cancel()
        await asyncio.wait(set(self._in_flight), timeout=_SETTLE_CANCELLED)
        self._settle_answered(time.monotonic())

    async def _supervise(self) -> None:
        """Run the drain loop; if anything in it raises, keep the events, log the error with
        its traceback, back off and go on.  Only cancellation (the close deadline) ends it."""
        while True:
            try:
                await self._drain()
                return
            except Exception as exc:
                self._recover(exc)

    def _recover(self, exc: Exception) -> None:
        """After an unexpected error of ours: the events stay where they are (in the backlog,
        or in lanes still on the wire), and the next attempt waits out a backoff."""
        self.dispatch.breaker.failed(time.monotonic())
        self.last_error = f"internal error: {type(exc).__name__}: {exc}"
        self.errors += 1
        if self.log.error("internal", "the outbox's worker hit an error and goes on: %r", exc):
            logger.debug("traceback of the worker's error", exc_info=exc)
        if self.errors == 1:  # the first one in full, whatever the rate limit
            logger.error("traceback of the outbox worker's first error", exc_info=exc)

    async def _drain(self) -> None:
        self.ready.set()
        while True:
            # Cleared first: a wake-up (an answer, an emit, close) from here on is not lost.
            self.wakeup.clear()
            now = time.monotonic()
            # Between two steps, a checkpoint: a loop's turn that settled an answer, sampled
            # and took a batch held the GIL for 200-300 µs without one (a handler's wait).
            pause = self.slicer.pause
            self._settle_answered(now)
            pause()
            if self.spill is not None:
                self.spill.tick(self.buffer, self.slicer, now)
            self.intake.sample()
            pause()
            self.intake.free_evicted()
            if self._take(now):
                await asyncio.sleep(0)  # answers and the wire between two batches taken
                continue
            if self._start_lanes(now):
                # Their requests out first (_ON_THE_WIRE: a loop's turn while a handler computes
                # without pause, which any wait hands the GIL for 5 ms), then the next batches.
                wait = 0.0 if self.slicer.contended else _ON_THE_WIRE
                await asyncio.wait(set(self._in_flight), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                continue
            spill = self.spill  # (events on disk to read back, or dead owners' to take in)
            busy = self.buffer.holdings.beyond or (spill is not None and spill.has_pending())
            if self.closing and (
                now >= self._deadline
                or not (self._in_flight or self.backlog or self.buffer.holdings.queue or busy)
            ):
                # Done, or out of time: the deadline's cancellation ends the drain too, but
                # asyncio.wait_for (3.11) can swallow a cancellation that races its timeout.
                return
            await self._wait(now)

    # -- in: from the buffer --------------------------------------------------------------------

    def _take(self, now: float) -> bool:
        """Take a batch from the buffer into the backlog if one is due and the lanes have room
        for it.  Returns True if it took (there may be more)."""
        self._due_in = self.intake.due(now, urgent=self.closing)
        if self._due_in > 0:
            return False
        self.backlog.promote(now)
        s, buf = self.settings, self.buffer
        lanes = 1 if self.dispatch.breaker.failing else self.dispatch.lanes.current
        # What the free lanes can take now; and, while the buffer has room to spare, a lookahead
        # of them (the next batches, serialized while the lanes are on the wire, ready
        # when one answers).  An event taken from the buffer can no longer be evicted by
        # drop_oldest: near full, its policy keeps the choice of what is dropped (closing, no
        # emit is accepted any more).  Keys refused wait for their own reasons
        # and do not count, nor do the later events of keys on the wire (no lane can take
        # them); the backlog as a whole stays within twice the lookahead (while the backend
        # fails: two batches).
        free = lanes - len(self._in_flight)
        lookahead = max(_MIN_LOOKAHEAD, lanes * s.max_batch_events)
        backlog = self.backlog
        if len(backlog) >= 2 * lookahead:
            self._due_in = _INF  # no room: the next answer (or retry, or close) wakes the loop
            return False
        ahead_bytes = lanes * s.max_batch_bytes
        if (free <= 0 or (backlog.fresh >= free * s.max_batch_events and backlog.can_send(now))) and (
            backlog.fresh >= lookahead or not (self.closing or self._roomy(lookahead, ahead_bytes))
        ):
            self._due_in = _INF
            return False
        events, nbytes = s.max_batch_events, s.max_batch_bytes
        if self.backlog:
            # Leave a batch's worth of room to the queue: drop_oldest can only evict queued
            # events, and must never have to refuse a new one.
            events = min(events, buf.holdings.max_events - buf.holdings.in_flight - s.max_batch_events)
            nbytes = min(nbytes, buf.holdings.max_bytes - buf.holdings.in_flight_bytes - s.max_batch_bytes)
            if events <= 0 or nbytes <= 0:
                self._due_in = _INF
                return False
        items = self.intake.take(events, nbytes, ahead_bytes)
        if self.spill is not None:  # on disk before any transport sees them
            self.spill.cover(buf, items)
        pause = self.slicer.pause
        for start in range(0, len(items), _PIECE):
            pause()
            self.backlog.add(items[start : start + _PIECE])
        return True

    def _roomy(self, lookahead: int, lookahead_bytes: int) -> bool:
        """Whether the buffer has room to spare for a lookahead taken: less than half full,
        or room for four lookaheads more (read without the lock: an estimate of the fill, which
        only decides how far ahead)."""
        buf = self.buffer
        fill, held = len(buf.holdings.queue) + buf.holdings.in_flight, buf.holdings.held_bytes_locked()
        return (2 * fill < buf.holdings.max_events or fill + 4 * lookahead <= buf.holdings.max_events) and (
            2 * held < buf.holdings.max_bytes or held + 4 * lookahead_bytes <= buf.holdings.max_bytes
        )

    # -- out: lanes -----------------------------------------------------------------------

    def _start_lanes(self, now: float) -> bool:
        """Put the lanes the dispatch chose on the wire.  Returns True if any went."""
        more = len(self.buffer.holdings.queue) >= self.settings.max_batch_events
        lanes = self.dispatch.next_lanes(now, len(self._in_flight), more)
        for lane in lanes:
            future = asyncio.ensure_future(self._send(lane.items))
            future.add_done_callback(self._answered)
            self._in_flight[future] = lane
        return bool(lanes)

    def _answered(self, future: asyncio.Future[list[Outcome]]) -> None:
        self.wakeup.set()

    async def _send(self, items: list[Held]) -> list[Outcome]:
        give_up = time.monotonic() + self.settings.send_timeout
        return await attempt(self.transport, items, min(give_up, self._deadline), self.log, give_up)

    async def _wait(self, now: float) -> None:
        timeout = min(self._due_in, self.dispatch.next_wake(now, len(self._in_flight)))
        timeout = self.intake.sample_wait(timeout, _LOOK_AGAIN if self._in_flight or self.backlog else _INF)
        if self.spill is not None:
            timeout = min(timeout, self.spill.due(self.buffer, now))
        if self.closing:
            timeout = min(timeout, max(0.0, self._deadline - now))
        if timeout <= 0:
            await asyncio.sleep(0)
            return
        if timeout == _INF:
            await self.wakeup.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wakeup.wait(), max(0.0, timeout))

    # -- answers --------------------------------------------------------------------------

    def _settle_answered(self, now: float) -> None:
        for future in [f for f in self._in_flight if f.done()]:
            lane = self._in_flight.pop(future)
            if future.cancelled() or future.exception() is not None:
                # Cut by the close deadline (or broken by us): its outcome is unknown; its
                # events stay held, and are counted at shutdown if they go no further.
                self.dispatch.release(lane, now)
                continue
            self._apply(lane, future.result(), now)
            self._free(lane)
        self._log_drops()

    def _free(self, lane: Lane) -> None:
        """Let go of a settled lane's events in pieces, between checkpoints: the last
        references to a batch's events and bodies (freeing them whole held the GIL for
        hundreds of microseconds)."""
        items, lane.items = lane.items, []
        if sys.getrefcount(items) > 2:  # (held elsewhere still: this is not the last reference)
            return
        pause = self.slicer.pause
        while items:
            pause()
            del items[-_PIECE:]

    def _apply(self, lane: Lane, outcomes: list[Outcome], now: float) -> None:
        """Settle one lane by its answer: the buffer's accounts, the dead letters, the logs."""
        answer = self.dispatch.answer(lane, outcomes, now, time.thread_time())
        verdict, settled = answer.verdict, answer.settled
        self._report(answer)
        lost = dict(verdict.lost)
        dead: list[tuple[str, str, bytes | None, Any]] = []
        for item, outcome in settled.rejected:
            dead.append((outcome.reason or Reason.REJECTED_BY_BACKEND, outcome.detail, item.event.body, None))
        for item, outcome in settled.poison:
            lost[Reason.POISON] = lost.get(Reason.POISON, 0) + 1
            detail = outcome.detail or outcome.reason
            dead.append((Reason.POISON, detail, item.event.body, None))
            self.log.error(
                "poison",
                "an event of run %s failed %d times alone while the backend took others; "
                "dropped as poison: %s",
                item.event.run_id,
                self.settings.poison_attempts,
                detail,
            )
        try:
            # Recorded before the buffer settles: a flush() that returns has the batch's metric.
            self.metrics.batch_sent(
                now - lane.sent_at, len(settled.delivered), verdict.retries, sum(lost.values())
            )
        finally:  # and settled whatever the metric does (its error is the supervisor's to log)
            self._settle_buffer(settled, verdict.retries, lost, dead)

    def _settle_buffer(
        self,
        settled: Settled,
        retries: int,
        lost: dict[str, int],
        dead: list[tuple[str, str, bytes | None, Any]],
    ) -> None:
        settled_n = len(settled.delivered) + len(settled.rejected) + len(settled.poison)
        buf = self.buffer
        with buf.lock:
            if buf.finalized:
                return
            buf.record_answer_locked(len(settled.delivered), retries)
            for reason, n in lost.items():
                buf.count_locked(reason, n)
            if buf.holdings.journal is not None:  # (the spill's log of what became of each number)
                buf.holdings.note_each_locked((item.seq for item in settled.delivered), DELIVERED)
                for item, outcome in settled.rejected:
                    buf.holdings.note_locked(
                        item.seq, item.seq + 1, outcome.reason or Reason.REJECTED_BY_BACKEND
                    )
                buf.holdings.note_each_locked((item.seq for item, _ in settled.poison), Reason.POISON)
            if settled_n:
                buf.settle_locked(settled_n, settled.size, self.backlog.lowest_seq())
        if dead and self.dead_letter is not None:
            self.dead_letter.write(dead)

    def _report(self, answer: Answer) -> None:
        verdict = answer.verdict
        error = verdict.error
        reason = (error.detail or error.reason) if error is not None else None
        if error is not None:
            self.last_error = reason
        for asked in self.dispatch.capped:
            self.log.warning(
                "retry-after-capped",
                "the backend asked to wait %.6g s (Retry-After); waiting max_retry_after (%g s) instead",
                asked,
                self.settings.max_retry_after,
            )
        self.dispatch.capped.clear()
        if answer.opened:
            self.log.warning(
                "circuit",
                "%d attempts in a row failed; backing off (last error: %s)",
                self.dispatch.breaker.failures,
                reason,
            )
        if answer.failed_for is not None:
            self.log.warning(
                "retry",
                "could not deliver %d event(s), retrying in %.2f s: %s",
                verdict.retries,
                answer.failed_for,
                reason,
            )
        if verdict.lost:
            self.log.warning(
                "rejected",
                "the backend rejected %d event(s) for good: %s",
                sum(verdict.lost.values()),
                reason,
            )

    def _log_drops(self) -> None:
        with self.buffer.lock:
            dropped = dict(self.buffer.dropped)
        if dropped != self._logged_drops:
            new = {k: v - self._logged_drops.get(k, 0) for k, v in dropped.items()}
            new = {k: v for k, v in new.items() if v}
            if new and self.log.warning("drops", "lineage events lost since last report: %s", new):
                self._logged_drops = dropped

    def _abandon(self) -> None:
        """Count everything still held as lost to shutdown, but what is in the spill directory
        for the next process: that is ``spilled_at_close``."""
        buf = self.buffer
        on_disk = self.spill.close(buf) if self.spill is not None else 0
        self.backlog.drain()
        with buf.lock:  # (the close's account, one line, says what became of them: _sidecar)
            if not buf.finalized:
                count_held_locked(buf, on_disk, Reason.DROPPED_SHUTDOWN)
                buf.notify_locked()
