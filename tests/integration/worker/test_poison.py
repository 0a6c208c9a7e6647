"""Poison isolation: one event a backend cannot map (it answers 500 to any request that carries
it) must not stop the others, in batch and in single mode; a backend that is down is never
mistaken for poison (real HTTP server on loopback)."""

import asyncio
import os
import random
import threading
import time
import uuid
from collections import defaultdict

import orjson
import pytest

from outbox import About, Outbox, Outcome
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import HttpTransport

from support import parts
from support.helpers import run_event, wait_until


def emit_runs(outbox: Outbox, runs: int, per_run: int, poison_at: set[tuple[int, int]]) -> list[str]:
    ids = [str(uuid.UUID(int=i + 1)) for i in range(runs)]
    for n in range(per_run):
        for r, run_id in enumerate(ids):
            event = run_event(run_id=run_id, n=n)
            if (r, n) in poison_at:
                event["job"]["name"] = "POISON"
            assert outbox.emit(event)
    return ids


def in_order_per_run(events: list[dict]) -> bool:
    seen: dict[str, list[int]] = defaultdict(list)
    for event in events:
        seen[event["run"]["runId"]].append(event["n"])
    return all(list(dict.fromkeys(ns)) == sorted(dict.fromkeys(ns)) for ns in seen.values())


@pytest.mark.parametrize(
    ("mode", "flavor"),
    [("batch", "spec"), ("single", "spec"), ("auto", "marquez")],
    ids=["batch", "single", "auto"],
)
def test_poison_events_are_isolated_and_the_rest_is_delivered_in_order(mode, flavor):
    poison_at = {(3, 0), (50, 2), (150, 1)}  # (run, event of the run): not the last of their runs
    with Sink(behaviour=SinkBehaviour(flavor=flavor, poison="POISON")) as sink:
        outbox = Outbox(HttpTransport(sink.url, mode=mode), linger=0.01, close_at_exit=False)
        started = time.monotonic()
        emit_runs(outbox, runs=200, per_run=5 if mode == "batch" else 3, poison_at=poison_at)
        total = outbox.stats().emitted
        assert outbox.flush(60), outbox.stats()
        took = time.monotonic() - started
        stats = outbox.stats()
        events = sink.events
        requests = list(sink.requests)
    assert stats.dropped == {"poison": 3}, stats
    assert stats.delivered == total - 3
    assert len({(e["run"]["runId"], e["n"]) for e in events}) == total - 3
    assert not any(e["job"]["name"] == "POISON" for e in events)
    assert in_order_per_run(events)
    # The later events of the poisoned runs went on once the poison was settled.
    later = {(e["run"]["runId"], e["n"]) for e in events}
    assert (str(uuid.UUID(int=4)), 1) in later
    # Isolated in a few attempts each, not by a retry storm (idle: 15 answers 500 in single mode,
    # 20 in auto, 43 in batch, where the poison is found by halving); flush(60) bounds the time,
    # which beside other work is several times the 2-10 s it takes idle.
    failed = sum(1 for _, status, _ in requests if status == 500)
    assert failed <= 100, f"{failed} requests answered 500 to isolate 3 poison events in {took:.1f} s"
    assert stats.circuit == "closed"
    outbox.close(1)


def test_a_backend_that_answers_500_to_everything_is_down_not_poisoned():
    with Sink(behaviour=SinkBehaviour(fail_status=500)) as sink:
        outbox = Outbox(
            HttpTransport(sink.url, mode="batch"),
            linger=0,
            backoff_base=0.01,
            backoff_cap=0.05,
            poison_attempts=2,
            close_at_exit=False,
        )
        emit_runs(outbox, runs=10, per_run=3, poison_at=set())
        assert wait_until(lambda: len(sink.requests) >= 40, 10)  # many attempts, bisecting included
        assert outbox.stats().lost == 0  # nothing dropped: the backend takes nothing at all
        sink.behaviour = SinkBehaviour()
        assert outbox.flush(10)
        assert outbox.stats().delivered == 30
        assert in_order_per_run(sink.events)
        outbox.close(1)


def test_poison_attempts_is_a_setting():
    outbox = Outbox.from_env({"OUTBOX_POISON_ATTEMPTS": "3"}, close_at_exit=False)
    assert parts.settings(outbox).poison_attempts == 3
    outbox.close(0)


class RequestPoisonBackend:
    """A backend in process that answers 500 to any request carrying an event of job POISON
    (as Marquez does to the whole request) and takes every other request."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delivered: list[dict] = []
        self.delay = delay

    async def send(self, batch, deadline):
        await asyncio.sleep(self.delay)
        events = [orjson.loads(e.body) for e in batch]
        if any(e["job"]["name"] == "POISON" for e in events):
            about = About.EVENT if len(batch) == 1 else About.REQUEST  # a 500 to the whole request
            return [Outcome.retry("http_500", "cannot map the event", about=about)] * len(batch)
        self.delivered.extend(events)
        return [Outcome.delivered()] * len(batch)

    async def aclose(self) -> None:
        pass


def traffic(outbox: Outbox, stop: threading.Event) -> None:
    """Other runs keep coming, as in a function's normal life: the evidence that the backend
    takes events while it refuses the poison."""
    while not stop.wait(0.02):
        outbox.emit(run_event(job="traffic"))


SEEDS = int(os.environ.get("POISON_SEEDS", "30"))
FIRST_SEED = int(os.environ.get("POISON_SEED", "20261202"))


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + SEEDS))
def test_poison_isolation_for_random_runs_batches_and_timings(seed):
    """Seeded and replayable (POISON_SEED=N POISON_SEEDS=1): random runs, poison positions
    (first, middle or last of a run, several in one run), batch sizes, lingers and pauses
    in emitting.  Every poison event is settled as poison, every other event delivered in
    its run's order, quickly."""
    rng = random.Random(seed)
    runs, per_run = rng.randint(1, 60), rng.randint(1, 5)
    total = runs * per_run
    poison = set(rng.sample(range(total), rng.randint(1, min(4, total))))
    # Drawn apart, so the draws above stay what they were for each seed: a backend that
    # answers at once or after a few milliseconds (then lanes form), and the lanes allowed.
    lanes = random.Random(seed * 7 + 1)
    backend = RequestPoisonBackend(delay=lanes.choice([0, 0, 0.002, 0.005]))
    outbox = Outbox(
        backend,
        max_batch_events=rng.choice([1, 2, 3, 4, 8, 16, 64, 1000]),
        linger=rng.choice([0, 0.001, 0.01]),
        backoff_base=0.005,
        backoff_cap=0.05,
        max_concurrency=lanes.choice([1, 2, 8]),
        close_at_exit=False,
    )
    ids = [str(uuid.UUID(int=r + 1)) for r in range(runs)]
    started = time.monotonic()
    for k in range(total):
        event = run_event(run_id=ids[k % runs], n=k // runs, job="POISON" if k in poison else "job")
        assert outbox.emit(event)
        if rng.random() < 0.05:
            time.sleep(rng.random() * 0.01)
    stop = threading.Event()
    other_runs = threading.Thread(target=traffic, args=(outbox, stop))
    other_runs.start()
    try:
        flushed = outbox.flush(20)
    finally:
        stop.set()
        other_runs.join()
    took = time.monotonic() - started
    stats = outbox.stats()
    outbox.close(1)
    assert flushed, (seed, stats)
    assert stats.dropped == {"poison": len(poison)}, (seed, stats)
    ours = [e for e in backend.delivered if e["job"]["name"] == "job"]
    assert len(ours) == total - len(poison), (seed, len(ours), total - len(poison), stats)
    assert in_order_per_run(ours), seed
    assert took < 10, f"seed {seed}: isolating {len(poison)} poison events took {took:.1f} s"


def test_an_event_refused_while_nothing_else_is_sent_is_kept_until_others_go_through():
    """With nothing else to send there is no telling a poison event from a backend that went
    down: it is kept (and retried, paced).  Once another run's event goes through, it is
    settled as poison and the later events of its run follow."""
    backend = RequestPoisonBackend()
    outbox = Outbox(backend, linger=0, backoff_base=0.005, backoff_cap=0.05, close_at_exit=False)
    run_id = str(uuid.uuid4())
    outbox.emit(run_event(run_id=run_id, n=0, job="POISON"))
    outbox.emit(run_event(run_id=run_id, n=1, state="COMPLETE"))
    assert not outbox.flush(1)
    assert outbox.stats().lost == 0  # not mistaken for poison: no evidence
    assert backend.delivered == []  # the COMPLETE waits behind its START
    outbox.emit(run_event(job="other"))
    assert outbox.flush(10), outbox.stats()
    assert outbox.stats().dropped == {"poison": 1}
    delivered = [(e["job"]["name"], e["n"]) for e in backend.delivered if e["run"]["runId"] == run_id]
    assert delivered == [("job", 1)]
    outbox.close(1)
