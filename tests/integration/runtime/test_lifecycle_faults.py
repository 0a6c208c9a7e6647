"""The lifecycle under real failure, each promise tested from both sides: a worker that
never dies, a close that keeps its deadline *and* uses it, overlapping closes, signals,
fork and exit (real sockets, threads, processes and signals; no mocks)."""

import asyncio
import gc
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable

import pytest

from outbox import Outbox, Outcome, OutcomeKind
from outbox._worker._conductor import backoff_delay
from outbox.tools.faultproxy import FaultProxy
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import DELIVERED, HttpTransport, MemoryTransport

from support import parts
from support.chaos import Pulse, running_time
from support.helpers import (
    ScriptedTransport,
    close_account,
    refused_port,
    run_event,
    run_script,
    wait_until,
)
from support.paths import REPO, TESTS

GRACE = 0.5  # what close() may take beyond its deadline


def make(transport, **kw) -> Outbox:
    kw.setdefault("close_at_exit", False)
    return Outbox(transport, **kw)


def exact(outbox: Outbox) -> None:
    stats = outbox.stats()
    assert stats.offered == stats.delivered + stats.lost + stats.queued_events + stats.in_flight, stats


# -- 1. backoff overflow ------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 2, 63, 1024, 1100, 10**6])
def test_backoff_delay_is_defined_for_any_attempt(attempt):
    delay = backoff_delay(attempt, 0.1, 30.0)
    assert 0.0 <= delay <= 30.0
    assert backoff_delay(attempt, 0.1, 30.0, retry_after=45.0) == 45.0


def test_the_worker_survives_thousands_of_failed_attempts_and_delivers_after():
    attempts = []

    class DownForAWhile:
        async def send(self, batch, deadline):
            attempts.append(len(batch))
            if len(attempts) <= 1200:
                return [Outcome.retry("http_503", "down")] * len(batch)
            return [DELIVERED] * len(batch)

        async def aclose(self):
            pass

    outbox = make(DownForAWhile(), linger=0, backoff_base=0.0, backoff_cap=0.0)
    outbox.emit(run_event(n=0))
    assert wait_until(lambda: outbox.stats().delivered == 1, 30), outbox.stats()
    assert len(attempts) > 1200
    assert outbox.emit(run_event(n=1))
    assert outbox.flush(5)
    assert outbox.close(2).delivered == 2


# -- 2. close paces its attempts, uses its deadline, delivers to a backend that comes back --


@pytest.mark.parametrize(
    ("status", "retry_after"), [(503, None), (429, "1"), (429, "0")], ids=["503", "429-ra1", "429-ra0"]
)
def test_close_against_a_failing_backend_paces_and_uses_its_deadline(status, retry_after):
    with Sink(behaviour=SinkBehaviour(fail_status=status, retry_after=retry_after)) as sink:
        outbox = make(HttpTransport(sink.url, mode="batch"), linger=0)
        for i in range(50):
            outbox.emit(run_event(n=i))
        started = time.monotonic()
        report, ran = running_time(lambda: outbox.close(3))
        took = time.monotonic() - started
        requests = len(sink.requests)
    assert took >= 2.5, took  # used the deadline
    # and kept it: the time this process ran (beside load it can be off the CPU for longer
    # than the grace)
    assert ran <= 3 + GRACE, ran
    assert requests <= 40, f"{requests} requests in a 3 s close: a retry storm"
    assert report.undelivered == {"dropped_shutdown": 50}
    if retry_after == "1":
        assert requests <= 6  # one immediate last attempt, then one a second at most


def test_close_against_connection_resets_paces_and_uses_its_deadline():
    with FaultProxy("127.0.0.1", refused_port(), mode="refuse") as proxy:
        outbox = make(HttpTransport(proxy.url, mode="batch"), linger=0)
        for i in range(20):
            outbox.emit(run_event(n=i))
        started = time.monotonic()
        report, ran = running_time(lambda: outbox.close(3))
        took = time.monotonic() - started
    assert took >= 2.5, took
    assert ran <= 3 + GRACE, ran
    assert proxy.connections <= 40
    assert report.undelivered == {"dropped_shutdown": 20}


@pytest.mark.parametrize("mode", ["batch", "single"])
def test_close_delivers_to_a_backend_that_comes_back_before_the_deadline(mode):
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="refuse") as proxy:
        outbox = make(HttpTransport(proxy.url, mode=mode), linger=0)
        for i in range(200):
            outbox.emit(run_event(n=i))
        assert wait_until(lambda: outbox.stats().retried > 0, 5)
        outage: list[int] = []

        def come_back():
            time.sleep(2.0)
            outage.append(proxy.connections)
            proxy.mode = "pass"

        threading.Thread(target=come_back, daemon=True).start()
        # A deadline far past the outage: close ends once all 200 are delivered (with 6 s, 102
        # of 200 arrived with the suite in four workers beside other work).
        report = outbox.close(30)
        events = sink.events
    assert report.complete, report
    assert report.delivered == 200
    assert sorted(e["n"] for e in events) == list(range(200))
    assert outage[0] <= 30, f"{outage[0]} connection attempts during a 2 s outage: a retry storm"


def test_demo_against_a_refused_backend_uses_its_deadline_counts_everything_and_does_not_storm():
    port = refused_port()
    with FaultProxy("127.0.0.1", port, mode="refuse") as proxy:
        env = {**os.environ, "OPENLINEAGE_URL": proxy.url, "OUTBOX_SHUTDOWN_TIMEOUT": "5"}
        result = subprocess.run(
            [sys.executable, "-m", "function"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=REPO,
        )
        attempts = proxy.connections
    output = result.stdout + result.stderr
    assert "crashed" not in output, output
    assert "OverflowError" not in output, output
    assert "Traceback" not in output, output
    assert attempts <= 40, f"{attempts} connection attempts"
    assert "lost {'dropped_shutdown': 4}" in output, output


# -- 3. the worker cannot be killed ---------------------------------------------------------


class Hostile:
    """Returns what ``answers`` says for the first calls, then delivers."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = 0

    async def send(self, batch, deadline):
        self.calls += 1
        if self.answers:
            answer = self.answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return answer(len(batch)) if callable(answer) else answer
        return [DELIVERED] * len(batch)

    async def aclose(self):
        pass


@pytest.mark.parametrize(
    "answer",
    [
        lambda n: [None] * n,
        lambda n: [True] * n,
        lambda n: [Outcome(OutcomeKind.RETRY, "x", "y", "5")] * n,  # type: ignore[arg-type]
        lambda n: [Outcome.retry("x", "y", math.nan)] * n,
        lambda n: [DELIVERED] * (n + 1),
        lambda n: None,
        lambda n: 42,
        RuntimeError("boom"),
        ValueError("bad"),
    ],
    ids=[
        "none",
        "true",
        "str-retry-after",
        "nan-retry-after",
        "too-many",
        "not-a-list",
        "int",
        "raises",
        "raises2",
    ],
)
def test_a_transport_that_breaks_its_contract_never_kills_the_worker(answer):
    transport = Hostile(answer, answer)
    outbox = make(transport, linger=0, backoff_base=0.01, backoff_cap=0.02)
    for i in range(5):
        assert outbox.emit(run_event(n=i))
    assert wait_until(lambda: outbox.stats().delivered == 5, 10), outbox.stats()
    assert transport.calls >= 3
    # The worker is alive: later events go too.
    assert outbox.emit(run_event(n=5))
    assert outbox.flush(5)
    exact(outbox)
    assert outbox.close(2).delivered == 6


def test_an_error_in_the_workers_own_accounting_is_survived():
    transport = MemoryTransport()
    outbox = make(transport, linger=0, backoff_base=0.01, backoff_cap=0.02)
    outbox.emit(run_event(n=0))
    assert outbox.flush(5)
    worker = parts.worker(outbox)
    real = worker.metrics

    class Broken:
        failures = 2

        def batch_sent(self, *args):
            if self.failures:
                self.failures -= 1
                raise ZeroDivisionError("in the metrics")
            real.batch_sent(*args)

    worker.metrics = Broken()
    for i in range(1, 4):
        outbox.emit(run_event(n=i))
    assert outbox.flush(5), outbox.stats()
    assert outbox.stats().delivered == 4
    assert wait_until(lambda: worker.errors >= 1, 5)
    report = outbox.close(2)
    assert report.complete
    # Delivered at least once (an error after the backend took a batch resends it).
    assert sorted({e["n"] for e in transport.events}) == [0, 1, 2, 3]


def test_a_worker_that_stops_makes_emit_refuse_counted_and_stats_say_why():
    transport = Hostile(SystemExit("a library called sys.exit"))
    outbox = make(transport, linger=0)
    outbox.emit(run_event(n=0))
    assert wait_until(lambda: parts.sidecar(outbox).finished.done(), 5)
    assert outbox.emit(run_event(n=1)) is False
    stats = outbox.stats()
    assert stats.dropped == {"worker_stopped": 2}
    assert "SystemExit" in (stats.last_error or "")
    exact(outbox)
    report = outbox.close(1)
    assert report.undelivered == {"worker_stopped": 2}


def test_a_task_that_raises_the_stop_again_as_it_is_cancelled_has_its_exception_read(caplog):
    """The stop is logged once, by the outbox.  On Python 3.11, ``wait_for`` runs a lane's send in
    a task of its own: when the send raised SystemExit, the lane's task, cancelled by the stop,
    raises it again.  Whether the worker read it before the task ended depended on the order
    the cancelled tasks ran in (the pair of tests around this one failed 11 runs in 25 so).
    asyncio then logged "Task exception was never retrieved" at ERROR, later, in whatever
    code ran the garbage collector.  Here, such a task alone, ended by the sidecar's stop."""
    outbox = make(Hostile(), linger=0)
    loop = asyncio.new_event_loop()

    async def raises_the_stop_when_cancelled():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise SystemExit("a library called sys.exit") from None

    task = loop.create_task(raises_the_stop_when_cancelled())
    loop.run_until_complete(asyncio.sleep(0))  # it waits
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts.sidecar(outbox)._end_tasks(loop)
        assert task.done()
        del task
        loop.close()
        gc.collect()
    outbox.close(1)
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not [str(w.message) for w in caught if "never awaited" in str(w.message)]


class StopsWhileALaneWaits:
    """The first request never answers (until cancelled); the second calls sys.exit."""

    def __init__(self) -> None:
        self.calls = 0
        self.waiting = threading.Event()
        self.cancelled = threading.Event()

    async def send(self, batch, deadline):
        self.calls += 1
        if self.calls == 1:
            self.waiting.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        raise SystemExit("a library called sys.exit")

    async def aclose(self):
        pass


def test_a_worker_stopped_with_a_lane_on_the_wire_leaves_no_task_pending(caplog):
    """A user whose transport stops the sidecar's loop (SystemExit) must not later get
    "Task was destroyed but it is pending!" (the drain, the lane on the wire) nor "coroutine
    'Worker._send' was never awaited" in their logs: the sidecar ends its tasks before it
    closes its loop, and what they held is counted as the stop's."""
    transport = StopsWhileALaneWaits()
    outbox = make(transport, linger=0)
    outbox.emit(run_event(n=0))
    assert transport.waiting.wait(10)
    outbox.emit(run_event(n=1))  # another run: a second lane, which stops the loop
    assert wait_until(parts.sidecar(outbox).finished.done, 10)
    assert transport.cancelled.is_set()  # the lane on the wire was ended, not abandoned
    assert outbox.emit(run_event(n=2)) is False
    exact(outbox)
    assert outbox.close(1).undelivered == {"worker_stopped": 3}
    del outbox
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert not [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]


async def test_an_attached_worker_whose_loop_goes_away_makes_emit_refuse():
    transport = ScriptedTransport(open_gate=False)
    outbox = make(transport, linger=0)
    await outbox.__aenter__()
    outbox.emit(run_event())
    assert await asyncio.to_thread(transport.send_started.wait, 5)  # on the wire
    parts.sidecar(outbox).task.cancel()  # what the loop does to its tasks when it ends
    # Until the worker has ended: its way out takes turns of the loop, which beside load
    # (or with a transport slow to end) can take longer than a fixed 0.05 s.
    assert await asyncio.to_thread(wait_until, parts.sidecar(outbox).finished.done, 10)
    assert outbox.emit(run_event()) is False
    stats = outbox.stats()
    assert stats.lost == 2
    assert "aclose" in (stats.last_error or "")
    exact(outbox)


# -- 4. signals -------------------------------------------------------------------------

SIGNAL_CHILD = """
import os, signal, sys, threading, time, logging
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from outbox import Outbox
from outbox.transports import HttpTransport, FileTransport
MODE = sys.argv[1]
if MODE == "file":
    # A full buffer of 2,000 is written well within the 2 s deadline beside busy processes
    # (10,000, the default, were not: some were counted dropped_shutdown), while the main
    # thread goes on emitting.
    outbox = Outbox(FileTransport(sys.argv[2], append=True), shutdown_timeout=2, linger=0.05,
                    max_events=2000)
else:
    outbox = Outbox(HttpTransport(sys.argv[2], mode="batch", timeout=30), shutdown_timeout=2, linger=0)
outbox.close_on_signal()
event = {"eventType": "START", "eventTime": "2026-12-02T10:00:00+00:00", "producer": "p",
         "schemaURL": "s", "run": {"runId": "11111111-1111-1111-1111-111111111111"},
         "job": {"namespace": "n", "name": "j"}}
print("ready", flush=True)
if MODE == "close":
    outbox.emit(event)
    outbox.close(30)
    time.sleep(30)
elif MODE in ("file", "emit"):
    while True:
        outbox.emit(event)
else:
    outbox.emit(event)
    time.sleep(30)
"""


def _signalled_child(
    mode: str, target: str, signals: list[float], begun: Callable[[], bool]
) -> tuple[subprocess.CompletedProcess, float]:
    """``begun``: the child is under way (its events on the wire, or being written), which
    "ready" does not say: it comes before the first emit, and beside load a fixed pause after
    it (0.3 s) was not always enough for that."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_CHILD, mode, target],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    if not wait_until(lambda: begun() or proc.poll() is not None, 10):
        proc.kill()
        pytest.fail(f"the child did not begin: {proc.communicate()[1][-2000:]}")
    first = time.monotonic()
    for at in signals:
        time.sleep(max(0.0, first + at - time.monotonic()))
        proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the process did not end after SIGTERM: {err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - first


def test_a_second_sigterm_during_the_close_does_not_deadlock():
    with FaultProxy("127.0.0.1", refused_port(), mode="blackhole") as proxy:
        result, took = _signalled_child(
            "idle", proxy.url, [0.0, 0.3, 0.6, 1.0], lambda: proxy.connections >= 1
        )
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert took <= 2 + 1, took  # shutdown_timeout + 1 s
    assert "dropped_shutdown" in result.stderr  # the loss is reported


def test_sigterm_during_an_explicit_close_on_the_main_thread_ends_in_time():
    with FaultProxy("127.0.0.1", refused_port(), mode="blackhole") as proxy:
        result, took = _signalled_child("close", proxy.url, [0.0, 0.5], lambda: proxy.connections >= 1)
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert took <= 2 + 1, took


def test_sigterm_while_the_main_thread_emits_flushes_and_counts_every_event(tmp_path):
    # Whether the main thread gets the GIL back before the closer reports is the scheduler's
    # choice (beside load, 1 run in 65 it did not): the accounts are checked in every run, and
    # up to three runs are made for one in which it went on emitting while the closer closed.
    went_on = []
    for attempt in range(3):
        path = tmp_path / f"events-{attempt}.jsonl"
        result, took = _signalled_child(
            "file", str(path), [0.5], lambda path=path: path.exists() and path.stat().st_size > 0
        )
        assert result.returncode == -signal.SIGTERM, result.stderr
        assert took <= 2 + 1
        # The closer's report: everything emitted was delivered or counted; nothing vanished.
        account = close_account(result.stderr, f"on signal {signal.SIGTERM.value}")
        assert account is not None, result.stderr
        emitted, delivered, undelivered = account
        after_close = undelivered.pop("after_close", 0)  # refused once close began: not emitted
        assert emitted == delivered + sum(undelivered.values())
        assert set(undelivered) <= {"dropped_full"}  # the loop outruns a file: the buffer is full
        assert delivered == len(path.read_text().splitlines())
        assert delivered > 0
        went_on.append(after_close)
        if after_close > 0:
            break
    assert went_on[-1] > 0, went_on  # the main thread went on emitting while the closer closed


def test_emit_from_a_signal_handler_that_interrupts_emit_never_deadlocks():
    code = """
    import signal, time
    from outbox import Outbox
    from outbox.transports import MemoryTransport
    transport = MemoryTransport()
    # At most 20,000 held: what is emitted beyond is dropped_full (counted), and close drains
    # the rest well within its deadline even on a busy machine (a faster emit once queued
    # 113,000 events here, more than a loaded sidecar delivered in 5 s).
    outbox = Outbox(transport, max_events=20_000, close_at_exit=False)
    event = {"eventType": "START", "run": {"runId": "r"}, "job": {"namespace": "n", "name": "j"}}
    handled = 0
    def on_alarm(signum, frame):
        global handled
        handled += 1
        outbox.emit(event)
        outbox.stats()
        outbox.flush(0)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
    end = time.monotonic() + 2
    n = 0
    while time.monotonic() < end:
        outbox.emit(event)
        n += 1
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    report = outbox.close(30)
    stats = outbox.stats()
    assert stats.offered == stats.delivered + stats.lost, stats
    assert report.emitted == n + handled, (report, n, handled)
    assert report.emitted == report.delivered + report.lost, report
    assert set(report.undelivered) <= {"dropped_full"}, report  # the handler's emits were kept
    assert len(transport.events) == report.delivered, (len(transport.events), report)
    print("ok", handled, report.undelivered)
    """
    result, _ = run_script(code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
    assert int(result.stdout.split()[1]) > 100  # the handler ran often, many times inside emit


def test_close_from_a_signal_handler_that_interrupts_emit_returns_at_once():
    code = """
    import signal, time
    from outbox import Outbox
    from outbox.transports import MemoryTransport
    outbox = Outbox(MemoryTransport(), close_at_exit=False)
    event = {"eventType": "START", "run": {"runId": "r"}, "job": {"namespace": "n", "name": "j"}}
    reports = []
    def on_alarm(signum, frame):
        # A deadline far off: a close that waited on the emit it interrupted would use it all.
        # (One that interrupted no emit drains what is queued: beside other work, that took
        # all of a 3 s deadline.)
        reports.append(outbox.close(30))
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    started = time.monotonic()
    while not reports:
        outbox.emit(event)
    took = time.monotonic() - started
    final = outbox.close(3)
    assert took < 30, took
    assert final.pending == 0, final
    assert not final.timed_out, final
    stats = outbox.stats()
    assert stats.offered == stats.delivered + stats.lost, stats
    # An emit the signal interrupted finishes after the close: refused as after_close, which
    # is counted apart (not emitted while open, by CloseReport's definition).
    refused = final.undelivered.get("after_close", 0)
    assert final.emitted == final.delivered + sum(final.undelivered.values()) - refused, final
    assert refused <= 1, final  # at most the one emit the signal interrupted
    print("ok", reports[0].pending, final)
    """
    result, _ = run_script(code, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


# -- 5. fork ------------------------------------------------------------------------------


def test_what_the_sidecar_would_import_at_its_first_request_is_imported_with_the_transport():
    # httpx imports httpcore when it makes its first client, and httpcore its anyio backend at
    # the first request: on the sidecar's thread.  A fork in the middle of such an import left
    # the child a half-made httpcore (every request of its transport failed).
    code = """
    import sys
    import outbox.transports.http
    half_made = [m for m in ("httpcore", "httpcore._backends.anyio", "anyio", "h11")
                 if m not in sys.modules or getattr(sys.modules[m].__spec__, "_initializing", False)]
    print("missing", half_made)
    """
    result, _ = run_script(code, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "missing []", result.stdout


def test_fork_over_http_the_child_gets_its_own_client_and_the_parent_notices_nothing():
    with Sink(behaviour=SinkBehaviour(delay=0.5)) as sink:
        outbox = make(HttpTransport(sink.url, mode="batch", timeout=5), linger=0)
        for i in range(20):
            outbox.emit(run_event(n=i, job="parent"))
        # The parent's request is in flight (the sink answers after 0.5 s): the child inherits
        # none of its events.  On the wire, not only taken: a fork while the sidecar still
        # makes its client (loading CA certificates into OpenSSL, slow on a busy machine) is
        # another hazard, outside this test.
        assert wait_until(lambda: outbox.stats().in_flight == 20, 10), outbox.stats()
        assert wait_until(lambda: sink.active >= 1, 10)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for i in range(10):
                    outbox.emit(run_event(n=i, job="child"))
                report = outbox.close(5)
                code = 0 if report.delivered == 10 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        # The parent goes on over its own connections, which the child must not have touched.
        sink.behaviour.delay = 0.0
        assert outbox.flush(5)
        for i in range(20, 40):
            outbox.emit(run_event(n=i, job="parent"))
        report, took = running_time(lambda: outbox.close(5))  # the time this process ran
        events = sink.events
    assert report.delivered == 40
    assert took < 1.0  # no request cut off and resent after a timeout
    parent = [e["n"] for e in events if e["job"]["name"] == "parent"]
    child = [e["n"] for e in events if e["job"]["name"] == "child"]
    # Exactly once, no duplicates (each event is a run of its own: lanes may deliver two runs
    # in either order, so the arrival order is not compared).
    assert sorted(parent) == list(range(40))
    assert sorted(child) == list(range(10))


def test_fork_over_kafka_the_child_delivers_through_a_fresh_producer(kafka_bootstrap, topic):
    from outbox.transports import KafkaTransport

    from support.kafka_helpers import read_topic

    outbox = make(KafkaTransport(topic, {"bootstrap.servers": kafka_bootstrap}), linger=0)
    for i in range(10):
        outbox.emit(run_event(n=i, job="parent"))
    assert outbox.flush(30)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for i in range(10):
                outbox.emit(run_event(n=i, job="child"))
            report = outbox.close(20)
            code = 0 if report.delivered == 10 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    for i in range(10, 15):
        outbox.emit(run_event(n=i, job="parent"))
    assert outbox.close(20).delivered == 15
    records = read_topic(kafka_bootstrap, topic, 25, timeout=30)
    if len(records) != 25:  # (seen once in hundreds of runs beside load: which side lost it?)
        again = read_topic(kafka_bootstrap, topic, 25, timeout=10)
        where = [(r["partition"], r["offset"], r["event"]["job"]["name"], r["event"]["n"]) for r in again]
        pytest.fail(f"{len(records)} of 25 records read; a second reader found {len(again)}: {sorted(where)}")
    events = [record["event"] for record in records]
    assert sorted(e["n"] for e in events if e["job"]["name"] == "child") == list(range(10))
    assert sorted(e["n"] for e in events if e["job"]["name"] == "parent") == list(range(15))


# -- 6. exit ------------------------------------------------------------------------------


def test_an_inline_openlineage_client_delivers_at_exit(tmp_path):
    path = tmp_path / "events.jsonl"
    code = f"""
    import os
    os.environ["OPENLINEAGE__TRANSPORT__TYPE"] = "outbox.OutboxTransport"
    os.environ["OPENLINEAGE__TRANSPORT__DELEGATE__TYPE"] = "file"
    os.environ["OPENLINEAGE__TRANSPORT__DELEGATE__LOG_FILE_PATH"] = {str(path)!r}
    os.environ["OPENLINEAGE__TRANSPORT__DELEGATE__APPEND"] = "true"
    os.environ["OUTBOX_LINGER"] = "30"
    from openlineage.client import OpenLineageClient
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
    for i in range(20):
        OpenLineageClient().emit(RunEvent(eventType=RunState.START, eventTime="2026-12-02T10:00:00+00:00",
            run=Run(runId="11111111-1111-1111-1111-1111111111%02d" % i), job=Job(namespace="n", name="j")))
    """
    result, _ = run_script(code)
    assert result.returncode == 0, result.stderr
    assert len(path.read_text().splitlines()) == 20


def test_outboxes_dropped_without_close_deliver_and_stop_their_threads(tmp_path):
    from outbox.transports import FileTransport

    path = tmp_path / "events.jsonl"
    before = threading.active_count()
    for i in range(30):
        outbox = Outbox(FileTransport(path, append=True), linger=30, shutdown_timeout=2)
        outbox.emit(run_event(n=i))
        del outbox
    gc.collect()
    assert wait_until(lambda: threading.active_count() <= before, 10), threading.enumerate()
    assert sorted(json.loads(line)["n"] for line in path.read_text().splitlines()) == list(range(30))


def test_outboxes_alive_at_exit_close_together_within_one_shutdown_timeout():
    with FaultProxy("127.0.0.1", refused_port(), mode="blackhole") as proxy:
        # The exit is timed in the child, from the end of the script to the last exit hook (this
        # one runs after the outbox's, registered before them), without the interpreter's
        # start-up, which takes seconds on a loaded machine; and in the time the child ran (the
        # chaos test's Pulse), which a child left off the CPU does not lengthen.
        code = f"""
        import atexit, logging, sys, time
        atexit.register(lambda: print("exited", time.monotonic() - exiting,
                                      pulse.unexplained(exiting, time.monotonic()), flush=True))
        sys.path.insert(0, {str(TESTS)!r})
        from support.chaos import Pulse  # (imports outbox: its exit hook runs before the one above)
        pulse = Pulse(slow_emit=float("inf"))
        logging.basicConfig()
        from outbox import Outbox
        from outbox.transports import HttpTransport
        boxes = [Outbox(HttpTransport({proxy.url!r}, mode="batch"), shutdown_timeout=2, linger=0)
                 for _ in range(3)]
        for box in boxes:
            box.emit({{"eventType": "START"}})
        time.sleep(0.2)
        exiting = time.monotonic()
        """
        result, _ = run_script(code)
    assert result.returncode == 0, result.stderr
    wall, ran = map(float, result.stdout.split("exited")[1].split())
    # One shutdown_timeout, used (the backend holds the events): on the wall clock, which a
    # stall only lengthens (the time the child ran leaves the stalls out: 1.38 s of 2 in CI).
    assert wall > 1.5, (wall, ran)
    assert ran < 2 + 1, (wall, ran)  # not three: in the time the child ran
    # Each loss is reported, by its outbox's close (a sidecar abandoned at the deadline, beside
    # load, may report it in its drops line too: not counted here).
    closes = [line for line in result.stderr.splitlines() if "counts every loss by reason" in line]
    assert len(closes) == 3, result.stderr
    assert all("dropped_shutdown" in line for line in closes), closes


# -- 7. close from several places -----------------------------------------------------------


def test_a_short_close_from_another_thread_returns_by_its_own_deadline():
    outbox = make(ScriptedTransport(open_gate=False), linger=0)
    outbox.emit(run_event())
    long_close = threading.Thread(target=outbox.close, args=(3,))
    long_close.start()
    # Once the long close has begun (not 0.1 s later: beside load it may not have by then,
    # and the short one would come first, alone).
    assert wait_until(lambda: parts.sidecar(outbox).close_started is not None)
    report, took = running_time(lambda: outbox.close(0.5))  # the time this process ran
    assert took <= 0.5 + GRACE
    assert report.undelivered == {"dropped_shutdown": 1}
    long_close.join(1)
    assert not long_close.is_alive()  # the earliest deadline applies to both


async def test_close_on_the_sidecars_own_loop_raises_before_changing_anything():
    transport = MemoryTransport()
    async with make(transport, linger=0) as outbox:
        with pytest.raises(RuntimeError, match="aclose"):
            outbox.close(1)
        assert outbox.emit(run_event())  # still open
        assert await outbox.aflush(2)
    assert len(transport.events) == 1


def test_close_holds_its_deadline_when_a_transport_blocks_the_sidecar():
    class Blocks:
        entered = threading.Event()

        async def send(self, batch, deadline):
            self.entered.set()
            time.sleep(3)  # noqa: ASYNC251 - the point
            return [DELIVERED] * len(batch)

        async def aclose(self):
            pass

    outbox = make(Blocks(), linger=0)
    outbox.emit(run_event())
    assert Blocks.entered.wait(10)  # the sidecar is blocked (not "0.1 s later": beside load, not always)
    # The time this process ran (the chaos test's Pulse): beside other suites and busy
    # processes, it was once off the CPU for longer than the grace (CI: 1.02 s).  The close
    # waits out deadline + CLOSE_GRACE (0.9 s) here, 0.1 s short of its promise, and on the
    # way out wakes from a timed wait and logs: beside load, stalls shorter than Pulse.GAP
    # (0.1 s) added 0.011 s too many once (CI, stop 36).  Every other thread here waits
    # without the GIL (the sidecar in time.sleep, this one on a future), so a beat two ticks
    # late is the process off the CPU: counted as such.
    pulse = Pulse(slow_emit=float("inf"), gap=2 * Pulse.TICK)
    try:
        started = time.monotonic()
        report = outbox.close(0.5)
        took = pulse.unexplained(started, time.monotonic())
    finally:
        pulse.stop()
    assert took <= 0.5 + GRACE
    assert report.undelivered == {"dropped_shutdown": 1}


# -- 8. Kafka at shutdown -------------------------------------------------------------------


@pytest.mark.parametrize("servers", ["no-such-broker.invalid:9092", "127.0.0.1:1"])
def test_kafka_unreachable_at_shutdown_leaves_nothing_behind(servers):
    code = f"""
    import sys, time
    sys.path.insert(0, {str(TESTS)!r})
    from support.chaos import running_time
    from outbox import Outbox
    from outbox.transports import KafkaTransport
    transport = KafkaTransport("lineage", {{"bootstrap.servers": {servers!r}}})
    outbox = Outbox(transport, shutdown_timeout=1, linger=0)
    outbox.emit({{"eventType": "START"}})
    time.sleep(0.5)
    report, took = running_time(outbox.close)  # the time the child ran
    print("closed", took, time.time(), report.undelivered, flush=True)
    """
    result, _ = run_script(code)
    exited = time.time()
    assert result.returncode == 0, result.stderr
    assert "closed" in result.stdout
    assert "Unclosed" not in result.stderr, result.stderr
    assert "dropped_shutdown" in result.stdout
    close_took, closed_at = map(float, result.stdout.split()[1:3])
    # Its deadline, not the client's request timeout (30 s): beside busy processes the child's
    # timers fire late (1.53 s was seen for 1 + GRACE, on the wall clock), so a second of slack
    # for the machine; now in the time the child ran, which its stalls do not lengthen.
    assert close_took <= 1 + GRACE + 1, close_took
    # Nothing left behind holds the exit: a client still waiting on the broker would hold it for
    # its request timeout (30 s).  Timed from the close, not from the start: under load the
    # imports alone may take seconds.
    assert exited - closed_at <= 5, exited - closed_at


# -- 9. attached mode -----------------------------------------------------------------------


async def test_attached_aclose_keeps_its_deadline_with_a_transport_that_awaits():
    transport = ScriptedTransport(open_gate=False)
    outbox = make(transport, linger=0)
    async with outbox:
        outbox.emit(run_event())
        assert await asyncio.to_thread(transport.send_started.wait, 5)  # awaiting the backend
        # The time this process ran (the chaos test's Pulse), as in the close tests above.
        pulse = Pulse(slow_emit=float("inf"))
        try:
            started = time.monotonic()
            report = await outbox.aclose(0.5)
            took = pulse.unexplained(started, time.monotonic())
        finally:
            pulse.stop()
        assert took <= 0.5 + GRACE
    assert report.undelivered == {"dropped_shutdown": 1}
