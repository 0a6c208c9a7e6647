"""The sidecar's worker: takes batches from the buffer, serializes them, ships them
through the transport, retries with backoff, and settles every event's fate.

It runs as one asyncio task.  It wakes when a batch is full, when the linger
time of the oldest queued event has passed, or when a flush or close asks it to;
it never polls.  At most one batch is in flight, and a batch that must be retried
goes out again before anything newer: that is what keeps each run's events in
order (the transport keeps order within a batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from ._buffer import Buffer, Reason
from ._deadletter import DeadLetter
from ._log import RateLimitedLog, logger
from ._serde import SerializedEvent, serialize
from ._slices import SLICE as _SLICE
from ._slices import Slicer
from .transports._base import DELIVERED, Outcome, OutcomeKind, Transport

__all__ = ["CircuitState", "Worker", "WorkerSettings", "backoff_delay"]

_INF = float("inf")
# What close() may take beyond its deadline: cancelling the send, closing the transport.
CLOSE_GRACE = 0.4
# Of which closing the transport may take this much.
TRANSPORT_CLOSE_GRACE = 0.3
# How long a new send gets to put its request on the wire before the worker serializes the
# next batch (serializing holds the loop, and the GIL, for a few milliseconds).
_PREFETCH_AFTER = 0.001
# Below this many seconds before the close deadline the worker stops sending.
_NO_TIME_LEFT = 0.1
# During close, the last paced attempt starts at least this long before the deadline, so
# that a backend that came back gets the events in time.
_LAST_ATTEMPT_LEAD = 0.25
# During close, no retry waits longer than this (the server's Retry-After included).
_CLOSE_BACKOFF_CAP = 1.0
# During close, attempts pulled forward by the deadline stay at least this far apart.
_MIN_CLOSE_GAP = 0.1
# Objects are counted at an estimate of their size until the worker serializes them: while
# objects wait in the queue, the newest (at most _SAMPLE_MOST of the last _SAMPLE_SPAN) are
# measured every _SAMPLE_INTERVAL, so that events that grow are re-priced within it.
_SAMPLE_INTERVAL = 0.01
_SAMPLE_MOST = 4
_SAMPLE_SPAN = 64
# While a request is on the wire, or a retry waits, the worker looks at the queue this often.
_LOOK_AGAIN = 0.05
# Lanes to start with (then: doubling while the latency holds, halving on overload).
_FIRST_LANES = 4
# A round in which the sending thread was on the CPU for more than this share of its time
# was limited by that CPU, not by the backend's latency: fewer lanes, not more.
_BUSY_SHARE = 0.5
# Answers that say the backend is overloaded: fewer lanes.
_OVERLOAD = frozenset({"http_429", "http_503", "timeout", "network"})
# How long a round cut by the close deadline gets to settle the lanes that did answer.
_SETTLE_CANCELLED = 0.05
# Exponent cap of the backoff: 2**62 seconds is already far beyond any cap.
_MAX_EXPONENT = 62


def backoff_delay(attempt: int, base: float, cap: float, retry_after: float | None = None) -> float:
    """Seconds to wait before attempt ``attempt + 1``: exponential backoff with full jitter
    (uniform in ``[0, min(cap, base * 2**(attempt - 1))]``), and never less than what the
    server asked for (``retry_after``).  Defined for any attempt count, however large."""
    exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
    delay = random.uniform(0.0, min(cap, base * float(2**exponent)))
    if retry_after is not None and retry_after > delay:
        delay = retry_after
    return delay


# 5xx answers that may be about an event rather than the backend: Marquez, OpenMetadata and
# DataHub answer 500 to an event they cannot map.  502, 503 and 504 say the backend (or the way
# to it) is down, never that an event is bad.
_POISON_SUSPECT = frozenset(f"http_{code}" for code in range(500, 600) if code not in (502, 503, 504))


def _merged(first: list[_InFlight], second: list[_InFlight]) -> list[_InFlight]:
    """Two lists of held events as one, in sequence order."""
    if not first:
        return second
    if not second:
        return first
    return sorted(first + second, key=_SEQ)  # two sorted runs: timsort merges them in one pass


_SEQ = itemgetter(0)


def _order_key(item: _InFlight) -> str | None:
    """What a run's order is kept by: its run id, else its message key (a job's or a
    dataset's events); None for an event that has neither."""
    return item[1].run_id or item[1].key


_TEXT_TYPES = (str, bytes, bytearray)
_TEXT_CLASSES = frozenset(_TEXT_TYPES)
_EVENT = itemgetter(1)
_SIZE = itemgetter(2)


class CircuitState(enum.Enum):
    #: Sending normally.
    CLOSED = "closed"
    #: Several attempts in a row failed: waiting out the backoff before probing.
    OPEN = "open"
    #: A probe batch is in flight; its result closes or reopens the circuit.
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    max_batch_events: int
    max_batch_bytes: int
    linger: float
    send_timeout: float
    backoff_base: float
    backoff_cap: float
    circuit_threshold: int
    log_interval: float
    max_retry_after: float = 300.0
    poison_attempts: int = 5
    max_concurrency: int = 8


# An event in flight: (sequence number, serialized event, bytes accounted for it).
_InFlight = tuple[int, SerializedEvent, int]


class Worker:
    def __init__(
        self,
        buffer: Buffer,
        transport: Transport,
        settings: WorkerSettings,
        metrics: Any,
        dead_letter: DeadLetter | None = None,
    ) -> None:
        self.buffer = buffer
        self.dead_letter = dead_letter
        self.transport = transport
        self.settings = settings
        self.metrics = metrics
        self.log = RateLimitedLog(settings.log_interval)
        #: Ends the worker's slices of per-event work (off in attached mode: see ``_slices``).
        self.slicer = Slicer(buffer, behind_above=settings.max_batch_events, on_handoff=self._sample)
        self.wakeup = asyncio.Event()
        self.circuit = CircuitState.CLOSED
        self.last_error: str | None = None
        self.failures = 0  # consecutive attempts that delivered nothing
        self.errors = 0  # unexpected errors caught (the worker goes on after each)
        self.closing = False
        self.done = False
        # What the worker holds, oldest first: the batch being sent, events waiting to be
        # retried (always older than anything else), a serialized batch waiting its turn.
        # The batches on the wire (one per lane), each in sequence order.
        self._sending: list[list[_InFlight]] = []
        # When the round on the wire began, by the clock and by this thread's CPU time.
        self._round_started = self._round_cpu = 0.0
        # Lanes: how many batches go at once (adapts between 1 and max_concurrency), the
        # latency that holds, and whether the last window filled every lane.
        self._lane_count = float(min(_FIRST_LANES, settings.max_concurrency))
        self._latency_base: float | None = None
        self._lanes_full = False
        self._slow_start = True
        self._pending: list[_InFlight] = []
        self._ready: list[_InFlight] = []
        self._retry_at = 0.0
        # Poison isolation: events a backend keeps refusing with a 5xx while it takes others.
        self._split_to: int | None = None  # the next retry batch holds at most this many events
        self._blame: dict[int, int] = {}  # seq -> 5xx answers that were about this event alone
        self._first_failure: dict[int, float] = {}  # seq -> when it first got a 5xx
        self._last_delivery = 0.0  # when the backend last took an event
        self._others_turn = True  # alternate: the other runs' events, then the blamed head
        # Whether the retry list holds only events the backend refused with a 5xx that may be
        # about them (not about the backend) while it took others: then the other runs go on
        # in lanes, and the retry list is probed beside them, paced by its own backoff.
        self._suspects_only = False
        self._round_delivered = False  # the last round delivered something
        self._probe_at = 0.0
        self._sampled_at = 0.0  # when the newest queued objects were last measured
        self._sampled_seq = -1  # the newest event then
        self._last_chance = False  # one immediate retry when close begins
        self._deadline = _INF
        self._drain_task: asyncio.Task[None] | None = None
        self._deadline_handle: asyncio.TimerHandle | None = None
        self._logged_drops: dict[str, int] = {}

    # -- control, called in the worker's loop -------------------------------------------------

    def wake(self) -> None:
        self.wakeup.set()

    def begin_close(self, deadline: float) -> None:
        """Stop lingering and drain until ``deadline`` (a ``time.monotonic()`` value)."""
        if not self.closing:
            self.closing = True
            self._last_chance = True
        self._deadline = min(self._deadline, deadline)
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
            self._abandon()
            raise
        finally:
            if self._deadline_handle is not None:
                self._deadline_handle.cancel()
        self._abandon()
        try:
            await asyncio.wait_for(self.transport.aclose(), TRANSPORT_CLOSE_GRACE)
        except BaseException as exc:  # a transport that fails to close must not fail close()
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
            logger.warning("closing the transport failed: %r", exc)
        finally:
            self.done = True

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
        """After an unexpected error: everything the worker held goes back to the retry
        list, oldest first, and waits out a backoff."""
        held: dict[int, _InFlight] = {}
        for item in (*self._pending, *(item for lane in self._sending for item in lane), *self._ready):
            held.setdefault(item[0], item)
        self._pending = sorted(held.values(), key=_SEQ)
        self._sending, self._ready = [], []
        self.failures += 1
        self._retry_at = time.monotonic() + backoff_delay(
            self.failures, self.settings.backoff_base, self.settings.backoff_cap
        )
        self.last_error = f"internal error: {type(exc).__name__}: {exc}"
        self.errors += 1
        if self.log.error("internal", "the outbox's worker hit an error and goes on: %r", exc):
            logger.debug("traceback of the worker's error", exc_info=exc)
        if self.errors == 1:  # the first one in full, whatever the rate limit
            logger.error("traceback of the outbox worker's first error", exc_info=exc)

    def _isolating(self) -> bool:
        """The retry list waits on events the backend refuses (poison suspects) while it takes
        others: isolation goes on beside normal lanes instead of holding every run back."""
        return (
            bool(self._pending)
            and self._suspects_only
            and self._round_delivered
            and not self.failures
            and self.settings.max_concurrency > 1
            and self._deadline - time.monotonic() > _NO_TIME_LEFT
        )

    def _probe_due(self) -> bool:
        """Whether the isolated retry list's next batch may go now (its backoff is over).
        While closing, as in _wait_backoff: one immediate attempt when close begins, then
        waits bounded by a second and by the time left."""
        now = time.monotonic()
        if self.closing:
            if self._last_chance:
                self._last_chance = False
                return True
            latest = min(self._deadline - _LAST_ATTEMPT_LEAD - now, _CLOSE_BACKOFF_CAP)
            if self._probe_at - now > latest:
                self._probe_at = now + max(latest, _MIN_CLOSE_GAP)
        return now >= self._probe_at

    async def _drain(self) -> None:
        while True:
            if self._isolating():
                lanes, probe = self._isolation_round()
                if not lanes:
                    self._sending = []
                    await self._wait_isolation()
                    continue
                await self._round(lanes, probe=probe, isolated=True)
                continue
            if self._pending:
                await self._wait_backoff()
                batch = self._retry_batch()
            elif self._ready:
                batch, self._ready = self._cut(self._ready)
            else:
                taken = await self._next_batch()
                if taken is None:
                    return
                ready = self._serialize(taken)
                if not ready:
                    continue
                batch, self._ready = self._cut(ready)
            if self._deadline - time.monotonic() <= _NO_TIME_LEFT:
                # Too close to the close deadline for a request to finish: wait for it (it
                # cancels this task) rather than spin on attempts that cannot succeed.
                self._pending = _merged(batch, self._pending)
                await asyncio.sleep(self._deadline - time.monotonic() + 1.0)
                continue
            # While attempts fail, one batch at a time (paced by the backoff): lanes are for
            # a backend that keeps up (events it deferred, or others than a poison event, may
            # use them).
            # Held where _recover finds it, should anything raise before the round takes over.
            self._sending = [batch]
            lanes = [batch] if self._pending or self.failures else self._lanes(batch)
            await self._round(lanes)

    async def _round(
        self, lanes: list[list[_InFlight]], probe: list[_InFlight] | None = None, isolated: bool = False
    ) -> None:
        """Send one round (one batch, or one per lane) and settle it, serializing what comes
        next meanwhile.  While the retry list is ``isolated``, ``probe`` is the lane (if any)
        that retries it."""
        self._round_started, self._round_cpu = time.monotonic(), time.thread_time()
        if len(lanes) > 1:
            self._sending = lanes
            sending = asyncio.create_task(self._send_lanes(lanes, probe, isolated), name="outbox-send")
        else:
            # One lane: the window may have grown it (what was serialized, more from the
            # queue): send that lane, not the batch it started from.
            batch = lanes[0]
            self._sending = [batch]
            sending = asyncio.create_task(self._send(batch, probe, isolated), name="outbox-send")
        try:
            # Pipelining: while this batch is on the wire, serialize the next full one.
            # It is sent only after this one settles, so order is kept.
            await asyncio.wait({sending}, timeout=_PREFETCH_AFTER)
            # A bug of ours meanwhile must not cancel the round on the wire (what the backend
            # took would be sent again and counted twice): settle the round, then raise it.
            error: Exception | None = None
            try:
                if not sending.done():
                    self._prefetch()
                while not sending.done():
                    # A slow backend: meanwhile, keep the estimate of what queued objects weigh.
                    self._sample()
                    await asyncio.wait({sending}, timeout=self._sample_wait(_INF, _LOOK_AGAIN))
            except Exception as exc:
                error = exc
            await sending
            if error is not None:
                raise error
        finally:
            if not sending.done():
                sending.cancel()
                # Let it settle what did answer before whoever cancelled us counts the rest (a
                # transport that swallows the cancellation gets a moment, not close's grace).
                await asyncio.wait({sending}, timeout=_SETTLE_CANCELLED)
        self._log_drops()

    def _prefetch(self) -> None:
        if self._ready or self._pending:
            return
        self._sample(fresh=True)
        buf, s = self.buffer, self.settings
        with buf.lock:
            if (
                buf.in_flight + s.max_batch_events >= buf.max_events
                or buf.in_flight_bytes + s.max_batch_bytes >= buf.max_bytes
            ):
                # Leave queued events for drop_oldest to evict: only the queue can make room.
                return
            if not (
                self.closing
                or len(buf.queue) >= s.max_batch_events
                or buf.queued_bytes >= s.max_batch_bytes
                or (buf.queue and buf.flush_target >= buf.head_seq)
            ):
                return
            # With lanes in use, the next window's worth, so it is serialized while this one
            # is on the wire (leaving a batch's worth of room to the queue, for drop_oldest).
            k = int(self._lane_count)
            events = min(k * s.max_batch_events, buf.max_events - buf.in_flight - s.max_batch_events)
            size = min(k * s.max_batch_bytes, buf.max_bytes - buf.in_flight_bytes - s.max_batch_bytes)
            taken = buf.take_locked(events, size) if k > 1 and events > 0 and size > 0 else []
            if not taken:
                taken = buf.take_locked(s.max_batch_events, s.max_batch_bytes)
        if taken:
            self._ready = self._serialize(taken, max(1, int(self._lane_count)))

    async def _next_batch(self) -> list[tuple[int, Any, int]] | None:
        """Wait for a batch worth sending; None once closing and the buffer is empty."""
        buf, s = self.buffer, self.settings
        linger_until = _INF
        while True:
            # Objects wait counted at an estimate (at once for the first one: then it is a
            # guess); measure the newest, so that a batch is taken at their true weight.
            self._sample(fresh=True)
            with buf.lock:
                if buf.side:
                    buf.fold_side_locked()  # emitted from a signal handler
                queue = buf.queue
                if queue:
                    urgent = self.closing or buf.flush_target >= buf.head_seq
                    if linger_until == _INF:
                        linger_until = time.monotonic() + s.linger
                    if (
                        urgent
                        or len(queue) >= s.max_batch_events
                        or buf.queued_bytes >= s.max_batch_bytes
                        or time.monotonic() >= linger_until
                    ):
                        buf.wake_at_events = buf.wake_at_bytes = _INF
                        return buf.take_locked(s.max_batch_events, s.max_batch_bytes)
                    buf.wake_at_events = s.max_batch_events
                    buf.wake_at_bytes = s.max_batch_bytes
                    timeout: float | None = max(0.0, linger_until - time.monotonic())
                elif self.closing:
                    return None
                elif s.linger > 0:
                    # Look again after the linger rather than be woken by the next event: a
                    # wake-up is a syscall on the emitting thread, and hands this thread the
                    # GIL in the middle of the caller's work.  An event emitted meanwhile
                    # still goes within the linger.  (Idle, that is ten looks a second.)
                    buf.wake_at_events, buf.wake_at_bytes = s.max_batch_events, s.max_batch_bytes
                    linger_until = time.monotonic() + s.linger
                    timeout = s.linger
                else:
                    buf.wake_at_events, buf.wake_at_bytes = 1, _INF
                    timeout = None
                # Cleared under the lock: a wake-up posted after this point is not lost.
                self.wakeup.clear()
            timeout = self._sample_wait(_INF if timeout is None else timeout)
            if timeout == _INF:
                await self.wakeup.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wakeup.wait(), timeout)

    def _sample_wait(self, timeout: float, look_again: float = _INF) -> float:
        """``timeout`` shortened to the next sampling of the queued objects, if any wait, else
        to ``look_again`` (objects may come meanwhile: emit does not wake the worker for them)."""
        if not self.buffer.estimated:
            return min(timeout, look_again)
        return min(timeout, max(0.0, self._sampled_at + _SAMPLE_INTERVAL - time.monotonic()))

    def _sample(self, fresh: bool = False) -> None:
        """Measure the newest queued objects, if new ones came since the last look and the
        sampling interval has passed (at once for the very first object, and when ``fresh``:
        before events are taken, at the price they count for): ``emit`` counts an object at
        a running estimate of their size, so that it never serializes; the worker keeps that
        estimate true.  They are serialized in place (the work is not lost), and
        when they weigh more than estimated, every queued object is re-priced at once and the
        byte bound enforced by the policy."""
        buf = self.buffer
        now = time.monotonic()
        picked: list[tuple[int, Any]] = []
        with buf.lock:
            if not buf.estimated or (
                buf.measured and not fresh and now < self._sampled_at + _SAMPLE_INTERVAL
            ):
                return
            queue, sizes = buf.queue, buf.sizes
            newest = buf.next_seq - 1
            if newest == self._sampled_seq:
                return
            self._sampled_at, self._sampled_seq = now, newest
            head, index = buf.head_seq, len(queue) - 1
            stop = max(-1, index - _SAMPLE_SPAN)
            while index > stop and len(picked) < _SAMPLE_MOST:
                if not sizes[index]:
                    picked.append((head + index, queue[index]))
                index -= 1
        # In one stretch, without hand-offs (a few events: its length is bounded by what they
        # weigh), so that the estimate is learnt from them at once: a flood of grown events
        # would otherwise go on at the old estimate while the sidecar waits for the GIL.
        done: list[tuple[int, Any, SerializedEvent]] = []
        started = time.perf_counter()
        for seq, event in picked:
            try:
                done.append((seq, event, serialize(event)))
            except Exception:  # left as it is: the send path counts it as invalid_event
                continue
            if time.perf_counter() - started > _SLICE:
                break
        if not done:
            return
        with buf.lock:
            total = count = 0
            queue = buf.queue
            for seq, event, ser in done:
                index = seq - buf.head_seq
                if 0 <= index < len(queue) and queue[index] is event:
                    total += buf.replace_locked(index, ser)
                    count += 1
            if count:
                buf.learn_locked(total // count)

    def _retry_batch(self) -> list[_InFlight]:
        """The next batch from the retry list (removed from it).  After a batch got a 5xx as a
        whole, a half of it (bisecting towards the event the backend cannot take); while the
        oldest event is blamed for 5xx answers, every other attempt sends the other runs'
        events instead, so they do not wait behind it (and show the backend takes others)."""
        pending = self._pending
        head = pending[0]
        if head[0] in self._blame:
            self._others_turn = not self._others_turn
            if not self._others_turn:  # it was their turn
                run = head[1].run_id
                others = [item for item in pending[1:] if run is None or item[1].run_id != run]
                # Runs with no blamed event first: they show whether the backend takes others.
                # (A run is taken whole or not at all, so its order holds.)
                blamed = {item[1].run_id for item in pending if item[0] in self._blame}
                fresh = [
                    item for item in others if item[1].run_id not in blamed and item[0] not in self._blame
                ]
                if fresh:
                    others = fresh
                else:
                    # Every other run waiting to be retried is blamed too: newer events from
                    # the queue, then (what the backend does with them is the evidence).
                    go = self._take_unblocked()
                    if go:
                        batch, rest = self._cut(go)
                        if self._split_to is not None and len(batch) > self._split_to:
                            batch, rest = batch[: self._split_to], batch[self._split_to :] + rest
                        self._pending = _merged(rest, self._pending)
                        return batch
                    pending = self._pending  # it may have grown (events of blocked runs)
                if others:
                    batch, _ = self._cut(others)
                    if self._split_to is not None:
                        batch = batch[: self._split_to]
                    sent = {item[0] for item in batch}
                    self._pending = [item for item in pending if item[0] not in sent]
                    return batch
            # The blamed event alone: its answer is about it, nothing else.
            self._pending = [item for item in pending if item is not head]
            return [head]
        batch, rest = self._cut(pending)
        if self._split_to is not None and len(batch) > self._split_to:
            batch, rest = batch[: self._split_to], batch[self._split_to :] + rest
        self._pending = rest
        return batch

    def _take_unblocked(self) -> list[_InFlight]:
        """Events from the queue that may go while the retry list waits on a blamed event:
        those of runs with nothing in the retry list.  The others join the retry list (a run's
        later events never overtake its earlier ones)."""
        buf, s = self.buffer, self.settings
        self._sample(fresh=True)
        with buf.lock:
            taken = buf.take_locked(s.max_batch_events, s.max_batch_bytes) if buf.queue else []
        if not taken:
            return []
        fresh = self._serialize(taken)
        # Runs with events waiting to be retried, or serialized and waiting their turn (older
        # than anything in the queue), are blocked: their newer events must not go first.
        blocked = {_order_key(item) for item in (*self._pending, *self._ready)}
        blocked.discard(None)
        go = [item for item in fresh if _order_key(item) not in blocked]
        wait = [item for item in fresh if _order_key(item) in blocked]
        self._pending = _merged(wait, self._pending)
        return go

    def _cut(self, items: list[_InFlight]) -> tuple[list[_InFlight], list[_InFlight]]:
        """The first batch of ``items`` within ``max_batch_bytes`` and ``max_batch_events``
        (exact sizes: objects were taken by their estimate), and the rest.  Where each
        request carries one event, a batch is what one lane sends at once, so that rounds
        stay short and lanes can be added."""
        s = self.settings
        most = self._lane_most()
        size = 0
        end = 0
        for end, item in enumerate(items):
            size += item[2]
            if end and (size > s.max_batch_bytes or end >= most):
                break
        else:
            return items, []
        return items[:end], items[end:]

    def _serialize(self, batch: list[tuple[int, Any, int]], batches: int = 1) -> list[_InFlight]:
        """Serialize a batch just taken from the queue; should this raise (a bug of ours),
        the batch goes back to the head of the queue first, so nothing it held is lost."""
        try:
            return self._serialize_taken(batch, batches)
        except Exception:
            buf = self.buffer
            with buf.lock:
                if batch and not buf.finalized and not buf.untake_locked(batch):
                    # Newer events were evicted meanwhile: these older ones would have been too.
                    buf.count_locked(Reason.DROPPED_FULL, len(batch))
                    self._settle_locked(len(batch), sum(map(_SIZE, batch)), [])
            raise

    def _serialize_taken(self, batch: list[tuple[int, Any, int]], batches: int = 1) -> list[_InFlight]:
        """Serialize a batch (or a window of ``batches`` batches, for lanes), in slices: between
        two events, the GIL goes to the application's threads once a slice has lasted its
        budget (see ``_slices``: a real hand-off, not a release that is taken back at once)."""
        ready: list[_InFlight] = []
        lost: dict[str, int] = {}
        lost_bytes = 0
        adjust = 0
        sizes = 0
        objects = 0
        limit = self.settings.max_batch_bytes
        window = batches * limit
        total = 0
        untaken: list[tuple[int, Any, int]] = []
        dead: list[tuple[str, str, bytes | None, Any]] = []
        append = ready.append
        buf = self.buffer
        slicer = self.slicer
        slicer.begin()
        checkpoint = slicer.checkpoint
        count = len(batch)
        for position, (seq, event, estimate) in enumerate(batch):
            checkpoint()
            if total > window or (objects and total + (count - position) * (sizes // objects) > 2 * window):
                # Taken by estimate, found larger (or about to be, at the weight of the objects
                # serialized so far): the rest goes back to the queue unserialized, where the
                # policy can shed it (serializing it now would hold it twice in memory).
                untaken = batch[position:]
                break
            cls = event.__class__
            if cls is SerializedEvent:
                ser = event
                is_object = False
            else:
                is_object = cls not in _TEXT_CLASSES and not isinstance(event, _TEXT_TYPES)
                if estimate > limit and not is_object:
                    # Its exact size is known (at least its length in characters): too large
                    # for any batch, so never spend the time (and the GIL) parsing it.
                    lost[Reason.TOO_LARGE] = lost.get(Reason.TOO_LARGE, 0) + 1
                    lost_bytes += estimate
                    self.log.warning(
                        "too_large",
                        "dropping a %d-byte event: larger than max_batch_bytes (%d)",
                        estimate,
                        limit,
                    )
                    dead.append((Reason.TOO_LARGE, f"larger than max_batch_bytes ({limit})", None, event))
                    continue
                try:
                    ser = serialize(event)
                except Exception as exc:
                    lost[Reason.INVALID_EVENT] = lost.get(Reason.INVALID_EVENT, 0) + 1
                    lost_bytes += estimate
                    self.log.warning("invalid", "dropping an event that cannot be serialized: %s", exc)
                    dead.append((Reason.INVALID_EVENT, str(exc), None, event))
                    continue
            size = len(ser.body)
            if is_object:
                sizes += size
                objects += 1
                if size > 2 * buf.estimate and sizes // objects > buf.estimate:
                    # Objects grew: re-price the queue now (and shed by the policy), not once
                    # this batch is done, which may be long with handlers taking the GIL.
                    with buf.lock:
                        buf.learn_locked(sizes // objects)
            if size > limit:
                lost[Reason.TOO_LARGE] = lost.get(Reason.TOO_LARGE, 0) + 1
                lost_bytes += estimate
                self.log.warning(
                    "too_large", "dropping a %d-byte event: larger than max_batch_bytes (%d)", size, limit
                )
                dead.append((Reason.TOO_LARGE, f"larger than max_batch_bytes ({limit})", ser.body, event))
                continue
            adjust += size - estimate
            total += size
            append((seq, ser, size))
        with buf.lock:
            if buf.finalized:
                return []
            if untaken and not buf.untake_locked(untaken):
                lost[Reason.DROPPED_FULL] = lost.get(Reason.DROPPED_FULL, 0) + len(untaken)
                lost_bytes += sum(entry[2] for entry in untaken)
            buf.reprice_in_flight_locked(adjust)
            if objects:
                buf.learn_locked(sizes // objects)
            # An estimate that was short: back within max_bytes by the policy, from the queue;
            # then, if need be, from the newest of this batch (not yet sent).
            over = buf.enforce_bound_locked()
            if over > 0:
                while over > 0 and ready:
                    dropped = ready.pop()
                    over -= dropped[2]
                    lost[Reason.DROPPED_FULL] = lost.get(Reason.DROPPED_FULL, 0) + 1
                    lost_bytes += dropped[2]
            if lost:
                for reason, n in lost.items():
                    buf.count_locked(reason, n)
                self._settle_locked(sum(lost.values()), lost_bytes, ready)
        if dead and self.dead_letter is not None:
            self.dead_letter.write(dead)
        return ready

    def _settle_locked(self, n_events: int, n_bytes: int, also_held: list[_InFlight]) -> None:
        heads = [held[0][0] for held in (*self._sending, self._pending, self._ready, also_held) if held]
        self.buffer.settle_locked(n_events, n_bytes, min(heads) if heads else _INF)

    async def _wait_backoff(self) -> None:
        """Wait until the retry time.  When close begins, one immediate last attempt; while
        closing, the wait is bounded by the time left, so attempts stay paced and the last
        one starts before the deadline."""
        if self._last_chance:
            self._last_chance = False
            return
        while True:
            now = time.monotonic()
            delay = self._retry_at - now
            if self.closing:
                # Bounded by the time left, and by a second: a close has a fixed window, and a
                # backend that comes back within it must not wait out a long backoff.
                latest = min(self._deadline - _LAST_ATTEMPT_LEAD - now, _CLOSE_BACKOFF_CAP)
                if delay > latest:
                    delay = max(latest, _MIN_CLOSE_GAP)
                    self._retry_at = now + delay
            if delay <= 0:
                return
            if self.closing:
                await asyncio.sleep(delay)
                return
            # A backend that is down: meanwhile, keep the estimate of what queued objects weigh.
            self._sample()
            self.wakeup.clear()
            # Wake early only when close begins (it grants one immediate last attempt).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._until_closing(), self._sample_wait(delay, _LOOK_AGAIN))
            if self.closing and self._last_chance:
                self._last_chance = False
                return
            if time.monotonic() >= self._retry_at:
                return

    async def _until_closing(self) -> None:
        while not self.closing:
            await self.wakeup.wait()
            self.wakeup.clear()

    def _lanes(self, batch: list[_InFlight]) -> list[list[_InFlight]]:
        """Several batches to send at once, when the backend keeps up and events wait: a
        window of up to ``lanes`` batches' worth (this one, what is serialized, more from the
        queue) is split by run, each run's events into one lane in order, so a run never has
        two requests in flight.  What does not fit goes back, first in line."""
        k = int(self._lane_count)
        if k <= 1:
            return [batch]
        window = self._fill(_merged(batch, self._ready), k)
        # No more lanes than the window fills (a lane per batch's worth, the last one partly
        # filled, or per a few events where each request carries one).
        k = min(k, max(1, -(-len(window) // self._min_lane())))
        lanes, rest = self._pack(window, k)
        self._ready = sorted(rest, key=_SEQ)
        self._lanes_full = bool(rest) or len(window) >= int(self._lane_count) * self._min_lane()
        return lanes

    def _fill(self, window: list[_InFlight], k: int, also: list[_InFlight] | None = None) -> list[_InFlight]:
        """``window`` (what was serialized and waiting) topped up from the queue to ``k``
        batches' worth, serialized.  Until the round takes over, it is held where _recover
        finds it (with ``also``, the retry list's batch)."""
        s = self.settings
        self._ready = []
        held = [also] if also is not None else []
        self._sending = [window, *held]
        want = k * s.max_batch_events - len(window)
        if want > 0:
            buf = self.buffer
            self._sample(fresh=True)
            with buf.lock:
                # Leave a batch's worth of room to the queue, as _prefetch does: drop_oldest
                # can only evict queued events, and must never have to refuse a new one.
                events = min(want, buf.max_events - buf.in_flight - s.max_batch_events)
                size = min(k * s.max_batch_bytes, buf.max_bytes - buf.in_flight_bytes - s.max_batch_bytes)
                taken = buf.take_locked(events, size) if buf.queue and events > 0 and size > 0 else []
            if taken:
                window = _merged(window, self._serialize(taken, k))
                self._sending = [window, *held]
        return window

    def _pack(self, window: list[_InFlight], k: int) -> tuple[list[list[_InFlight]], list[_InFlight]]:
        """At most ``k`` lanes from ``window``, and what did not fit."""
        s = self.settings
        # A run's events stay together (a job's or dataset's events, which have no run, by
        # their key), runs in the order of their first event; lanes are filled one after the
        # other, so they are full and nothing is left for a round of its own.  Which lane a
        # run takes may change from round to round: a round starts when the last one settled.
        groups: dict[Any, list[_InFlight]] = {}
        self.slicer.begin()
        checkpoint = self.slicer.checkpoint
        for position, item in enumerate(window):
            if not position & 63:
                checkpoint()
            key: Any = item[1].run_id or item[1].key
            if key is None:
                key = item[0]  # neither run nor key: an event of its own
            group = groups.get(key)
            if group is None:
                groups[key] = [item]
            else:
                group.append(item)
        # Spread evenly: a lane need not carry more than its share (where each request carries
        # one event, a lane's events go a few at a time, so a full lane would be a long one).
        most, limit = min(self._lane_most(), max(1, -(-len(window) // k))), s.max_batch_bytes
        lanes: list[list[_InFlight]] = []
        rest: list[_InFlight] = []
        lane: list[_InFlight] = []
        lane_bytes = 0
        for group in groups.values():
            checkpoint()
            if len(lanes) == k:
                rest += group
                continue
            size = sum(map(_SIZE, group))
            if lane and (len(lane) + len(group) > most or lane_bytes + size > limit):
                lanes.append(lane)
                lane, lane_bytes = [], 0
                if len(lanes) == k:
                    rest += group
                    continue
            if len(group) > most or size > limit:  # a run larger than a lane: its head goes
                head, tail = self._cut(group)
                lanes.append(head)
                rest += tail
                continue
            lane += group
            lane_bytes += size
        if lane:
            if len(lanes) < k:
                lanes.append(lane)
            else:
                rest += lane
        for lane in lanes:
            lane.sort(key=_SEQ)  # settling reads a lane's first event as its oldest
        return lanes, rest

    def _isolation_round(self) -> tuple[list[list[_InFlight]], list[_InFlight] | None]:
        """One round while the retry list is isolated: the retry list's next batch (when its
        backoff is over) as one lane, the other runs' events in the others.  A run with an
        event in the retry list is held back whole (its newer events join the retry list)."""
        # Runs waiting in the retry list only because they were in line behind a refused
        # event (none of their events was refused) go back to the lanes, in order.
        suspects = {_order_key(item) for item in self._pending if item[0] in self._first_failure}
        suspects.discard(None)
        held = [i for i in self._pending if i[0] in self._first_failure or _order_key(i) in suspects]
        released = [
            i for i in self._pending if not (i[0] in self._first_failure or _order_key(i) in suspects)
        ]
        # Released events wait in the ready list while the retry list's batch is drawn: newer
        # events of their runs that it may take from the queue must see them there.
        self._pending = held
        self._ready = _merged(released, self._ready)
        probe = self._retry_batch() if self._pending and self._probe_due() else None
        k = max(1, int(self._lane_count) - (1 if probe else 0))
        window = self._fill(self._ready, k, probe or [])
        blocked = {_order_key(item) for item in (*self._pending, *(probe or ()))}
        blocked.discard(None)
        go = [item for item in window if _order_key(item) not in blocked]
        if len(go) < len(window):
            self._pending = _merged([item for item in window if _order_key(item) in blocked], self._pending)
        lanes, rest = self._pack(go, k) if go else ([], [])
        self._ready = sorted(rest, key=_SEQ)
        return ([probe] if probe else []) + lanes, probe

    async def _wait_isolation(self) -> None:
        """Nothing to send while isolating: wait for events, or for the retry list's turn."""
        buf = self.buffer
        with buf.lock:
            if buf.queue or self._ready:
                return
            buf.wake_at_events, buf.wake_at_bytes = 1, _INF
            self.wakeup.clear()
        self._probe_due()  # while closing, brings the next attempt within the time left
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wakeup.wait(), max(0.0, self._probe_at - time.monotonic()))

    def _lane_most(self) -> int:
        """The most events one lane (or the one batch) carries."""
        s = self.settings
        if 1 <= self._lane_count < s.max_concurrency:
            # While lanes are being added, rounds stay short (a few events per request slot
            # where each request carries one event), so the next round can add more.
            return min(s.max_batch_events, 2 * self._min_lane())
        return s.max_batch_events

    def _min_lane(self) -> int:
        hint = getattr(self.transport, "lane_events", None)
        return hint if isinstance(hint, int) and hint > 0 else self.settings.max_batch_events

    async def _send_lanes(
        self, lanes: list[list[_InFlight]], probe: list[_InFlight] | None = None, isolated: bool = False
    ) -> None:
        """Send the lanes' batches concurrently; settle them one by one when all have
        answered, then adapt the number of lanes: one more while every lane was full and the
        latency holds, half as many after a 429, a 503 or a timeout (AIMD, as Vector's
        adaptive request concurrency)."""
        attempts = [asyncio.ensure_future(self._attempt(lane)) for lane in lanes]
        try:
            answers = await asyncio.gather(*attempts)
        except asyncio.CancelledError:
            # The close deadline cut the round: what the lanes that did answer delivered is
            # delivered (the rest is counted at shutdown), not lost with the others.
            for lane, attempt in zip(lanes, attempts, strict=True):
                if attempt.done() and not attempt.cancelled() and attempt.exception() is None:
                    self._apply(lane, *attempt.result(), bisecting=False)
            raise
        overloaded = False
        slowest = 0.0
        # Deliveries first, so a lane that must be bisected has the last word on the split.
        failed = [outcomes.count(DELIVERED) != len(outcomes) for outcomes, _ in answers]
        results = []
        for i in sorted(range(len(lanes)), key=failed.__getitem__):
            outcomes, elapsed = answers[i]
            slowest = max(slowest, elapsed)
            overloaded = overloaded or (failed[i] and any(o.reason in _OVERLOAD for o in outcomes))
            # While the retry list is isolated, only its own answers move the bisection.
            results.append(
                self._apply(lanes[i], outcomes, elapsed, bisecting=not isolated or lanes[i] is probe)
            )
            if lanes[i] is probe and not results[-1][1]:
                self._probe_at = 0.0  # the retry list's batch went through: the next one now
        self._after_round(results, probe_only=probe is not None and len(lanes) == 1)
        self._adapt(overloaded, slowest)

    def _after_round(self, results: list[tuple[int, int, int]], probe_only: bool = False) -> None:
        """What a round says about the backend, from each lane's (delivered, retries,
        poison suspects among the retries).  A round that only retried isolated events says
        nothing about whether the backend takes the others."""
        if not probe_only:
            self._round_delivered = any(delivered for delivered, _, _ in results)
        if any(retries for _, retries, _ in results):
            self._suspects_only = all(retries == suspects for _, retries, suspects in results)
        elif not self._pending:
            self._suspects_only = False

    def _adapt(self, overloaded: bool, elapsed: float) -> None:
        s = self.settings
        if overloaded:
            self._lane_count = max(1.0, self._lane_count / 2)
            self._slow_start = False
            return
        wall = time.monotonic() - self._round_started
        if wall > 0 and time.thread_time() - self._round_cpu > _BUSY_SHARE * wall:
            # This thread computed (serialized, encoded) for most of the round rather than
            # waiting on the backend: more requests in flight cannot go faster, and cost CPU
            # (a backend on loopback, a local file).  Lanes are for waiting.
            self._lane_count = max(1.0, self._lane_count / 2)
            return
        base = self._latency_base
        self._latency_base = elapsed if base is None else min(elapsed, base * 0.9 + elapsed * 0.1)
        if base is not None and elapsed > 2 * base:
            self._lane_count = max(1.0, self._lane_count - 1)
        elif self._lanes_full and self._lane_count < s.max_concurrency:
            # Doubling until the backend first says it is overloaded (as TCP's slow start),
            # one more at a time after that.
            grown = self._lane_count * 2 if self._slow_start else self._lane_count + 1
            self._lane_count = min(float(s.max_concurrency), grown)

    async def _send(
        self, items: list[_InFlight], probe: list[_InFlight] | None = None, isolated: bool = False
    ) -> None:
        outcomes, elapsed = await self._attempt(items)
        result = self._apply(items, outcomes, elapsed, bisecting=not isolated or items is probe)
        self._after_round([result], probe_only=items is probe)
        if not result[1]:
            self._probe_at = 0.0
        failed = outcomes.count(DELIVERED) != len(outcomes)
        if len(items) >= self._min_lane() or self._lane_count > 1:
            # Enough events for a lane of their own (events wait) or lanes in use: adapt.
            self._lanes_full = len(items) >= 2 * self._min_lane() or (
                len(items) >= self._min_lane() and bool(self._ready or self.buffer.queue)
            )
            self._adapt(failed and any(o.reason in _OVERLOAD for o in outcomes), elapsed)

    async def _attempt(self, items: list[_InFlight]) -> tuple[Sequence[Outcome], float]:
        s = self.settings
        events = list(map(_EVENT, items))
        if self.circuit is CircuitState.OPEN:
            self.circuit = CircuitState.HALF_OPEN
        started = time.monotonic()
        deadline = min(started + s.send_timeout, self._deadline)
        outcomes: Sequence[Outcome]
        try:
            answer = await asyncio.wait_for(
                self.transport.send(events, deadline), max(0.0, deadline - started)
            )
            outcomes = self._checked(answer, len(events))
        except TimeoutError:
            outcomes = [Outcome.retry("timeout", f"send took longer than {deadline - started:.3g} s")] * len(
                events
            )
        except Exception as exc:  # the transport broke its contract; keep the events
            self.log.error(
                "transport-raised", "%r.send raised; the events stay buffered: %r", self.transport, exc
            )
            outcomes = [Outcome.retry("transport_error", f"{type(exc).__name__}: {exc}")] * len(events)
        return outcomes, time.monotonic() - started

    def _checked(self, answer: Any, count: int) -> list[Outcome]:
        """The transport's answer if it keeps the contract (one Outcome per event); else
        RETRY for the whole batch and an error naming what was wrong."""
        problem = None
        try:
            outcomes = list(answer)
        except TypeError:
            outcomes, problem = [], f"returned {type(answer).__name__}, not a sequence of Outcomes"
        if problem is None and len(outcomes) != count:
            problem = f"returned {len(outcomes)} outcomes for {count} events"
        if problem is None and outcomes.count(DELIVERED) == count:
            return outcomes  # all delivered (the common case): nothing to check, at C speed
        if problem is None:
            for index, outcome in enumerate(outcomes):
                if type(outcome) is not Outcome or not isinstance(outcome.kind, OutcomeKind):
                    problem = f"returned {outcome!r} for event {index}, not an Outcome"
                    break
                wait = outcome.retry_after
                if wait is not None and not (
                    isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait >= 0
                ):
                    # Not a usable delay: ignore it (the backoff applies), keep the outcome.
                    self.log.error(
                        "bad-retry-after",
                        "%r returned retry_after=%r; expected seconds as a number >= 0",
                        self.transport,
                        wait,
                    )
                    outcomes[index] = Outcome(outcome.kind, outcome.reason, outcome.detail, None)
        if problem is None:
            return outcomes
        detail = f"{self.transport!r}.send {problem}"
        self.log.error("bad-outcomes", "%s; the events stay buffered (a bug in the transport)", detail)
        return [Outcome.retry("transport_error", detail)] * count

    def _apply(
        self, items: list[_InFlight], outcomes: Sequence[Outcome], elapsed: float, *, bisecting: bool = True
    ) -> tuple[int, int, int]:
        """Settle one batch by its outcomes.  Returns (delivered, retries, poison suspects
        among the retries)."""
        s = self.settings
        retry: list[_InFlight] = []  # RETRY and DEFERRED, in the batch's order
        retries = 0  # of which RETRY
        delivered = 0
        settled_bytes = 0
        lost: dict[str, int] = {}
        retry_after: float | None = None
        error: Outcome | None = None
        now = time.monotonic()
        all_delivered = outcomes.count(DELIVERED) == len(items)  # the common case, at C speed
        any_delivered = all_delivered or any(o.kind is OutcomeKind.DELIVERED for o in outcomes)
        if any_delivered:
            self._last_delivery = now
        suspects = 0  # RETRY outcomes that may be about the event rather than the backend
        dead: list[tuple[str, str, bytes | None, Any]] = []
        if all_delivered:
            delivered = len(items)
            settled_bytes = sum(map(_SIZE, items))
        else:
            runs_seen: set[str | None] = set()
            self.slicer.begin()
            checkpoint = self.slicer.checkpoint
            for item, outcome in zip(items, outcomes):  # noqa: B905 - lengths checked in _send
                checkpoint()
                kind = outcome.kind
                run = item[1].run_id
                first_of_run = run is None or run not in runs_seen
                runs_seen.add(run)
                if kind is OutcomeKind.DELIVERED:
                    delivered += 1
                    settled_bytes += item[2]
                elif kind is OutcomeKind.RETRY and outcome.reason in _POISON_SUSPECT:
                    suspects += 1
                    seq = item[0]
                    first = self._first_failure.setdefault(seq, now)
                    # Counted against the event only when the answer was about it alone: it was
                    # sent alone, or the backend took others of the same request.
                    if len(items) == 1 or (any_delivered and first_of_run):
                        self._blame[seq] = self._blame.get(seq, 0) + 1
                    if self._blame.get(seq, 0) >= s.poison_attempts and self._last_delivery >= first:
                        # It keeps failing while the backend takes other events: settle it.
                        lost[Reason.POISON] = lost.get(Reason.POISON, 0) + 1
                        settled_bytes += item[2]
                        self._forget(seq)
                        self.log.error(
                            "poison",
                            "an event of run %s failed %d times alone while the backend took others; "
                            "dropped as poison: %s",
                            run,
                            self._blame.get(seq, s.poison_attempts),
                            outcome.detail or outcome.reason,
                        )
                        error = outcome
                        dead.append((Reason.POISON, outcome.detail or outcome.reason, item[1].body, None))
                        continue
                    retry.append(item)
                    retries += 1
                    error = outcome
                    if outcome.retry_after is not None:
                        retry_after = max(retry_after or 0.0, outcome.retry_after)
                elif kind is OutcomeKind.RETRY:
                    retry.append(item)
                    retries += 1
                    error = outcome
                    if outcome.retry_after is not None:
                        retry_after = max(retry_after or 0.0, outcome.retry_after)
                elif kind is OutcomeKind.DEFERRED:
                    retry.append(item)
                else:
                    reason = outcome.reason or Reason.REJECTED_BY_BACKEND
                    lost[reason] = lost.get(reason, 0) + 1
                    settled_bytes += item[2]
                    error = error or outcome
                    dead.append((reason, outcome.detail, item[1].body, None))
        buf = self.buffer
        with buf.lock:
            if buf.finalized:
                self._sending, self._pending = [], []
                return 0, 0, 0
            buf.record_answer_locked(delivered, retries)
            for reason, n in lost.items():
                buf.count_locked(reason, n)
            # This lane is settled; the others (if any) are still on the wire.
            self._sending = [lane for lane in self._sending if lane is not items]
            settled = len(items) - len(retry)
            waiting = retry
            if retry and self._ready:
                # The retry list must stay older than anything else: what was serialized and
                # left over (a lane's rest may be older than a failed lane's events) joins it.
                waiting = _merged(retry, self._ready)
                self._ready = []
            self._pending = _merged(waiting, self._pending)
            self._settle_locked(settled, settled_bytes, waiting)
        if self._first_failure:
            kept = {item[0] for item in retry}
            for item in items:
                if item[0] not in kept:
                    self._forget(item[0])
        # Bisect a request the backend refused as a whole with a 5xx; once requests go through,
        # double their size again (halving is quick: log2(max_batch_events) requests at most).
        halved = len(items) > 1 and suspects == len(items)
        # One event alone refused with a 5xx by a backend that took others since it first
        # failed: a poison suspect being counted out, not a backend in trouble.
        isolating = (
            len(items) == 1
            and suspects == 1
            and self._last_delivery >= self._first_failure.get(items[0][0], _INF)
        )
        if halved:
            self._split_to = max(1, len(items) // 2)
        elif not suspects and self._split_to is not None and bisecting:
            self._split_to *= 2
            if self._split_to >= s.max_batch_events:
                self._split_to = None
        if dead and self.dead_letter is not None:
            self.dead_letter.write(dead)
        self.metrics.batch_sent(elapsed, delivered, retries, sum(lost.values()))
        if error is not None:
            self.last_error = error.detail or error.reason
        if lost:
            self.log.warning(
                "rejected",
                "the backend rejected %d event(s) for good: %s",
                sum(lost.values()),
                self.last_error,
            )
        if not retries:
            # All sent, or the rest deferred by the transport: go on at once (after a pause
            # if nothing at all moved, so a transport that only defers cannot spin the loop).
            self.failures = 0
            self.circuit = CircuitState.CLOSED
            stalled = retry and not delivered and not lost
            self._retry_at = time.monotonic() + min(s.backoff_base, 0.05) if stalled else 0.0
            return delivered, retries, suspects
        if delivered or lost or halved or isolating:
            # Progress: the backend answers, a few events must go again (or a refused request
            # is being bisected to find the event it cannot take).
            if delivered or lost:
                self.failures = 0
                self.circuit = CircuitState.CLOSED
            attempt = 1
        else:
            self.failures += 1
            attempt = self.failures
            if self.failures >= s.circuit_threshold:
                if self.circuit is not CircuitState.OPEN:
                    self.log.warning(
                        "circuit",
                        "%d attempts in a row failed; backing off (last error: %s)",
                        self.failures,
                        self.last_error,
                    )
                self.circuit = CircuitState.OPEN
        if retry_after is not None and retry_after > s.max_retry_after:
            self.log.warning(
                "retry-after-capped",
                "the backend asked to wait %.6g s (Retry-After); waiting max_retry_after (%g s) instead",
                retry_after,
                s.max_retry_after,
            )
            retry_after = s.max_retry_after
        delay = backoff_delay(attempt, s.backoff_base, s.backoff_cap, retry_after)
        self._retry_at = self._probe_at = time.monotonic() + delay
        self.log.warning(
            "retry",
            "could not deliver %d event(s), retrying in %.2f s: %s",
            retries,
            delay,
            self.last_error,
        )
        return delivered, retries, suspects

    def _forget(self, seq: int) -> None:
        self._blame.pop(seq, None)
        self._first_failure.pop(seq, None)

    def _log_drops(self) -> None:
        with self.buffer.lock:
            dropped = dict(self.buffer.dropped)
        if dropped != self._logged_drops:
            new = {k: v - self._logged_drops.get(k, 0) for k, v in dropped.items()}
            new = {k: v for k, v in new.items() if v}
            if new and self.log.warning("drops", "lineage events lost since last report: %s", new):
                self._logged_drops = dropped

    def _abandon(self) -> None:
        """Count everything still held as lost to shutdown."""
        buf = self.buffer
        with buf.lock:
            n = 0 if buf.finalized else buf.clear_locked()
            if n:
                buf.count_locked(Reason.DROPPED_SHUTDOWN, n)
                buf.notify_locked()
            self._sending, self._pending, self._ready = [], [], []
        if n:
            self.log.log(logging.WARNING, "shutdown", "%d lineage event(s) undelivered at close", n)
