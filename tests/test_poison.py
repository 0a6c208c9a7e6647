"""Poison isolation: one event a backend cannot map (it answers 500 to any request that carries
it) must not stop the others, in batch and in single mode; a backend that is down is never
mistaken for poison (real HTTP server on loopback)."""

import time
import uuid
from collections import defaultdict

import pytest

from outbox import Outbox
from outbox.sink import Sink, SinkBehaviour
from outbox.transports import HttpTransport

from helpers import run_event, wait_until


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
    assert stats.dropped == {"poison": 3}, stats
    assert stats.delivered == total - 3
    assert len({(e["run"]["runId"], e["n"]) for e in events}) == total - 3
    assert not any(e["job"]["name"] == "POISON" for e in events)
    assert in_order_per_run(events)
    # The later events of the poisoned runs went on once the poison was settled.
    later = {(e["run"]["runId"], e["n"]) for e in events}
    assert (str(uuid.UUID(int=4)), 1) in later
    assert took < 30, f"isolating 3 poison events took {took:.1f} s"
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
    assert outbox._settings.poison_attempts == 3
    outbox.close(0)
