"""The façade: ``Outbox``, its hot path (``emit``), flush, close and stats.  How it is built
from its keywords, and rebuilt in a forked child, is its assembly's (``_setup.Assembly``)."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Self

from ._buffer._buffer import REFUSED, WAKE, Policy
from ._buffer._event import EVENT_CLASSES, TEXT_CLASSES, Event, admit, sized
from ._buffer._holdings import Measure
from ._buffer._waiting import flush_target, put_async, settled, settled_async
from ._config._settings import MAX_SECONDS, Keywords
from ._observability._stats import CloseReport, Stats
from ._run._run import DatasetRef, LineageJob, Run, TimedRun, failure
from ._run._runid import given_run_id, run_id_of_span
from ._runtime._lifecycle import track
from ._setup import DEAD_LETTER_MAX_BYTES, SPILL_INTERVAL, SPILL_MAX_BYTES, Assembly, MiB, from_environment
from ._worker._intake import measure_here
from ._worker._sidecar import Sidecar, State
from .transports._base import Transport

__all__ = ["Outbox"]

_INF = float("inf")
_now = time.time
_new_run = object.__new__


def _deadline(timeout: float | None, default: float) -> float:
    """The ``time.monotonic()`` deadline ``timeout`` seconds from now (``default`` if None):
    at most a year away (``math.inf`` waits as long as it takes, not an ``OverflowError`` out
    of the platform's clock); a NaN timeout, which no deadline compares with, is refused."""
    if timeout is None:
        timeout = default
    elif timeout != timeout:
        raise ValueError("timeout=nan is not a number of seconds; pass seconds >= 0 (math.inf: no limit)")
    return time.monotonic() + min(timeout, MAX_SECONDS)


class _OutboxRun(Run):
    """A run of an :class:`Outbox`: its events go straight to the buffer, each a plain tuple of
    what changes (one allocation: the sidecar writes the rest), without ``emit``'s class check,
    which is for what a caller hands it (a tuple is no event there).  The tuple is ``(job,
    state, time, run id, inputs, outputs, error, name)``, read by ``_serde.serialize``: with a
    ``name``, ``inputs`` is the namespace of the one dataset (see :meth:`Outbox.run`)."""

    __slots__ = ()

    def __enter__(self) -> Self:
        outbox: Outbox = self._outbox  # type: ignore[assignment]
        record = (self.job, "START", _now(), self._rid, self._inputs, (), None, self._name)
        if outbox._buffer.put(record, 0) == WAKE:
            outbox._woken()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        outbox: Outbox = self._outbox  # type: ignore[assignment]
        record: tuple[Any, ...]
        if exc is None:
            record = (self.job, "COMPLETE", _now(), self._rid, self._inputs, self._outputs, None, self._name)
        else:
            # The trace without the frames: the record may wait out an outage in the buffer.
            record = (self.job, "FAIL", _now(), self._rid, self._inputs, (), failure(exc), self._name)
        if outbox._buffer.put(record, 0) == WAKE:
            outbox._woken()


class _TimedOutboxRun(TimedRun, _OutboxRun):
    """An :class:`_OutboxRun` of a ``timed`` job (its ``overhead`` measured)."""

    __slots__ = ()


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
        max_batch_events: The most events in one batch (default 1000, or ``max_events``
            if smaller).
        max_batch_bytes: The most bytes in one batch (default 1 MiB, or ``max_bytes``
            if smaller); a single larger event is dropped as ``too_large``.
        linger: Seconds the worker waits for a batch to fill before sending it.
        shutdown_timeout: The deadline ``close()`` uses by default, and the one the
            exit hook uses.
        send_timeout: Seconds one batch may take in the transport before the worker
            abandons that attempt and retries.
        backoff_base: First retry delay bound, in seconds (full jitter, doubling).
        backoff_cap: The largest retry delay, in seconds, unless the server asks for more.
        max_retry_after: The longest wait a server may ask for with ``Retry-After``, in
            seconds; a longer (or infinite) one is capped, and the cap logged.
        poison_attempts: How many 5xx answers about an event alone (sent alone, or refused
            while the backend took the rest of its request) make it ``poison``, dropped so
            that it cannot hold back the others, provided the backend took other events
            since it first failed (a backend that is down is never mistaken for poison).
        max_concurrency: The most batches in flight at once.  A run's events always travel in
            one batch at a time, in order; the number in use adapts between 1 and this on
            observed latency, halving after a 429, a 503 or a timeout.
        circuit_threshold: Failed attempts in a row that open the circuit.
        log_interval: Seconds between two warnings of the same kind.
        dead_letter: A JSON-lines file to which every event settled as ``rejected_by_backend``,
            ``poison``, ``too_large`` or ``invalid_event`` is appended, with its reason, the
            backend's answer and the time (``outbox replay FILE`` sends it again).  Off by default.
            The path is checked for writing at construction.
        dead_letter_max_bytes: The dead-letter file's size at which it is rotated to ``FILE.1``
            (never overwritten: while it exists and the file is full, records are not written,
            counted as ``dead_letter_full``); at most twice this on disk.  Default 64 MiB.
        spill_dir: A directory on local disk to which the sidecar writes every accepted event
            (within ``spill_interval``) until the backend has it, so that a process that is
            killed, or closes with the backend down, hands what it had not delivered to the
            next outbox started with the same directory (see docs/operations.md, "The spill").
            Off by default.  Several processes may share it.  Made if missing; checked for
            writing at construction.
        max_spill_bytes: The most bytes this outbox keeps in ``spill_dir`` (default 1 GiB);
            events beyond it are not written (counted in ``stats().spill``).
        spill_interval: Seconds between two writes to the spill (default 0.1): what a SIGKILL
            can lose.
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
        max_retry_after: float = 300.0,
        poison_attempts: int = 5,
        max_concurrency: int = 8,
        circuit_threshold: int = 5,
        log_interval: float = 30.0,
        dead_letter: str | os.PathLike[str] | None = None,
        dead_letter_max_bytes: int = DEAD_LETTER_MAX_BYTES,
        spill_dir: str | os.PathLike[str] | None = None,
        max_spill_bytes: int = SPILL_MAX_BYTES,
        spill_interval: float = SPILL_INTERVAL,
        close_at_exit: bool = True,
        name: str = "outbox",
    ) -> None:
        #: The keywords checked, the settings, and this process's parts (again in a forked child).
        self._assembly = Assembly(
            transport,
            Keywords(
                max_events=max_events,
                max_bytes=max_bytes,
                policy=policy,
                block_timeout=block_timeout,
                max_batch_events=max_batch_events,
                max_batch_bytes=max_batch_bytes,
                linger=linger,
                shutdown_timeout=shutdown_timeout,
                send_timeout=send_timeout,
                backoff_base=backoff_base,
                backoff_cap=backoff_cap,
                max_retry_after=max_retry_after,
                poison_attempts=poison_attempts,
                max_concurrency=max_concurrency,
                circuit_threshold=circuit_threshold,
                log_interval=log_interval,
                dead_letter=dead_letter,
                dead_letter_max_bytes=dead_letter_max_bytes,
                spill_dir=spill_dir,
                max_spill_bytes=max_spill_bytes,
                spill_interval=spill_interval,
                close_at_exit=close_at_exit,
                name=name,
            ),
        )
        self._take_parts()
        track(self._after_fork_in_child)
        self._sidecar.start_in_sync_code()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
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
    ) -> Self:
        return from_environment(cls, env, overrides, read_files=read_files)

    def _take_parts(self) -> None:
        """This process's parts, where ``emit`` reads them (an attribute each), and the
        finalizer that drains an outbox dropped without ``close()``."""
        assembly = self._assembly
        self._buffer, self._metrics, self._sidecar = assembly.parts
        self._spill = assembly.spill
        self._block = assembly.limits.policy is Policy.BLOCK
        self._block_timeout = assembly.limits.block_timeout
        # Dropped without close(): drain in the background (the exit hook waits for it).
        self._finalizer = weakref.finalize(self, self._sidecar.close_in_background)
        self._finalizer.atexit = False

    def _after_fork_in_child(self) -> None:
        self._finalizer.detach()
        self._assembly.rebuild_in_child()
        self._take_parts()

    def _current_sidecar(self) -> Sidecar:
        """This process's sidecar (a forked child builds its own)."""
        return self._sidecar

    def _effective_settings(self) -> dict[str, Any]:
        """The settings in force, by ``Outbox`` keyword (for ``outbox check``)."""
        return self._assembly.effective_settings()

    # -- the hot path -----------------------------------------------------------------------

    def emit(self, event: Event) -> bool:
        """Hand one event to the outbox; never waits on, or fails because of, the backend.

        Args:
            event: an openlineage-python event (``event_v2`` or legacy ``run`` classes), a
                dict, or the event's JSON as ``str``/``bytes``.  It is written later, in the
                sidecar: do not change it (nor a list or dict it holds) once emitted.

        Returns:
            True if the event was accepted; False if it was dropped (buffer full under
            ``drop_newest`` or ``block``, or the outbox is closed).  Drops are counted in
            :meth:`stats`.

        Raises:
            TypeError: ``event`` is not an event at all.  Nothing else, ever.
        """
        # Sized without serializing: text by its length, an object (0) at the estimate the
        # sidecar learns.  Nothing here walks the event: emit's cost is the same for any event.
        # The buffer does the rest under its lock (``Buffer.put``: the policy included); a
        # sidecar not started yet is started by its first wake.
        cls = event.__class__
        if cls in EVENT_CLASSES:
            nbytes = 0
        elif cls in TEXT_CLASSES:
            nbytes = len(event) or 1  # type: ignore[arg-type]  # str, bytes and their subclasses
        else:
            admit(event)
            nbytes = (len(event) or 1) if cls in TEXT_CLASSES else 0  # type: ignore[arg-type]
        result = self._buffer.put(event, nbytes)
        if result == WAKE:
            self._woken()
        return result != REFUSED

    def _woken(self) -> None:
        """The buffer asked for the sidecar (``put`` returned ``WAKE``): wake it."""
        self._sidecar.wake()
        if self._buffer.holdings.measure_here is Measure.DUE:  # (once: a burst before the sidecar ran)
            measure_here(self._buffer)

    async def emit_async(self, event: Event) -> bool:
        """Like :meth:`emit`, but under the ``block`` policy it waits for room without
        blocking the running event loop.

        Returns:
            True if accepted, False if dropped (counted in :meth:`stats`).

        Raises:
            TypeError: ``event`` is not an event at all.
        """
        if not self._block:
            return self.emit(event)
        buf = self._buffer
        event, nbytes = sized(event)
        if buf.owned():
            if buf.put_reentrant(event, nbytes):
                self._sidecar.wake()
                return True
            return False
        result = await put_async(buf, event, nbytes, time.monotonic() + self._block_timeout)
        if result == WAKE:
            self._sidecar.wake()
            if buf.holdings.measure_here is Measure.DUE:
                measure_here(buf)
        return result != REFUSED

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

        Raises:
            ValueError: a ``run_id`` that is not a UUID (``TypeError``: one that is not text).
        """
        if job.timed:
            return _TimedOutboxRun(self, job, inputs, outputs, run_id)
        # Run.__init__ in line: calling a class whose __init__ is Python's costs as much as
        # the rest of the run's making (what Run.__init__ stores, stored here).
        run: _OutboxRun = _new_run(_OutboxRun)
        run._outbox = self
        run.job = job
        # What the records hold, each a GC-tracked object kept until the sidecar takes it
        # brings the next young collection (a pause in a handler) closer: of one dataset
        # (``inputs=[s3_dataset(...)]``), its namespace and name (strings: not tracked) or, with
        # facets, the DatasetRef alone; never a tuple made for it.
        run._name = None
        if inputs.__class__ is list and len(inputs) == 1 and (one := inputs[0]).__class__ is DatasetRef:
            if one[2] is None and one[1].__class__ is str:
                run._inputs, run._name = one[0], one[1]
            else:
                run._inputs = one
        else:
            run._inputs = inputs if inputs.__class__ is tuple else tuple(inputs)
        run._outputs = outputs if outputs.__class__ is tuple else tuple(outputs)
        run._rid = given_run_id(run_id) if run_id else run_id_of_span()
        run.overhead = 0.0
        return run

    def close_on_signal(self, *signums: int) -> bool:
        """Close (within ``shutdown_timeout``) when the process gets one of ``signums``
        (default SIGTERM), then hand the signal on: to the handler that was installed
        before (a function runtime's, say), or to the default action (the process ends).
        Never replaces a handler without chaining to it.

        The handler itself never waits: it hands the close to a closer thread and returns,
        so a signal that lands inside ``emit``, ``close`` or a lock the program holds cannot
        deadlock.  When the close has ended (by its deadline), the signal is raised again
        and handed on.  A second signal meanwhile does not start a second close.  Outboxes
        registered for the same signal close at the same time.

        Returns:
            False if handlers cannot be installed here (not the main thread); the exit hook
            still flushes at interpreter exit.
        """
        from ._runtime._signals import close_on_signal

        return close_on_signal(self._current_sidecar, signums)

    # -- flush ----------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event emitted before this call is delivered or dropped.

        Args:
            timeout: seconds to wait at most (default: ``shutdown_timeout``).

        Returns:
            True if they all were settled in time (check :meth:`stats` for drops).  False at
            once when called from a signal handler that interrupted this thread inside the
            outbox (the sidecar cannot make progress until it returns).

        Raises:
            RuntimeError: called from the outbox's own event loop (use ``await aflush()``).
            ValueError: ``timeout`` is NaN.
        """
        deadline = _deadline(timeout, self._assembly.shutdown_timeout)
        buf = self._buffer
        if buf.owned():
            return False
        target = flush_target(buf, self._sidecar.wake_now)
        members = self._sidecar.members
        if target is None and members is None:
            return True
        self._refuse_on_own_loop("flush", "aflush")
        return settled(buf, target, members, deadline)

    async def aflush(self, timeout: float | None = None) -> bool:
        """:meth:`flush` for async code: waits without blocking the running loop."""
        deadline = _deadline(timeout, self._assembly.shutdown_timeout)
        buf = self._buffer
        if buf.owned():
            return False
        target = flush_target(buf, self._sidecar.wake_now)
        return await settled_async(buf, target, self._sidecar.members, deadline)

    # -- close ---------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> CloseReport:
        """Stop accepting events, deliver what is buffered until the deadline, and report.

        Returns by ``timeout`` (default ``shutdown_timeout``) plus at most 0.5 s, from any
        thread, whatever the backend does; and uses that time: while events remain it keeps
        trying, paced by backoff, so a backend that comes back in time gets them.  When
        several closes overlap, the earliest deadline applies to all of them, and each
        returns the final report.  Calling it again returns the same report.

        Raises:
            RuntimeError: called from the outbox's own event loop (use ``await aclose()``);
                raised before anything changes.
            ValueError: ``timeout`` is NaN (raised before anything changes).  A timeout past
                a year (``math.inf``: as long as it takes) waits a year.
        """
        sidecar = self._sidecar
        if sidecar.report is not None:
            return sidecar.report
        self._refuse_on_own_loop("close", "aclose")
        deadline = _deadline(timeout, self._assembly.shutdown_timeout)
        sidecar.request_close(deadline)
        if self._buffer.owned():
            # Called from a signal handler that interrupted this thread inside the outbox:
            # the sidecar cannot settle anything until we return.  It drains by the
            # deadline on its own; report what stands now.
            return sidecar.finish()
        if sidecar.worker is not None:
            sidecar.wait(deadline)
        return sidecar.finish()

    async def aclose(self, timeout: float | None = None) -> CloseReport:
        """:meth:`close` for async code: waits without blocking the running loop.

        In attached mode (``async with``) the worker runs on this very loop, so a transport
        that blocks the loop blocks ``aclose`` too; the deadline holds for transports that
        await (all of ours do).
        """
        sidecar = self._sidecar
        if sidecar.report is not None:
            return sidecar.report
        deadline = _deadline(timeout, self._assembly.shutdown_timeout)
        sidecar.request_close(deadline, "by aclose()")
        if sidecar.worker is not None:
            await sidecar.wait_async(deadline)
        return sidecar.finish()

    def _refuse_on_own_loop(self, method: str, instead: str) -> None:
        if self._sidecar.on_own_loop():
            raise RuntimeError(
                f"{method}() would deadlock on the outbox's own event loop; use 'await outbox.{instead}()'"
            )

    # -- observability ------------------------------------------------------------------------

    def stats(self) -> Stats:
        """A consistent snapshot of the counters (see :class:`Stats`)."""
        return self._sidecar.stats()

    @property
    def transport(self) -> Transport:
        """The transport events go through (read-only; in a forked child, its clone)."""
        return self._assembly.transport

    def __repr__(self) -> str:
        assembly = self._assembly
        return f"<Outbox {assembly.name!r} {self._sidecar.state.value} transport={assembly.transport!r}>"

    # -- context managers -------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        # Entered from async code before any emit: run the worker on this loop.
        if self._sidecar.state is State.NEW:
            self._sidecar.start_attached()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
