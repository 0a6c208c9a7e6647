"""The sidecar runtime: where an outbox's worker runs (a thread of its own, or the caller's
event loop) and how it stops: close deadlines from any thread, an outbox dropped without
``close()``, a worker that stops by itself.  The process-wide hooks (exit, fork) that drive
it are in ``_runtime._lifecycle``; the signal handler in ``_runtime._signals``.

A :class:`Sidecar` never refers to its :class:`~outbox.Outbox`, so an outbox nobody
references can be collected; its finalizer then closes the sidecar in the background.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._buffer._buffer import Buffer, Reason, count_held_locked
from .._config._settings import WorkerSettings
from .._observability._deadletter import DeadLetter
from .._observability._log import logger, never_silent
from .._observability._stats import CloseReport, Stats
from .._runtime._lifecycle import no_longer_closes_at_exit, started
from .._runtime._slices import SlicedSelector, install
from .._runtime._threads import DaemonExecutor, block_async_signals
from .._spill import Spill
from ..transports._base import Transport
from ._conductor import CLOSE_GRACE, Worker

if TYPE_CHECKING:
    from ._fanout import FanOut

__all__ = ["CLOSE_GRACE", "Sidecar", "State"]

_INF = float("inf")


#: The longest a thread that starts the sidecar waits for its loop to run.
_READY_WITHIN = 1.0


class State(enum.Enum):
    #: Built; the worker starts at construction (sync code), on the first emit, or with
    #: ``async with``.
    NEW = "new"
    #: The worker runs.
    RUNNING = "running"
    #: ``close`` began (or the outbox was dropped, or the interpreter exits): new events are
    #: refused and the worker drains until the deadline.
    CLOSING = "closing"
    #: Settled; every ``close`` returns the same report.
    CLOSED = "closed"


class Sidecar:
    """One process's runtime of one outbox: buffer, worker, loop, thread, and the close."""

    def __init__(
        self,
        buffer: Buffer,
        transport: Transport,
        settings: WorkerSettings,
        metrics: Any,
        *,
        name: str,
        shutdown_timeout: float,
        close_at_exit: bool,
        dead_letter: DeadLetter | None = None,
        members: FanOut | None = None,
        spill: Spill | None = None,
        log_prefix: str = "",
        tells_losses: bool = True,
    ) -> None:
        self.buffer = buffer
        self.log_prefix = log_prefix
        #: A fan-out composite's members, each with its own runtime (``_fanout``); this
        #: sidecar's worker is then their intake, and its close is theirs.
        self.members = members
        self.spill = spill
        self.dead_letter = dead_letter
        self.transport = transport
        self.settings = settings
        self.metrics = metrics
        self.name = name
        self.shutdown_timeout = shutdown_timeout
        self.close_at_exit = close_at_exit
        self.state = State.NEW
        # Guards state transitions; held for microseconds, never while waiting.
        self._lock = threading.Lock()
        self.worker: Worker | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        self.thread: threading.Thread | None = None
        self.task: asyncio.Task[None] | None = None
        #: Resolved when the worker has ended (drained, deadline passed, or stopped).
        self.finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        #: Set once the report's loss is said: a close hands the report out only then (the
        #: program may exit at once, and the thread that made it is a daemon).
        self._told = threading.Event()
        self.report: CloseReport | None = None
        self.close_started: float | None = None
        #: How the close came (``at exit``, ``on signal 15``, ...), for the loss warning.
        self.closed_why = "by close()"
        #: Whether its close warns of what it did not deliver (a composite member's losses
        #: are in its outbox's warning).
        self.tells_losses = tells_losses
        self.deadline = _INF
        #: Why the worker stopped without being closed (None while it runs or was closed).
        self.stopped: str | None = None
        self._stop_lost = 0  # held events the worker counted on its way out of a stop
        #: Wakes the worker (from any thread).  Until the sidecar runs, the first event
        #: accepted starts it: emit itself never checks the state.
        self.wake: Callable[[], None] = self._start_on_first_wake

    # -- start ------------------------------------------------------------------------------

    def start_thread(self) -> None:
        with self._lock:
            if self.state is not State.NEW:
                return
            worker = self._new_worker()
            # Every turn of the loop is in the worker's slice of the GIL (SlicedSelector).
            loop = asyncio.SelectorEventLoop(SlicedSelector(worker.slicer))
            # Blocking calls the loop hands to its executor (getaddrinfo for Kafka's brokers)
            # run on daemon threads, so an unresolvable host cannot hold the process at exit.
            loop.set_default_executor(DaemonExecutor(f"{self.name}-resolver"))
            thread = threading.Thread(target=self._thread_main, args=(loop, worker), daemon=True)
            thread.name = f"{self.name}-sidecar"
            self.loop, self.worker, self.thread = loop, worker, thread
            self.wake = _waker(loop, worker)
            self._register()
            thread.start()
            self.loop_thread = thread.ident
            self.buffer.set_sidecar(thread.ident, self.wake_for_room)
            self.state = State.RUNNING
        if self.members is not None:
            self.members.start()
        # Until its loop runs, the sidecar cannot learn what objects weigh: a thread that
        # emits at once (a burst at start-up) competes with its start for the GIL, and the
        # objects it queues meanwhile count at the first estimate, however large they are.
        # Started here, off the hot path, within a bound.
        worker.ready.wait(_READY_WITHIN)

    def start_in_sync_code(self) -> None:
        """Start the thread now when called from sync code (no running loop), so that the first
        emit does not pay for it.  From async code, ``async with`` attaches the worker to the
        running loop, or the first emit starts the thread."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.start_thread()

    def _start_on_first_wake(self) -> None:
        """The wake of a sidecar that has not started (an outbox made in async code, emitted
        to before ``async with``): start it on its own thread, then wake it."""
        self.start_thread()
        if self.worker is not None and self.loop is not None:
            _waker(self.loop, self.worker)()

    def wake_now(self) -> None:
        """Wake the worker even if a wake-up is on its way (``flush``): one that a signal
        handler interrupted on this thread, between marking it on its way and sending it, goes
        only once the handler returns, and a flush in that handler would wait out its timeout."""
        loop, worker = self.loop, self.worker
        if loop is None or worker is None:
            self.wake()  # (not started: the first wake starts it)
            return
        _send_wake(loop, worker)

    def wake_for_room(self) -> None:
        """An emitter is about to wait for room under ``block`` (the buffer's lock held): wake
        the worker, even with a wake-up on its way (:meth:`wake_now`), if events were accepted
        since it last looked at the queue (``Intake.seen_seq``).  One that has seen the buffer
        full waits for an answer or a retry, and cannot make room sooner for being woken: a
        wake-up per refused emit (the backend down, a short ``block_timeout``) kept it turning
        for nothing."""
        worker = self.worker
        if worker is None or worker.intake.seen_seq != self.buffer.holdings.next_seq:
            self.wake_now()

    def start_attached(self) -> None:
        with self._lock:
            if self.state is not State.NEW:
                return
            loop = asyncio.get_running_loop()
            worker = self._new_worker()
            # On the application's own loop a hand-off sleep would hold that loop up.
            worker.slicer.enabled = False
            self.loop, self.worker = loop, worker
            self.loop_thread = threading.get_ident()
            self.buffer.set_sidecar(self.loop_thread, self.wake_for_room)
            self.wake = _waker(loop, worker)
            self._register()
            self.task = loop.create_task(worker.run(), name=f"{self.name}-worker")
            self.task.add_done_callback(self._task_done)
            self.state = State.RUNNING
        if self.members is not None:
            self.members.start()

    def _new_worker(self) -> Worker:
        return Worker(
            self.buffer,
            self.transport,
            self.settings,
            self.metrics,
            self.dead_letter,
            self.spill,
            self.log_prefix,
        )

    def _register(self) -> None:
        started(self, self.close_at_exit)

    def _thread_main(self, loop: asyncio.AbstractEventLoop, worker: Worker) -> None:
        block_async_signals()
        asyncio.set_event_loop(loop)
        install(worker.slicer)  # transports' checkpoints on this thread hand the GIL over too
        why: str | None = None
        try:
            loop.run_until_complete(worker.run())
        except BaseException as exc:  # SystemExit or KeyboardInterrupt from a transport
            why = f"{type(exc).__name__}: {exc}"
            logger.error("the outbox's sidecar stopped: %r", exc, exc_info=exc)
            self._end_tasks(loop)
        else:
            _abandon_stuck_tasks(loop)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            except BaseException as exc:
                logger.warning("the outbox's sidecar could not shut down its generators: %r", exc)
            finally:
                loop.close()
                self._worker_ended(why)

    def _end_tasks(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop stopped under the worker (SystemExit or KeyboardInterrupt went through it):
        its tasks (the worker, its drain, lanes on the wire) are cancelled and run to their end
        before the loop closes, so that the lanes' answers are settled, the transport is told,
        and none is left pending (asyncio would log each, at ERROR, as "destroyed but
        pending", and each lane never started as "never awaited").  What the worker counts
        as lost to shutdown on the way (unless a close is under way) is lost to the stop."""
        tasks = asyncio.all_tasks(loop)
        if not tasks:
            return
        buf = self.buffer
        with buf.lock:
            before = buf.dropped.get(Reason.DROPPED_SHUTDOWN, 0)
        pending = set(tasks)

        def ended(task: asyncio.Task[Any]) -> None:
            pending.discard(task)
            if not pending:
                loop.stop()

        for task in tasks:
            task.add_done_callback(ended)
            task.cancel()
        end = time.monotonic() + CLOSE_GRACE
        timer = loop.call_later(CLOSE_GRACE, loop.stop)
        while pending and time.monotonic() < end:
            # The stop may go through the loop again, from a task that raises it as it is
            # cancelled (on 3.11, wait_for's inner task holds the transport's SystemExit).
            with contextlib.suppress(BaseException):
                loop.run_forever()
        timer.cancel()
        for task in tasks:
            if task.done() and not task.cancelled():
                # Read, so that asyncio does not log it again ("Task exception was never
                # retrieved", at ERROR, whenever the task is collected): the stop was logged.
                task.exception()
        if pending:
            logger.warning("the outbox's sidecar could not end %d task(s) by its close grace", len(pending))
        with buf.lock:
            moved = buf.dropped.get(Reason.DROPPED_SHUTDOWN, 0) - before
            if moved > 0 and self.state is State.RUNNING:  # not a close: the stop's loss
                buf.count_locked(Reason.DROPPED_SHUTDOWN, -moved)  # (counted under the other)
                buf.count_locked(Reason.WORKER_STOPPED, moved)
                self._stop_lost += moved

    def _task_done(self, task: asyncio.Task[None]) -> None:
        why = None
        if task.cancelled():
            why = "its event loop cancelled the worker (the loop ended without aclose())"
        elif task.exception() is not None:
            why = repr(task.exception())
        self._worker_ended(why)

    def _worker_ended(self, why: str | None) -> None:
        """The worker is gone.  Unless a close asked for that, the outbox must refuse events
        from now on (say why), not accept them into a void."""
        closing = self.state is not State.RUNNING
        if not closing:
            self.stopped = why or "the worker ended without being closed"
            buf = self.buffer
            with buf.lock:
                on_disk = 0 if buf.finalized else _on_disk(self.spill, buf)
                held = 0 if buf.finalized else count_held_locked(buf, on_disk, Reason.WORKER_STOPPED)
                buf.close_locked(Reason.WORKER_STOPPED)
            never_silent(
                logging.ERROR,
                "the outbox's worker stopped (%s): %d held event(s) lost, lineage refused from now on",
                self.stopped,
                held + self._stop_lost,
            )
        if not self.finished.done():
            self.finished.set_result(None)
        members = self.members
        if members is not None:
            # The intake has handed on all it will (its transport's aclose told them, unless
            # it never got there): the members drain until the deadline, and the report
            # waits for the last of them.
            members.close(self.deadline if closing else None)
            if closing:
                members.when_done(self.finish)
        elif closing:
            self.finish()

    # -- close ------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Running or closing: what the exit hook closes."""
        return self.state is State.RUNNING or self.state is State.CLOSING

    def held(self) -> int:
        """Events accepted and not settled yet (queued or in flight)."""
        with self.buffer.lock:
            snap = self.buffer.snapshot_locked()
        return int(snap["queued_events"]) + int(snap["in_flight"])

    def on_own_loop(self) -> bool:
        return self.loop_thread == threading.get_ident() and not self.finished.done()

    def request_close(self, deadline: float, why: str | None = None) -> None:
        """Refuse new events and ask the worker to drain until ``deadline`` (a
        ``time.monotonic()`` value).  The earliest deadline asked for wins.  Never waits.
        ``why`` says how the close came (``at exit``), for the loss warning; the first says."""
        with self._lock:
            if self.close_started is None:
                self.close_started = time.monotonic()
                if why is not None:
                    self.closed_why = why
            self.deadline = min(self.deadline, deadline)
            if self.state in (State.NEW, State.RUNNING):
                self.state = State.CLOSING
        if self.members is not None:
            self.members.set_deadline(self.deadline)
        begin_close = getattr(self.transport, "begin_close", None)
        if callable(begin_close):
            # A transport whose rounds run long (the openlineage-python adapter) answers what
            # it did before the deadline, rather than have it cut and counted at shutdown.
            try:
                begin_close(self.deadline)
            except Exception as exc:
                logger.warning("%r.begin_close failed: %r", self.transport, exc)
        self._refuse(None)
        loop, worker = self.loop, self.worker
        if loop is not None and worker is not None and not self.finished.done():
            with contextlib.suppress(RuntimeError):  # the loop is closed (attached mode, loop gone)
                loop.call_soon_threadsafe(worker.begin_close, self.deadline)

    def _refuse(self, reason: str | None) -> None:
        buf = self.buffer
        if buf.owned():
            # Re-entered from a signal handler or finalizer that interrupted this thread
            # inside the outbox: a plain store is atomic; waiters notice at their timeout.
            buf.close_unlocked(reason)
            return
        with buf.lock:
            buf.close_locked(reason)  # blocked emitters give up

    def wait(self, deadline: float) -> None:
        """Block until the worker has ended, or ``deadline`` plus the close grace."""
        end = max(deadline, time.monotonic()) + CLOSE_GRACE
        try:
            self.finished.result(end - time.monotonic())
        except concurrent.futures.TimeoutError:
            logger.error("the outbox's sidecar did not stop by the close deadline; abandoning it")
            return
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, min(0.05, end - time.monotonic())))  # it is on its last lines
        if self.members is not None:
            self.members.wait(deadline)

    async def wait_async(self, deadline: float) -> None:
        budget = max(0.0, deadline - time.monotonic()) + CLOSE_GRACE
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self.finished)), budget)
        except TimeoutError:
            logger.error("the outbox's sidecar did not stop by the close deadline; abandoning it")
        if self.members is not None:
            await self.members.wait_async(deadline)

    def finish(self) -> CloseReport:
        """Settle the accounts (whatever is still held is lost to shutdown) and make the
        report.  Idempotent.  Re-entered from a signal handler that interrupted this thread
        inside the outbox, it returns a provisional report (``pending`` events) instead."""
        if self.report is not None:
            self._told.wait(_TELL_WAIT)
            return self.report
        buf = self.buffer
        started = self.close_started if self.close_started is not None else time.monotonic()
        if buf.owned():
            snap = buf.snapshot_unlocked()
            undelivered = dict(snap["dropped"])
            return CloseReport(
                emitted=snap["emitted"],
                delivered=snap["delivered"],
                undelivered=undelivered,
                duration=time.monotonic() - started,
                timed_out=True,
                pending=snap["queued_events"] + snap["in_flight"],
                disabled=undelivered.pop(Reason.DISABLED, 0),
            )
        members = self.members.finish() if self.members is not None else {}
        with self._lock, buf.lock:
            report, made = self.report, self.report is None
            if report is None:
                report = self.report = _account_locked(buf, self.spill, members, started)
                self.state = State.CLOSED
        if not made:  # (another thread made it meanwhile, and says it)
            self._told.wait(_TELL_WAIT)
            return report
        no_longer_closes_at_exit(self)
        try:
            if self.tells_losses:
                _tell_losses(self.name, self.closed_why, report, self.last_error())
        finally:
            self._told.set()
        return report

    def close_in_background(self) -> None:
        """The outbox was dropped without ``close()``: drain within ``shutdown_timeout``
        and stop, without waiting here (this runs in a finalizer, on any thread)."""
        if self.state is not State.RUNNING:
            return
        loop = self.loop
        if loop is None:
            return
        deadline = time.monotonic() + self.shutdown_timeout
        # On the sidecar's own loop: a finalizer may run while this thread holds locks.
        with contextlib.suppress(RuntimeError):  # its loop is closed: nothing is left to drain
            loop.call_soon_threadsafe(self.request_close, deadline, "when it was collected without close()")

    def last_error(self) -> str | None:
        if self.stopped is not None:
            return f"the worker stopped: {self.stopped}"
        return self.worker.last_error if self.worker is not None else None

    def stats(self) -> Stats:
        """A consistent snapshot of the counters (``Outbox.stats``)."""
        buf = self.buffer
        worker = self.worker
        if buf.owned():  # re-entered from a signal handler: read as it stands
            snap = buf.snapshot_unlocked()
        else:
            with buf.lock:
                snap = buf.snapshot_locked()
        if self.members is not None:
            members = self.members.stats()
        else:
            member_stats = getattr(self.transport, "member_stats", None)
            members = member_stats() if callable(member_stats) else {}
        return Stats(
            **snap,
            last_error=self.last_error(),
            circuit=worker.circuit.value if worker else "closed",
            members=members,
            dead_letter=self.dead_letter.counts() if self.dead_letter is not None else {},
            spill=self.spill.stats() if self.spill is not None else {},
        )


def _account_locked(
    buf: Buffer, spill: Spill | None, members: dict[str, dict[str, int]], started: float
) -> CloseReport:
    """The close's account, once the worker is done (or its deadline passed): what it still
    holds is counted (on disk: handed on; else lost), and the buffer closed for good."""
    buf.fold_side_locked()
    count_held_locked(buf, _on_disk(spill, buf), Reason.DROPPED_SHUTDOWN)
    buf.close_locked(final=True)
    dropped = dict(buf.dropped)
    # Refused because lineage is disabled: neither emitted nor lost (CloseReport.disabled).
    disabled = dropped.pop(Reason.DISABLED, 0)
    return CloseReport(
        emitted=buf.emitted,
        delivered=buf.delivered,
        undelivered=dropped,
        duration=time.monotonic() - started,
        timed_out=dropped.get(Reason.DROPPED_SHUTDOWN, 0) > 0
        or any(m.get(Reason.DROPPED_SHUTDOWN, 0) for m in members.values()),
        members=members,
        spill_left=spill.left() if spill is not None else {},
        disabled=disabled,
    )


def _on_disk(spill: Spill | None, buf: Buffer) -> int:
    """Of the events ``buf`` holds, how many ``spill`` holds on disk (handed on, not lost):
    for a report made without the worker, under the buffer's lock."""
    return (
        spill.on_disk(buf.holdings.journal.entries if buf.holdings.journal is not None else None)
        if spill is not None
        else 0
    )


#: Counted in ``dropped`` but not lost: lineage was turned off (``OPENLINEAGE_DISABLED``).
_NOT_LOST = frozenset({Reason.DISABLED})
#: Seconds a close waits for the thread that made the report to say its loss (a logging handler
#: that blocks must not hold a close for ever).
_TELL_WAIT = 2.0
#: A fan-out member's accounts that are not loss reasons (``_fanout.Member.stats``).
_MEMBER_ACCOUNTS = frozenset({"emitted", "delivered", "retried", "queued_events", "in_flight"})


def _losses(emitted: int, delivered: int, counts: Mapping[str, int]) -> str | None:
    lost = {reason: n for reason, n in counts.items() if n and reason not in _NOT_LOST}
    if not lost:
        return None
    reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(lost.items()))
    return (
        f"{emitted} lineage event(s) emitted, {delivered} delivered, "
        f"{sum(lost.values())} not delivered ({reasons})"
    )


def _tell_losses(name: str, why: str, report: CloseReport, last_error: str | None = None) -> None:
    """A loss is never silent: one warning for the outbox's close, with the counts and each
    loss's reason (its own, then its composite members'), where they are kept, and the last
    error (``dropped_shutdown`` alone would send a user to the deadline when the backend said
    401).  None when everything was delivered."""
    parts = []
    own = _losses(report.emitted, report.delivered, report.undelivered)
    if own is not None:
        parts.append(own)
    for member, counts in report.members.items():
        if "emitted" not in counts:
            continue  # a failover chain's member: its rejections are not losses by themselves
        reasons = {key: n for key, n in counts.items() if key not in _MEMBER_ACCOUNTS}
        lost = _losses(counts["emitted"], counts.get("delivered", 0), reasons)
        if lost is not None:
            parts.append(f"composite member {member!r}: {lost}")
    if parts:
        where = "Outbox.stats()" if own is not None else "Outbox.stats().members"
        never_silent(
            logging.WARNING,
            "outbox %r closed %s: %s; %s counts every loss by reason%s",
            name,
            why,
            "; ".join(parts),
            where,
            f"; the last error: {last_error}" if last_error else "",
        )


def _waker(loop: asyncio.AbstractEventLoop, worker: Worker) -> Callable[[], None]:
    def wake() -> None:
        # One wake-up on its way at a time.  Each is a byte to the loop's self-pipe, which the
        # loop reads until it is empty, a system call a byte: beside a handler that never waits,
        # each such call waits out a switch interval (5 ms), and wake-ups sent every millisecond
        # (a full buffer's evictions past what waits to be freed) kept the loop reading them,
        # delivering nothing for as long as the handler ran.
        if worker.wake_pending:
            return
        worker.wake_pending = True
        # Inline, not ``_send_wake``: this runs in emit (once per batch), whose Python calls
        # are counted (tests/unit/outbox/test_hot_path.py); try/except rather than
        # contextlib.suppress for the same reason.
        try:  # noqa: SIM105
            loop.call_soon_threadsafe(worker.wake)
        except RuntimeError:  # loop closed: nothing left to wake
            pass

    return wake


def _send_wake(loop: asyncio.AbstractEventLoop, worker: Worker) -> None:
    """:meth:`Sidecar.wake_now`'s wake-up (the emitters' is :func:`_waker`, inline)."""
    worker.wake_pending = True
    try:  # noqa: SIM105
        loop.call_soon_threadsafe(worker.wake)
    except RuntimeError:  # loop closed: nothing left to wake
        pass


def _abandon_stuck_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """After a close: tasks still running on the sidecar's loop (a send that swallowed its
    cancellation, a client's own task its close left behind) go with the loop, their events
    counted at shutdown.  asyncio would log each, at ERROR, whenever the collector finds it
    ("Task was destroyed but it is pending!", in whatever code then runs): said once here."""
    stuck = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not stuck:
        return
    for task in stuck:
        task.cancel()
        task._log_destroy_pending = False  # type: ignore[attr-defined]  # (as run_until_complete does)
    names = sorted({getattr(task.get_coro(), "__qualname__", repr(task.get_coro())) for task in stuck})
    logger.warning(
        "%d task(s) on the outbox's sidecar did not end when cancelled at close (%s): abandoned "
        "with its event loop",
        len(stuck),
        ", ".join(names),
    )
