"""The façade: ``Outbox``, its hot path (``emit``) and its lifecycle."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import enum
import os
import signal
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from ._buffer import Buffer, Policy, Reason
from ._errors import ConfigError
from ._log import logger
from ._metrics import Metrics
from ._run import LineageJob, Run, RunRecord
from ._stats import CloseReport, Stats
from ._worker import CLOSE_GRACE, Worker, WorkerSettings
from .transports._base import Transport

__all__ = ["Outbox"]

MiB = 1024 * 1024
_INF = float("inf")

# Classes emit() has already accepted, for an O(1) check on the hot path.
_EVENT_CLASSES: set[type] = {dict, RunRecord}
_TEXT_CLASSES = frozenset({str, bytes, bytearray})
_event_bases: tuple[type, ...] | None = None


def _openlineage_event_bases() -> tuple[type, ...]:
    global _event_bases
    if _event_bases is None:
        from openlineage.client import event_v2

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from openlineage.client import run as legacy

        _event_bases = (event_v2.BaseEvent, legacy.RunEvent, legacy.DatasetEvent, legacy.JobEvent)
    return _event_bases


def _admit(event: Any) -> None:
    """The slow path of emit's type check: accept and remember the class, or raise."""
    cls = event.__class__
    if isinstance(event, (dict, str, bytes, bytearray, _openlineage_event_bases())):
        _EVENT_CLASSES.add(cls)
        return
    raise TypeError(
        f"emit() takes an OpenLineage event (an openlineage-python RunEvent, DatasetEvent or JobEvent, "
        f"a dict, or JSON as str/bytes), not {cls.__module__}.{cls.__qualname__}"
    )


@dataclass(frozen=True, slots=True)
class _Limits:
    max_events: int
    max_bytes: int
    policy: Policy
    block_timeout: float


class _State(enum.Enum):
    #: Constructed; the sidecar starts with the first emit (or ``async with``).
    NEW = "new"
    #: The sidecar runs.
    RUNNING = "running"
    #: ``close`` began: emit refuses, the worker drains until the deadline.
    CLOSING = "closing"
    #: Closed; ``close`` again returns the same report.
    CLOSED = "closed"


# Live outboxes, closed by one atexit hook (a WeakSet does not keep them alive).
_LIVE: weakref.WeakSet[Outbox] = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for outbox in list(_LIVE):
        if outbox._close_at_exit:
            try:
                outbox.close()
            except Exception as exc:  # never fail interpreter exit
                logger.warning("closing the outbox at exit failed: %r", exc)


def _check_number(
    name: str, value: Any, *, minimum: float, integer: bool = False, above: bool = False
) -> Any:
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise ConfigError(f"{name}={value!r} is not {kind}; pass {kind} {'>' if above else '>='} {minimum}")
    if value < minimum or (above and value == minimum):
        raise ConfigError(f"{name}={value!r} is out of range; pass {kind} {'>' if above else '>='} {minimum}")
    return value


class Outbox:
    """A bounded, non-blocking outbox for OpenLineage events.

    ``emit`` hands an event to an in-process buffer in microseconds; a sidecar
    (by default a daemon thread running its own asyncio loop) batches,
    serializes and ships the events through ``transport``, retrying with
    backoff.  The backend can be slow, down or wrong: ``emit`` neither waits
    nor raises, and every event ends up delivered or counted in
    :meth:`stats` under a named reason.

    Example::

        from outbox import Outbox
        from outbox.transports import FileTransport

        with Outbox(FileTransport("lineage.jsonl", append=True)) as outbox:
            outbox.emit({"eventType": "START", ...})

    Args:
        transport: Where events go; anything with ``async send(batch, deadline)`` and
            ``async aclose()`` (see :class:`outbox.Transport`).
        max_events: The most events held at once (queued and in flight).
        max_bytes: The most bytes held at once.  Pre-serialized events count their
            exact size; objects count a running estimate until serialized.
        policy: When full: ``"drop_oldest"`` (default; evict the oldest queued events),
            ``"drop_newest"`` (refuse the new one) or ``"block"`` (wait up to
            ``block_timeout``, then refuse).  Emitting from the sidecar's own thread
            never blocks: there, ``block`` refuses at once.
        block_timeout: Seconds ``emit`` may wait for room under ``"block"``.
        max_batch_events: The most events in one batch (default 1000, the most DataHub
            accepts; or ``max_events`` if smaller).
        max_batch_bytes: The most bytes in one batch (default 1 MiB, or ``max_bytes``
            if smaller); a single larger event is dropped as ``too_large``.
        linger: Seconds the worker waits for a batch to fill before sending it.
        shutdown_timeout: The deadline ``close()`` uses by default, and the one the
            exit hook uses.
        send_timeout: Seconds one batch may take in the transport before the worker
            abandons that attempt and retries.
        backoff_base: First retry delay bound, in seconds (full jitter, doubling).
        backoff_cap: The largest retry delay, in seconds, unless the server asks for more.
        circuit_threshold: Failed attempts in a row that open the circuit.
        log_interval: Seconds between two warnings of the same kind.
        close_at_exit: Close (with ``shutdown_timeout``) when the interpreter exits.
        name: Names the sidecar thread, log lines and the ``outbox.name`` metric attribute.

    Raises:
        ConfigError: a setting is invalid; the message names it and what is accepted.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        max_events: int = 10_000,
        max_bytes: int = 64 * MiB,
        policy: Policy | str = Policy.DROP_OLDEST,
        block_timeout: float = 0.1,
        max_batch_events: int | None = None,
        max_batch_bytes: int | None = None,
        linger: float = 0.1,
        shutdown_timeout: float = 5.0,
        send_timeout: float = 30.0,
        backoff_base: float = 0.1,
        backoff_cap: float = 30.0,
        circuit_threshold: int = 5,
        log_interval: float = 30.0,
        close_at_exit: bool = True,
        name: str = "outbox",
    ) -> None:
        if not isinstance(transport, Transport):
            raise ConfigError(
                f"transport={transport!r} is not a transport; pass an object with "
                "'async send(batch, deadline)' and 'async aclose()', such as outbox.transports.HttpTransport"
            )
        try:
            policy = Policy(policy)
        except ValueError:
            accepted = ", ".join(repr(p.value) for p in Policy)
            raise ConfigError(f"policy={policy!r} is not a policy; pass one of {accepted}") from None
        _check_number("max_events", max_events, minimum=1, integer=True)
        _check_number("max_bytes", max_bytes, minimum=1, integer=True)
        if max_batch_events is None:
            max_batch_events = min(1000, max_events)
        if max_batch_bytes is None:
            max_batch_bytes = min(1 * MiB, max_bytes)
        _check_number("block_timeout", block_timeout, minimum=0)
        _check_number("max_batch_events", max_batch_events, minimum=1, integer=True)
        _check_number("max_batch_bytes", max_batch_bytes, minimum=1, integer=True)
        _check_number("linger", linger, minimum=0)
        _check_number("shutdown_timeout", shutdown_timeout, minimum=0)
        _check_number("send_timeout", send_timeout, minimum=0, above=True)
        _check_number("backoff_base", backoff_base, minimum=0)
        _check_number("backoff_cap", backoff_cap, minimum=0)
        _check_number("circuit_threshold", circuit_threshold, minimum=1, integer=True)
        _check_number("log_interval", log_interval, minimum=0)
        if max_batch_events > max_events:
            raise ConfigError(
                f"max_batch_events={max_batch_events} exceeds max_events={max_events}; "
                "a batch must fit in the buffer: lower max_batch_events or raise max_events"
            )
        if max_batch_bytes > max_bytes:
            raise ConfigError(
                f"max_batch_bytes={max_batch_bytes} exceeds max_bytes={max_bytes}; "
                "a batch must fit in the buffer: lower max_batch_bytes or raise max_bytes"
            )
        self._transport = transport
        self._name = name
        self._shutdown_timeout = float(shutdown_timeout)
        self._close_at_exit = close_at_exit
        self._settings = WorkerSettings(
            max_batch_events=max_batch_events,
            max_batch_bytes=max_batch_bytes,
            linger=float(linger),
            send_timeout=float(send_timeout),
            backoff_base=float(backoff_base),
            backoff_cap=float(backoff_cap),
            circuit_threshold=circuit_threshold,
            log_interval=float(log_interval),
        )
        self._limits = _Limits(max_events, max_bytes, policy, float(block_timeout))
        self._init_runtime()
        _LIVE.add(self)
        os.register_at_fork(after_in_child=_after_fork_hook(self))
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # Sync code: start the sidecar now, so the first emit does not pay for a thread.
            self._start_thread()
        # else: async code; `async with` attaches the worker to this loop, or the first emit
        # starts the thread.

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Outbox:
        """Build an outbox the way openlineage-python builds its client, from the environment.

        The transport follows openlineage-python's rules (``OPENLINEAGE_DISABLED``,
        ``OPENLINEAGE__TRANSPORT__*``, ``OPENLINEAGE_CONFIG``/``openlineage.yml``,
        ``OPENLINEAGE_URL``; the console when nothing is set).  The outbox's own knobs
        come from ``OUTBOX_*`` variables (``OUTBOX_MAX_EVENTS``, ``OUTBOX_POLICY``,
        ``OUTBOX_LINGER``, ...); keyword arguments override both.

        With ``OPENLINEAGE_DISABLED=true`` the outbox accepts nothing: ``emit`` returns
        False and counts the event under ``disabled``.

        Args:
            environ: the variables to read (default: ``os.environ``).
            **overrides: ``Outbox`` keyword arguments, winning over ``OUTBOX_*``.

        Raises:
            ConfigError: a variable is invalid; the message names it, its value and
                what is accepted.
        """
        return cls._from_environment(os.environ if environ is None else environ, overrides, read_files=True)

    @classmethod
    def _from_environment(
        cls, env: Mapping[str, str], overrides: dict[str, Any], *, read_files: bool
    ) -> Outbox:
        from ._config import outbox_settings, resolve_transport_config
        from .transports import MemoryTransport, transport_from_config

        settings, origins = outbox_settings(env)
        for keyword, var in origins.items():
            if keyword in overrides:
                continue
            try:
                cls._validate_one(keyword, settings[keyword])
            except ConfigError as exc:
                raise ConfigError(f"{var}: {exc}") from None
        settings.update(overrides)
        resolved = resolve_transport_config(env, read_files=read_files)
        if resolved.disabled or (resolved.config or {}).get("type") == "noop":
            outbox = cls(MemoryTransport(), **settings)
            with outbox._buffer.lock:
                outbox._buffer.closed = True
                outbox._buffer.refusal = Reason.DISABLED
            return outbox
        return cls(transport_from_config(resolved), **settings)

    @staticmethod
    def _validate_one(keyword: str, value: Any) -> None:
        if keyword == "policy":
            try:
                Policy(value)
            except ValueError:
                accepted = ", ".join(p.value for p in Policy)
                raise ConfigError(f"{value!r} is not a policy; use one of {accepted}") from None
            return
        integers = {"max_events", "max_bytes", "max_batch_events", "max_batch_bytes", "circuit_threshold"}
        if keyword in integers:
            _check_number(keyword, value, minimum=1, integer=True)
        elif keyword == "send_timeout":
            _check_number(keyword, value, minimum=0, above=True)
        elif keyword not in ("name", "close_at_exit"):
            _check_number(keyword, value, minimum=0)

    def _init_runtime(self) -> None:
        """(Re)build everything that belongs to one process: buffer, sidecar, state."""
        limits = self._limits
        self._buffer = Buffer(
            max_events=limits.max_events,
            max_bytes=limits.max_bytes,
            policy=limits.policy,
            block_timeout=limits.block_timeout,
        )
        self._block = limits.policy is Policy.BLOCK
        self._block_timeout = limits.block_timeout
        self._metrics = Metrics(self._name, self._buffer)
        self._state = _State.NEW
        self._start_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._worker: Worker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self._finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._wake: Callable[[], None] = _noop
        self._report: CloseReport | None = None

    # -- the hot path -----------------------------------------------------------------------

    def emit(self, event: Any) -> bool:
        """Hand one event to the outbox; never waits on, or fails because of, the backend.

        Args:
            event: an openlineage-python event (``event_v2`` or legacy ``run`` classes), a
                dict, or the event's JSON as ``str``/``bytes``.

        Returns:
            True if the event was accepted; False if it was dropped (buffer full under
            ``drop_newest`` or ``block``, or the outbox is closed).  Drops are counted in
            :meth:`stats`.

        Raises:
            TypeError: ``event`` is not an event at all.  Nothing else, ever.
        """
        cls = event.__class__
        buf = self._buffer
        if cls in _TEXT_CLASSES:
            nbytes = len(event)
        else:
            if cls not in _EVENT_CLASSES:
                _admit(event)
            nbytes = buf.estimate
        if self._state is _State.NEW:
            self._start_thread()
        with buf.lock:
            if buf.closed:
                buf.count_locked(buf.refusal)
                return False
            buf.emitted += 1
            result = buf.put_locked(event, nbytes)
            if not result:
                if nbytes > buf.max_bytes:
                    buf.count_locked(Reason.TOO_LARGE)
                elif self._block and threading.get_ident() != self._loop_thread:
                    result = self._wait_for_room_locked(event, nbytes)
                else:
                    buf.count_locked(Reason.DROPPED_FULL)
        if result == 2:
            self._wake()
        return result > 0

    def _wait_for_room_locked(self, event: Any, nbytes: int) -> int:
        buf = self._buffer
        deadline = time.monotonic() + self._block_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or buf.closed:
                buf.count_locked(Reason.DROPPED_SHUTDOWN if buf.closed else Reason.DROPPED_FULL)
                return 0
            buf.progress.wait(remaining)
            if not buf.closed:
                result = buf.put_locked(event, nbytes)
                if result:
                    return result

    async def emit_async(self, event: Any) -> bool:
        """Like :meth:`emit`, but under the ``block`` policy it waits for room without
        blocking the running event loop.

        Returns:
            True if accepted, False if dropped (counted in :meth:`stats`).

        Raises:
            TypeError: ``event`` is not an event at all.
        """
        if not self._block:
            return self.emit(event)
        cls = event.__class__
        buf = self._buffer
        if cls in _TEXT_CLASSES:
            nbytes = len(event)
        else:
            if cls not in _EVENT_CLASSES:
                _admit(event)
            nbytes = buf.estimate
        if self._state is _State.NEW:
            self._start_thread()
        deadline = time.monotonic() + self._block_timeout
        with buf.lock:
            if buf.closed:
                buf.count_locked(buf.refusal)
                return False
            buf.emitted += 1
            result = buf.put_locked(event, nbytes)
            if not result and nbytes > buf.max_bytes:
                buf.count_locked(Reason.TOO_LARGE)
                return False
        while not result:
            await self._wait_async(lambda: buf.closed or buf.has_room_locked(nbytes), deadline)
            with buf.lock:
                if buf.closed:
                    buf.count_locked(Reason.DROPPED_SHUTDOWN)
                    return False
                result = buf.put_locked(event, nbytes)
                if not result and time.monotonic() >= deadline:
                    buf.count_locked(Reason.DROPPED_FULL)
                    return False
        if result == 2:
            self._wake()
        return True

    async def _wait_async(self, ready: Callable[[], bool], deadline: float) -> bool:
        """Wait, without blocking the running loop, until ``ready()`` (checked under the
        buffer's lock) or ``deadline``.  Returns ``ready()``."""
        loop = asyncio.get_running_loop()
        buf = self._buffer
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

    def run(
        self,
        job: LineageJob,
        *,
        inputs: Iterable[Any] = (),
        outputs: Iterable[Any] = (),
        run_id: str | None = None,
    ) -> Run:
        """A run of ``job``, as a context manager (``with`` or ``async with``): START on entry;
        COMPLETE on success, or FAIL with an ``errorMessage`` facet and the error re-raised.

        Args:
            job: made once with :class:`LineageJob`.
            inputs, outputs: :class:`DatasetRef` (see :func:`s3_dataset`) or
                openlineage-python dataset objects.
            run_id: default :func:`current_run_id` (the current trace id as a UUID).
        """
        return Run(self, job, inputs=inputs, outputs=outputs, run_id=run_id)

    def close_on_signal(self, *signums: int) -> bool:
        """Close (within ``shutdown_timeout``) when the process gets one of ``signums``
        (default SIGTERM), then hand the signal on: to the handler that was installed
        before (a function runtime's, say), or to the default action (the process ends).
        Never replaces a handler without chaining to it.

        Returns:
            False if handlers cannot be installed here (not the main thread); the exit hook
            still flushes at interpreter exit.
        """
        if threading.current_thread() is not threading.main_thread():
            logger.warning("close_on_signal() needs the main thread; relying on the exit hook")
            return False
        for signum in signums or (signal.SIGTERM,):
            previous = signal.getsignal(signum)
            signal.signal(signum, _chained_handler(self, previous))
        return True

    # -- the sidecar --------------------------------------------------------------------------

    def _start_thread(self) -> None:
        with self._start_lock:
            if self._state is not _State.NEW:
                return
            loop = asyncio.new_event_loop()
            worker = Worker(self._buffer, self._transport, self._settings, self._metrics)
            finished = self._finished
            thread = threading.Thread(
                target=_thread_main, args=(loop, worker, finished), name=f"{self._name}-sidecar", daemon=True
            )
            self._loop, self._worker, self._thread = loop, worker, thread
            self._wake = _waker(loop, worker)
            thread.start()
            self._loop_thread = thread.ident
            self._state = _State.RUNNING

    def _start_attached(self) -> None:
        with self._start_lock:
            if self._state is not _State.NEW:
                return
            loop = asyncio.get_running_loop()
            worker = Worker(self._buffer, self._transport, self._settings, self._metrics)
            self._loop, self._worker = loop, worker
            self._loop_thread = threading.get_ident()
            self._wake = _waker(loop, worker)
            self._task = loop.create_task(worker.run(), name=f"{self._name}-worker")
            finished = self._finished
            self._task.add_done_callback(lambda _task: _set_finished(finished))
            self._state = _State.RUNNING

    # -- flush ----------------------------------------------------------------------------

    def _flush_target(self) -> int | None:
        """Ask the worker to send everything emitted so far now; None if nothing is pending."""
        buf = self._buffer
        with buf.lock:
            target = buf.next_seq - 1
            if buf.lowest_unsettled_locked() > target:
                return None
            buf.flush_target = max(buf.flush_target, target)
        self._wake()
        return target

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event emitted before this call is delivered or dropped.

        Args:
            timeout: seconds to wait at most (default: ``shutdown_timeout``).

        Returns:
            True if they all were settled in time (check :meth:`stats` for drops).

        Raises:
            RuntimeError: called from the outbox's own event loop (use ``await aflush()``).
        """
        timeout = self._shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        target = self._flush_target()
        if target is None:
            return True
        self._refuse_on_own_loop("flush", "aflush")
        buf = self._buffer
        with buf.lock:
            while buf.lowest_unsettled_locked() <= target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                buf.progress.wait(remaining)
        return True

    async def aflush(self, timeout: float | None = None) -> bool:
        """:meth:`flush` for async code: waits without blocking the running loop."""
        timeout = self._shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        target = self._flush_target()
        if target is None:
            return True
        buf = self._buffer
        return await self._wait_async(lambda: buf.lowest_unsettled_locked() > target, deadline)

    # -- close ---------------------------------------------------------------------------

    def _begin_close(self) -> tuple[float, bool] | None:
        """Refuse new events and tell the worker to drain.  Returns (start time, started)
        or None if already closed."""
        if self._report is not None:
            return None
        buf = self._buffer
        with buf.lock:
            buf.closed = True
            buf.notify_locked()  # blocked emitters give up
        started = self._state is not _State.NEW
        self._state = _State.CLOSING
        return time.monotonic(), started

    def _schedule_close(self, deadline: float) -> bool:
        loop, worker = self._loop, self._worker
        if loop is None or worker is None:
            return False
        try:
            loop.call_soon_threadsafe(worker.begin_close, deadline)
        except RuntimeError:  # the loop is closed (attached mode, loop gone)
            return False
        return True

    def close(self, timeout: float | None = None) -> CloseReport:
        """Stop accepting events, deliver what is buffered until the deadline, and report.

        Returns by ``timeout`` (default ``shutdown_timeout``) plus a small constant,
        whatever the backend does.  Calling it again returns the same report.

        Raises:
            RuntimeError: called from the outbox's own event loop (use ``await aclose()``).
        """
        timeout = self._shutdown_timeout if timeout is None else timeout
        with self._close_lock:
            begun = self._begin_close()
            if begun is None:
                assert self._report is not None
                return self._report
            started_at, started = begun
            deadline = started_at + timeout
            if started and not self._finished.done():
                self._refuse_on_own_loop("close", "aclose")
                if self._schedule_close(deadline):
                    try:
                        self._finished.result(max(0.0, deadline - time.monotonic()) + CLOSE_GRACE)
                    except concurrent.futures.TimeoutError:
                        logger.error("the outbox's sidecar did not stop by the close deadline; abandoning it")
                    if self._thread is not None:
                        self._thread.join(0.1)
            return self._finish(started_at)

    async def aclose(self, timeout: float | None = None) -> CloseReport:
        """:meth:`close` for async code: waits without blocking the running loop."""
        timeout = self._shutdown_timeout if timeout is None else timeout
        begun = self._begin_close()
        if begun is None:
            assert self._report is not None
            return self._report
        started_at, started = begun
        deadline = started_at + timeout
        if started and not self._finished.done() and self._schedule_close(deadline):
            budget = max(0.0, deadline - time.monotonic()) + CLOSE_GRACE
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._finished)), budget)
            except TimeoutError:
                logger.error("the outbox's sidecar did not stop by the close deadline; abandoning it")
        return self._finish(started_at)

    def _finish(self, started_at: float) -> CloseReport:
        if self._report is not None:
            return self._report
        buf = self._buffer
        with buf.lock:
            # Whatever a stuck or vanished worker still holds is lost to shutdown.
            held = buf.clear_locked()
            if held:
                buf.count_locked(Reason.DROPPED_SHUTDOWN, held)
            buf.finalized = True
            dropped = dict(buf.dropped)
            report = CloseReport(
                emitted=buf.emitted,
                delivered=buf.delivered,
                undelivered=dropped,
                duration=time.monotonic() - started_at,
                timed_out=dropped.get(Reason.DROPPED_SHUTDOWN, 0) > 0,
            )
        self._report = report
        self._state = _State.CLOSED
        _LIVE.discard(self)
        return report

    def _refuse_on_own_loop(self, method: str, instead: str) -> None:
        if self._loop_thread == threading.get_ident():
            raise RuntimeError(
                f"{method}() would deadlock on the outbox's own event loop; use 'await outbox.{instead}()'"
            )

    # -- observability ------------------------------------------------------------------------

    def stats(self) -> Stats:
        """A consistent snapshot of the counters (see :class:`Stats`)."""
        buf = self._buffer
        worker = self._worker
        with buf.lock:
            snap = buf.snapshot_locked()
        return Stats(
            **snap,
            last_error=worker.last_error if worker else None,
            circuit=worker.circuit.value if worker else "closed",
        )

    def __repr__(self) -> str:
        return f"<Outbox {self._name!r} {self._state.value} transport={self._transport!r}>"

    # -- context managers -------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        # Entered from async code before any emit: run the worker on this loop.
        if self._state is _State.NEW:
            self._start_attached()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- fork ---------------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        # The parent's sidecar thread does not exist here; its lock may be held.  Start over,
        # empty: the parent still owns (and will deliver) what it had buffered.
        closed = self._state in (_State.CLOSING, _State.CLOSED)
        report = self._report
        self._init_runtime()
        if closed:
            self._buffer.closed = True
            self._state = _State.CLOSED
            self._report = report


def _after_fork_hook(outbox: Outbox) -> Callable[[], None]:
    ref = weakref.WeakMethod(outbox._after_fork_in_child)

    def hook() -> None:
        method = ref()
        if method is not None:
            method()

    return hook


def _noop() -> None:
    pass


def _chained_handler(outbox: Outbox, previous: Any) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        # The signal may have interrupted this very thread inside emit(), holding the buffer's
        # lock: closing then would wait on ourselves. A lock we can take is not held by us.
        lock = outbox._buffer.lock
        if lock.acquire(timeout=0.2):
            lock.release()
            try:
                outbox.close()
            except Exception as exc:  # never let the flush stop the signal's own effect
                logger.warning("closing the outbox on signal %d failed: %r", signum, exc)
        else:
            logger.warning("signal %d arrived mid-emit; not flushing", signum)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL or previous is None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    return handler


def _set_finished(finished: concurrent.futures.Future[None]) -> None:
    if not finished.done():
        finished.set_result(None)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _waker(loop: asyncio.AbstractEventLoop, worker: Worker) -> Callable[[], None]:
    def wake() -> None:
        # try/except rather than contextlib.suppress: this runs in emit (once per batch).
        try:  # noqa: SIM105
            loop.call_soon_threadsafe(worker.wake)
        except RuntimeError:  # loop closed: nothing left to wake
            pass

    return wake


def _thread_main(
    loop: asyncio.AbstractEventLoop, worker: Worker, finished: concurrent.futures.Future[None]
) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(worker.run())
    except BaseException as exc:  # pragma: no cover - worker.run handles its own errors
        logger.error("the outbox's sidecar stopped: %r", exc)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
            finished.set_result(None)
