"""Several batches in flight (lanes): more throughput against a slow backend, a run's events
never in two requests at once, fewer lanes when the backend says it is overloaded.  How many
lanes (``outbox._worker._lanes``) is pure, and tested here with the observations passed in; the
behaviour of an outbox with lanes against backends in process follows."""

import asyncio
import contextlib
import functools
import gc
import logging
import random
import threading
import time
import uuid
from collections import defaultdict

import orjson
import pytest

from outbox import About, Outbox, Outcome
from outbox._worker._conductor import CLOSE_GRACE
from outbox._worker._lanes import BUSY_PERIOD, FIRST_LANES, Lanes, lane_size

from support import parts
from support.chaos import running_time
from support.helpers import run_event, wait_until


def test_lanes_start_at_four_and_double_per_round_trip_while_work_waits():
    lanes = Lanes(most=8)
    assert lanes.current == FIRST_LANES == 4
    for _ in range(4):  # one round trip of 4 lanes, each answered with more work waiting
        lanes.answered(0.1, waiting=True)
    assert lanes.current == 8
    lanes.answered(0.1, waiting=True)
    assert lanes.current == 8  # never more than max_concurrency
    assert Lanes(most=2).current == 2


def test_no_more_lanes_without_work_waiting():
    lanes = Lanes(most=8)
    for _ in range(20):
        lanes.answered(0.1, waiting=False)
    assert lanes.current == 4


def test_overload_halves_once_per_latency_then_growth_is_one_per_round_trip():
    lanes = Lanes(most=16)
    for _ in range(12):
        lanes.answered(0.1, waiting=True)
    assert lanes.current == 16
    lanes.overloaded(now=10.0, sent_at=9.9)
    assert lanes.current == 8
    # The other lanes on the wire before the cut answer 503 too: nothing new, no more cuts.
    for _ in range(7):
        lanes.overloaded(now=10.05, sent_at=9.95)
    assert lanes.current == 8
    lanes.overloaded(now=10.3, sent_at=10.1)  # sent after the cut: the backend is still overloaded
    assert lanes.current == 4
    # Out of slow start: about one more lane per round trip (4 answers at 4 lanes).
    for _ in range(4):
        lanes.answered(0.1, waiting=True)
    assert lanes.current == 4
    for _ in range(5):
        lanes.answered(0.1, waiting=True)
    assert lanes.current == 5


def test_an_answer_much_slower_than_the_latency_that_holds_takes_a_lane_away():
    lanes = Lanes(most=8)
    lanes.answered(0.1, waiting=False)
    before = lanes.count
    for _ in range(4):
        lanes.answered(0.5, waiting=True)  # 5x the latency: the backend is filling up
    assert lanes.count < before
    assert lanes.current >= 1


def test_a_sending_thread_busy_computing_halves_the_lanes():
    lanes = Lanes(most=8)
    assert not lanes.busy(now=0.0, cpu=0.0)  # the first look only sets the window
    assert not lanes.busy(now=BUSY_PERIOD / 2, cpu=BUSY_PERIOD / 2)  # too short a period
    assert lanes.busy(now=BUSY_PERIOD * 2, cpu=BUSY_PERIOD * 1.5)  # on the CPU 75% of the time
    assert lanes.current == 2
    assert not lanes.busy(now=BUSY_PERIOD * 4, cpu=BUSY_PERIOD * 1.6)  # waiting: 5%
    assert lanes.current == 2


def test_lanes_never_fall_below_one():
    lanes = Lanes(most=8)
    for i in range(10):
        lanes.overloaded(now=float(i), sent_at=float(i))
    assert lanes.current == 1


@pytest.mark.parametrize(
    ("waiting", "lanes", "smallest", "largest", "size"),
    [
        (800, 8, 5, 10, 10),  # one event per request: a few requests' worth, not a batch
        (20, 8, 5, 10, 5),  # at least what is worth a request
        (30, 8, 1, 1000, 4),  # spread evenly over the lanes
        (5000, 4, 1000, 1000, 1000),  # batches: a full batch
        (0, 4, 1, 10, 1),
    ],
)
def test_lane_size(waiting, lanes, smallest, largest, size):
    assert lane_size(waiting, lanes, smallest, largest) == size


class SlowBackend:
    """Answers every request after ``delay`` seconds; records what arrived, in arrival order,
    how many requests were in flight at once, and whether a run ever had two in flight."""

    def __init__(
        self, delay: float, overloaded_for: float = 0.0, fail_rate: float = 0.0, seed: int = 1
    ) -> None:
        self.delay = delay
        self.overloaded_until = time.monotonic() + overloaded_for if overloaded_for else 0.0
        self.fail_rate = fail_rate
        self.random = random.Random(seed)
        self.arrived: list[dict] = []
        self.batch_sizes: list[int] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.runs_in_flight: set[str] = set()
        self.run_overlaps = 0
        self.lock = threading.Lock()

    async def send(self, batch, deadline):
        runs = {e.run_id for e in batch if e.run_id}
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.run_overlaps += len(runs & self.runs_in_flight)
            self.runs_in_flight |= runs
        try:
            await asyncio.sleep(self.delay)
            if time.monotonic() < self.overloaded_until:
                return [Outcome.retry("http_503", "overloaded")] * len(batch)
            if self.fail_rate and self.random.random() < self.fail_rate:
                return [Outcome.retry("http_502", "bad gateway")] * len(batch)
            with self.lock:
                self.arrived.extend(orjson.loads(e.body) for e in batch)
                self.batch_sizes.append(len(batch))
            return [Outcome.delivered()] * len(batch)
        finally:
            with self.lock:
                self.in_flight -= 1
                self.runs_in_flight -= runs

    async def aclose(self) -> None:
        pass


def emit_runs(outbox: Outbox, runs: int, per_run: int) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(runs)]
    for n in range(per_run):
        for run_id in ids:
            assert outbox.emit(run_event(run_id=run_id, n=n))
    return ids


def in_order(arrived: list[dict]) -> bool:
    seen: dict[str, list[int]] = defaultdict(list)
    for event in arrived:
        seen[event["run"]["runId"]].append(event["n"])
    return all(ns == sorted(ns) for ns in seen.values())


@pytest.mark.parametrize("max_concurrency", [1, 8])
def test_lanes_raise_throughput_against_a_slow_backend_and_keep_each_runs_order(max_concurrency):
    backend = SlowBackend(delay=0.1)
    outbox = Outbox(
        backend,
        max_batch_events=100,
        max_events=20_000,
        linger=0.01,
        max_concurrency=max_concurrency,
        close_at_exit=False,
    )
    emit_runs(outbox, runs=1000, per_run=4)
    report = outbox.close(60)
    assert report.delivered == 4000
    assert in_order(backend.arrived)
    assert backend.run_overlaps == 0  # a run never had two requests in flight
    if max_concurrency == 1:
        assert backend.most_in_flight == 1
    else:
        assert 2 <= backend.most_in_flight <= max_concurrency


@pytest.mark.parametrize("seed", range(5))
def test_lanes_keep_order_through_random_failures(seed):
    backend = SlowBackend(delay=0.01, fail_rate=0.2, seed=seed)
    outbox = Outbox(
        backend,
        max_batch_events=20,
        max_events=50_000,
        linger=0.0,
        backoff_base=0.005,
        backoff_cap=0.02,
        max_concurrency=8,
        close_at_exit=False,
    )
    emit_runs(outbox, runs=300, per_run=5)
    report = outbox.close(60)
    assert report.delivered == 1500
    assert backend.run_overlaps == 0
    firsts = [e for e in backend.arrived]
    assert in_order(firsts)


def test_max_concurrency_is_a_setting():
    outbox = Outbox.from_env({"OUTBOX_MAX_CONCURRENCY": "3"}, close_at_exit=False)
    assert parts.settings(outbox).max_concurrency == 3
    outbox.close(0)


def test_close_drains_every_lane_by_its_deadline():
    # Enough time: every lane's batches land, several in flight at once.
    backend = SlowBackend(delay=0.2)
    outbox = Outbox(
        backend, max_batch_events=100, max_events=50_000, linger=0.01, max_concurrency=8, close_at_exit=False
    )
    emit_runs(outbox, runs=2000, per_run=2)
    started = time.monotonic()
    report = outbox.close(20)
    assert time.monotonic() - started < 20
    assert report.delivered == 4000
    assert not report.undelivered
    assert backend.most_in_flight >= 2
    assert in_order(backend.arrived)

    # Not enough time: close returns by its deadline, having used it, and counts the rest.
    backend = SlowBackend(delay=0.5)
    outbox = Outbox(
        backend, max_batch_events=10, max_events=50_000, linger=0.01, max_concurrency=8, close_at_exit=False
    )
    emit_runs(outbox, runs=5000, per_run=2)
    # Lanes on the wire before the close: emitting takes a few hundredths of a second, and a
    # sidecar beside load that sent its first batch (0.5 s to answer) only in the last half
    # second of the deadline would deliver nothing by it.
    assert wait_until(lambda: backend.in_flight > 0, 10)
    started = time.monotonic()
    report, ran = running_time(lambda: outbox.close(1.5))
    took = time.monotonic() - started
    assert took >= 1.0, took
    assert ran <= 1.5 + 0.5, ran  # the time this process ran: a stall of it is not the close's
    assert report.delivered > 0
    assert report.delivered + report.undelivered.get("dropped_shutdown", 0) == 10_000
    assert backend.most_in_flight >= 2


class OneLaneAnswers(SlowBackend):
    """The first request is answered at once; every later one hangs past any deadline (a
    transport that does not honour it), so the close deadline cuts a round in mid-air."""

    def __init__(self) -> None:
        super().__init__(delay=0.0)
        self.calls = 0

    async def send(self, batch, deadline):
        self.calls += 1
        if self.calls > 1:
            await asyncio.sleep(3600)
        return await super().send(batch, deadline)


def test_a_close_deadline_that_cuts_a_round_counts_the_lanes_that_did_answer():
    # Lanes answer one by one; the round settles when all have.  A deadline that falls between
    # must count what the backend did take as delivered, not as dropped at shutdown.
    backend = OneLaneAnswers()
    outbox = Outbox(
        backend, max_batch_events=50, max_events=50_000, linger=0.01, max_concurrency=8, close_at_exit=False
    )
    emit_runs(outbox, runs=1000, per_run=1)
    assert wait_until(lambda: backend.calls >= 2, 5)
    report = outbox.close(0.5)
    assert len(backend.arrived) > 0
    assert report.delivered == len(backend.arrived)
    assert report.delivered + report.undelivered.get("dropped_shutdown", 0) == 1000


class SwallowsCancellation(SlowBackend):
    """A transport that ignores cancellation and the deadline: it answers after a minute."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.entered = threading.Event()

    async def send(self, batch, deadline):
        self.entered.set()
        until = time.monotonic() + 60
        while time.monotonic() < until:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(until - time.monotonic())
        return [Outcome.delivered()] * len(batch)


@pytest.mark.parametrize("max_concurrency", [1, 8])
def test_close_returns_by_its_deadline_when_the_transport_swallows_cancellation(max_concurrency, caplog):
    """Its lanes cannot be ended: close abandons them by its deadline, counts their events,
    and says so once, in its own words; asyncio never logs them later, at ERROR, as "Task was
    destroyed but it is pending!" in whatever code runs the collector (it did, into other
    tests' logs)."""
    caplog.set_level(logging.WARNING)
    backend = SwallowsCancellation(delay=0)
    outbox = Outbox(
        backend,
        max_batch_events=50,
        max_events=50_000,
        linger=0.01,
        max_concurrency=max_concurrency,
        close_at_exit=False,
    )
    emit_runs(outbox, runs=1000, per_run=1)
    # A lane on the wire before the close: beside load the sidecar may not have sent anything
    # by the deadline, and then no task is left to abandon (nor to say so).
    assert backend.entered.wait(10)
    # The time this process ran (a partial, not a lambda: the outbox is deleted below).
    report, took = running_time(functools.partial(outbox.close, 0.5))
    assert took <= 0.5 + CLOSE_GRACE
    assert report.delivered == 0
    assert report.undelivered == {"dropped_shutdown": 1000}
    del outbox
    gc.collect()
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    abandoned = [r.getMessage() for r in caplog.records if "did not end when cancelled" in r.getMessage()]
    assert len(abandoned) == 1, abandoned
    assert "SwallowsCancellation.send" in abandoned[0] or "Worker._send" in abandoned[0], abandoned


def test_an_event_emitted_while_idle_is_sent_within_the_linger_without_a_wake_up():
    """With a linger, the first event after a quiet spell does not wake the sidecar (a
    syscall in the caller's thread): the sidecar looks again after the linger."""
    backend = SlowBackend(delay=0.0)
    outbox = Outbox(backend, linger=0.2, close_at_exit=False)
    outbox.emit(run_event(n=0))
    assert outbox.flush(5)
    time.sleep(0.5)  # idle: the queue has been empty for a while
    wakes = []
    original = parts.sidecar(outbox).wake
    parts.sidecar(outbox).wake = lambda: (wakes.append(1), original())[1]
    emitted = time.monotonic()
    outbox.emit(run_event(n=1))
    while len(backend.arrived) < 2 and time.monotonic() - emitted < 5:
        time.sleep(0.01)
    assert len(backend.arrived) == 2
    assert wakes == []  # nobody woke the sidecar: it found the event itself
    outbox.close(5)


class PoisonBackend(SlowBackend):
    """Refuses with a 500 every request that carries an event with ``n == -1`` (as Marquez
    does with an event it cannot map); records, per request, when it came and how many
    requests were in flight then."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.requests: list[tuple[float, int, bool]] = []  # (when, in flight, carries poison)

    async def send(self, batch, deadline):
        poison = any(orjson.loads(e.body)["n"] == -1 for e in batch)
        with self.lock:
            self.requests.append((time.monotonic(), self.in_flight + 1, poison))
        if poison:
            with self.lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await asyncio.sleep(self.delay)
                about = About.EVENT if len(batch) == 1 else About.REQUEST  # a 500 to the whole request
                return [Outcome.retry("http_500", "cannot map this event", about=about)] * len(batch)
            finally:
                with self.lock:
                    self.in_flight -= 1
        return await super().send(batch, deadline)


def test_other_runs_keep_their_lanes_while_a_poison_event_is_isolated():
    """A poison event is bisected out and counted while the other runs go on, several
    requests at once: isolation holds back the poisoned run, not the backend."""
    backend = PoisonBackend(delay=0.03)
    outbox = Outbox(
        backend,
        max_batch_events=50,
        max_events=50_000,
        linger=0.01,
        backoff_base=0.05,
        backoff_cap=0.2,
        poison_attempts=3,
        max_concurrency=8,
        close_at_exit=False,
    )
    poisoned = str(uuid.uuid4())
    others = [str(uuid.uuid4()) for _ in range(2000)]
    for i, run_id in enumerate(others):
        if i == 100:
            outbox.emit(run_event(run_id=poisoned, n=0))
            outbox.emit(run_event(run_id=poisoned, n=-1))
            outbox.emit(run_event(run_id=poisoned, n=2))
        outbox.emit(run_event(run_id=run_id, n=0))
    # More traffic keeps coming while the poison is isolated.
    deadline = time.monotonic() + 30
    while not backend.requests or not any(p for _, _, p in backend.requests):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for run_id in others:
        outbox.emit(run_event(run_id=run_id, n=1))
    report = outbox.close(60)
    assert report.undelivered == {"poison": 1}
    assert report.delivered == 2 * len(others) + 2
    assert in_order(backend.arrived)
    assert backend.run_overlaps == 0
    poisoned_arrived = [e["n"] for e in backend.arrived if e["run"]["runId"] == poisoned]
    assert poisoned_arrived == [0, 2]
    # From the first refusal's answer to the last attempt with the poison event in it:
    first_answer = min(t for t, _, p in backend.requests if p) + backend.delay
    last = max(t for t, _, p in backend.requests if p)
    during = [n for t, n, p in backend.requests if first_answer < t < last and not p]
    assert during, "no other request was sent while the poison was being isolated"
    assert max(during) >= 2  # other runs went several at a time meanwhile


def test_an_error_while_events_are_taken_loses_nothing():
    """The worker's own bug while it serializes what it took from the queue: the events go back
    to the head of the queue, and are delivered, in order, once."""
    backend = SlowBackend(delay=0.01)
    outbox = Outbox(
        backend, max_batch_events=50, linger=0.01, backoff_base=0.01, max_concurrency=8, close_at_exit=False
    )
    outbox.emit(run_event(n=0))
    assert outbox.flush(5)
    worker = parts.worker(outbox)
    original = worker.intake._serialize
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # not the first: by then lanes are on the wire
            raise RuntimeError("a bug")
        return original(*args, **kwargs)

    worker.intake._serialize = failing
    emit_runs(outbox, runs=500, per_run=2)
    assert outbox.flush(10)
    report = outbox.close(5)
    assert worker.errors == 1
    assert report.delivered == 1001 == len(backend.arrived)
    assert not report.undelivered
    assert in_order(backend.arrived)


class OneAtATimeBackend(SlowBackend):
    """Where each request carries one event (single mode): a lane's events go
    ``lane_events`` at a time, so a lane with many events is a long one."""

    lane_events = 5

    async def send(self, batch, deadline):
        self.lane_sizes = [*getattr(self, "lane_sizes", []), len(batch)]
        outcomes = []
        for start in range(0, len(batch), self.lane_events):
            outcomes += await super().send(batch[start : start + self.lane_events], deadline)
        return outcomes


def test_lanes_share_the_events_where_each_request_carries_one():
    backend = OneAtATimeBackend(delay=0.02)
    outbox = Outbox(backend, max_events=10_000, linger=0.01, max_concurrency=8, close_at_exit=False)
    emit_runs(outbox, runs=400, per_run=2)
    report = outbox.close(60)
    assert report.delivered == 800
    assert backend.most_in_flight >= 4  # several lanes, each with its few requests
    # Each lane carries its share of what waits, not a whole batch's worth: 800 events in at
    # most 8 lanes is at most 100 each.
    assert max(backend.lane_sizes) <= 100, backend.lane_sizes
    assert in_order(backend.arrived)
    assert backend.run_overlaps == 0


def test_an_error_while_lanes_are_on_the_wire_settles_them_first():
    """A bug of ours while lanes are on the wire must not lose their answers: what the backend
    took would be sent again and counted twice."""
    backend = SlowBackend(delay=0.05)
    outbox = Outbox(
        backend, max_batch_events=50, linger=0.01, backoff_base=0.01, max_concurrency=8, close_at_exit=False
    )
    outbox.emit(run_event(n=0))
    assert outbox.flush(5)
    worker = parts.worker(outbox)
    original = worker._take
    calls = []

    def failing(now):
        if worker._in_flight and not calls:
            calls.append(1)
            raise RuntimeError("a bug")
        return original(now)

    worker._take = failing
    emit_runs(outbox, runs=500, per_run=2)
    assert outbox.flush(10)
    report = outbox.close(5)
    assert calls
    assert worker.errors == 1
    assert report.delivered == 1001 == len(backend.arrived)
    assert not report.undelivered
    assert in_order(backend.arrived)
