"""Start, close, deadlines, context managers, attached mode, the fork and signal hooks, in one
process (a real fork and a real exit: tests/integration/runtime/test_fork_and_exit.py)."""

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from outbox import Outbox, Outcome, SerializedEvent
from outbox.transports import DELIVERED, MemoryTransport

from support import parts
from support.chaos import running_time
from support.helpers import ScriptedTransport, run_event, wait_until


def make(transport, **kw) -> Outbox:
    kw.setdefault("close_at_exit", False)
    return Outbox(transport, **kw)


def test_close_keeps_its_deadline_when_the_backend_never_answers():
    transport = ScriptedTransport(open_gate=False)
    outbox = make(transport, linger=0)
    for i in range(100):
        outbox.emit(run_event(n=i))
    started = time.monotonic()
    report, ran = running_time(lambda: outbox.close(0.5))
    elapsed = time.monotonic() - started
    # The deadline plus the close grace, whatever the backend does, plus 0.5 s for a thread's
    # wake-up on a loaded machine (CI beside two busy processes: 1.20 s once); counted in the
    # time this process ran, which stalls of the whole process do not lengthen.
    assert elapsed >= 0.45, elapsed
    assert ran < 0.5 + 0.6 + 0.5, ran
    assert report.timed_out
    assert report.delivered == 0
    assert report.undelivered == {"dropped_shutdown": 100}
    assert transport.closed


class IgnoresCancellation:
    """A transport that blocks the sidecar's loop outright (synchronous sleep)."""

    def __init__(self) -> None:
        self.entered = threading.Event()

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        self.entered.set()
        time.sleep(2.0)  # noqa: ASYNC251 - the point of this transport
        return [DELIVERED] * len(batch)

    async def aclose(self) -> None:
        pass


def test_close_returns_even_if_the_transport_blocks_the_loop():
    transport = IgnoresCancellation()
    outbox = make(transport, linger=0)
    outbox.emit(run_event())
    assert transport.entered.wait(10)  # the loop is blocked (not "0.05 s later": beside load, not always)
    report, took = running_time(lambda: outbox.close(0.2))  # the time this process ran
    assert took < 0.2 + 0.6 + 0.2
    assert report.undelivered == {"dropped_shutdown": 1}
    # The worker finishing later must not change the settled accounts: once it has (its
    # thread ends), not 2 s later, by which time a send that began late had not returned.
    sidecar = parts.sidecar(outbox).thread
    assert sidecar is not None
    sidecar.join(10)
    assert not sidecar.is_alive()
    stats = outbox.stats()
    assert stats.delivered == 0
    assert stats.dropped == {"dropped_shutdown": 1}


def test_close_delivers_everything_buffered_when_the_backend_is_healthy():
    transport = ScriptedTransport()
    outbox = make(transport, linger=10.0)
    for i in range(1234):
        outbox.emit(run_event(n=i))
    report = outbox.close(5)
    assert report.complete
    assert report.delivered == 1234
    assert not report.timed_out
    # Each event is a run of its own: lanes may interleave them; none is missing or repeated.
    assert sorted(e["n"] for e in transport.delivered) == list(range(1234))


def test_close_gives_a_retrying_backlog_one_more_attempt():
    up = threading.Event()
    transport = ScriptedTransport(lambda e: DELIVERED if up.is_set() else Outcome.retry("http_503", "down"))
    outbox = make(transport, linger=0, backoff_base=60.0, backoff_cap=60.0)
    outbox.emit(run_event())
    assert wait_until(lambda: outbox.stats().retried >= 1)
    up.set()
    report = outbox.close(2)  # without the last chance it would wait out a 60 s backoff
    assert report.delivered == 1


def test_double_close_returns_the_same_report():
    outbox = make(ScriptedTransport())
    outbox.emit(run_event())
    first = outbox.close(1)
    assert outbox.close(1) is first


def test_close_without_any_emit_leaves_no_thread_behind():
    outbox = make(ScriptedTransport(), name="idle-probe")
    report = outbox.close(1)
    assert report.emitted == 0
    assert report.complete
    assert not any(t.name == "idle-probe-sidecar" for t in threading.enumerate() if t.is_alive())


def test_sync_context_manager_closes():
    transport = ScriptedTransport()
    with make(transport, linger=5.0) as outbox:
        outbox.emit(run_event())
    assert len(transport.delivered) == 1
    assert outbox.emit(run_event()) is False


def test_sidecar_runs_on_its_own_daemon_thread():
    seen = []

    class Recorder(ScriptedTransport):
        async def send(self, batch, deadline):
            seen.append(threading.current_thread())
            return await super().send(batch, deadline)

    outbox = make(Recorder(), name="probe")
    outbox.emit(run_event())
    assert outbox.flush(2)
    assert seen[0] is not threading.main_thread()
    assert seen[0].daemon
    assert seen[0].name == "probe-sidecar"
    outbox.close(1)


async def test_async_with_runs_the_worker_on_the_callers_loop():
    loops = []

    class Recorder(ScriptedTransport):
        async def send(self, batch, deadline):
            loops.append(asyncio.get_running_loop())
            return await super().send(batch, deadline)

    transport = Recorder()
    async with make(transport, linger=0.01) as outbox:
        assert outbox.emit(run_event())
        assert await outbox.aflush(2)
        # A sync flush on the worker's own loop would deadlock: it refuses instead.
        outbox.emit(run_event())
        with pytest.raises(RuntimeError, match="aflush"):
            outbox.flush(1)
    assert loops
    assert loops[0] is asyncio.get_running_loop()
    assert outbox.stats().delivered == 2


async def test_attached_block_policy_on_the_loop_degrades_to_drop():
    transport = ScriptedTransport(open_gate=False)
    async with make(transport, policy="block", block_timeout=10, max_events=1, linger=0) as outbox:
        assert outbox.emit(run_event())
        # Must not block the loop the worker needs (the time this process ran: not 10 s).
        accepted, took = running_time(lambda: outbox.emit(run_event()))
        assert accepted is False
        assert took < 1
        assert outbox.stats().dropped == {"dropped_full": 1}
        transport.gate.set()


async def test_aclose_from_async_code_with_the_thread_sidecar():
    transport = ScriptedTransport()
    outbox = make(transport, linger=5)
    outbox.emit(run_event())  # emit before async with: the thread sidecar starts
    report = await outbox.aclose(2)
    assert report.delivered == 1


def test_emit_from_the_sidecar_thread_never_deadlocks():
    """A transport that emits (say, a log handler shipping lineage) under the block policy."""
    holder: dict[str, Outbox] = {}
    results = []

    class Reentrant(ScriptedTransport):
        async def send(self, batch, deadline):
            results.append(holder["outbox"].emit(run_event(n=99)))
            return await super().send(batch, deadline)

    transport = Reentrant(open_gate=True)
    outbox = make(transport, policy="block", block_timeout=30, max_events=1, max_batch_events=1, linger=0)
    holder["outbox"] = outbox
    outbox.emit(run_event(n=0))
    assert wait_until(lambda: len(results) >= 1, 5)
    assert results[0] is False  # full (the batch in flight), and it refused at once
    report = outbox.close(2)
    assert report.undelivered.get("dropped_full", 0) >= 1


def test_emit_rejects_non_events_with_type_error():
    outbox = make(ScriptedTransport())
    for bad in (42, None, object(), [run_event()], ("a",)):
        with pytest.raises(TypeError, match="emit\\(\\) takes an OpenLineage event"):
            outbox.emit(bad)
    assert outbox.stats().emitted == 0
    outbox.close(0)


def test_accepts_openlineage_event_classes_v2_and_legacy():
    import warnings

    from openlineage.client.event_v2 import (
        DatasetEvent,
        Job,
        JobEvent,
        Run,
        RunEvent,
        RunState,
        StaticDataset,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from openlineage.client import run as legacy

    when = "2026-12-02T10:00:00+00:00"
    run_id = "00005015-0000-0016-2e04-8a6dbdde4eb9"
    events = [
        RunEvent(
            eventType=RunState.START, eventTime=when, run=Run(runId=run_id), job=Job(namespace="n", name="j")
        ),
        JobEvent(eventTime=when, job=Job(namespace="n", name="j")),
        DatasetEvent(eventTime=when, dataset=StaticDataset(namespace="s3://b", name="k")),
        legacy.RunEvent(legacy.RunState.COMPLETE, when, legacy.Run(run_id), legacy.Job("n", "j"), "p"),
        legacy.JobEvent(when, "p", "s", legacy.Job("n", "j")),
        legacy.DatasetEvent(when, "p", "s", legacy.Dataset("s3://b", "k")),
    ]
    transport = MemoryTransport()
    outbox = make(transport)
    assert all(outbox.emit(e) for e in events)
    assert outbox.close(2).delivered == 6
    assert [e.get("eventType") for e in transport.events] == ["START", None, None, "COMPLETE", None, None]


def test_neither_the_fork_hook_nor_a_signal_keeps_a_closed_outbox_alive():
    """Both hold each outbox weakly (its bound method), and forget it when it is collected."""
    import gc
    import signal
    import weakref

    from outbox._runtime import _lifecycle, _signals
    from outbox.transports import MemoryTransport

    previous = signal.getsignal(signal.SIGUSR2)
    try:
        outbox = Outbox(MemoryTransport(), close_at_exit=False)
        assert outbox.close_on_signal(signal.SIGUSR2)
        registration = _signals._registrations[signal.SIGUSR2]
        assert id(outbox) in registration.sidecars
        assert id(outbox) in _lifecycle._AFTER_FORK
        outbox.close(1)
        ref, token = weakref.ref(outbox), id(outbox)
        del outbox
        gc.collect()
        assert ref() is None
        assert token not in registration.sidecars
        assert token not in _lifecycle._AFTER_FORK
    finally:
        signal.signal(signal.SIGUSR2, previous)
