"""``max_concurrent_requests`` bounds what an HTTP transport has in flight, across every lane of
the worker: requests being answered and connections open, counted by the backend itself; and a
backlog in single mode keeps that many requests in flight until it is gone (issue 22, item 5)."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

import orjson
import pytest

from outbox import Outbox
from outbox.transports import HttpTransport

from support.counting_server import CountingServer
from support.helpers import run_event


def _emit_runs(outbox: Outbox, runs: int, per_run: int) -> None:
    n = 0
    for _ in range(runs):
        run_id = str(uuid.uuid4())
        for _ in range(per_run):
            outbox.emit(run_event(run_id, n=n))
            n += 1


def _in_order(bodies: list[bytes]) -> bool:
    seen: dict[str, list[int]] = defaultdict(list)
    for body in bodies:
        event = orjson.loads(body)
        seen[event["run"]["runId"]].append(event["n"])
    return all(ns == sorted(ns) for ns in seen.values())


@pytest.mark.parametrize("per_run", [2, 25])
def test_single_mode_keeps_its_requests_in_flight_through_a_backlog_and_within_the_bound(per_run):
    """400 events to a backend answering in 20-80 ms, four requests at most: the backlog keeps
    all four busy (before: up to 8 lanes x 4 requests each, 25 and more at once, against a
    documented bound of 4), and each run's events arrive in order."""
    bound, events = 4, 400
    with CountingServer(delay=(0.02, 0.08), seed=per_run) as server:
        outbox = Outbox(
            HttpTransport(server.url, mode="single", max_concurrent_requests=bound),
            max_events=1_000,
            max_concurrency=8,
            close_at_exit=False,
        )
        _emit_runs(outbox, events // per_run, per_run)
        samples = []
        deadline = time.monotonic() + 30
        while server.received < events - 50 and time.monotonic() < deadline:
            time.sleep(0.01)
            if server.received > 50:  # past the start: a backlog, and lanes grown
                samples.append(server.requests)
        report = outbox.close(30)
        assert report.delivered == events == server.received, report
        assert server.peak_requests <= bound, server.peak_requests
        assert server.peak_connections <= bound, server.peak_connections
        # Busy through the backlog: on average at least half of the places taken (3.7-3.9 of 4
        # measured on a quiet run; the margin is for a loaded machine).
        assert samples
        assert sum(samples) / len(samples) >= 0.5 * bound, samples
        assert _in_order(server.bodies)


def test_batch_mode_lanes_share_the_bound_too():
    """Eight lanes of batches against max_concurrent_requests=2: two requests at most."""
    with CountingServer(delay=(0.02, 0.05), seed=3) as server:
        outbox = Outbox(
            HttpTransport(server.url, mode="batch", max_concurrent_requests=2),
            max_events=5_000,
            max_batch_events=10,
            max_concurrency=8,
            close_at_exit=False,
        )
        _emit_runs(outbox, 500, 2)
        report = outbox.close(30)
        assert report.delivered == 1_000
        assert sum(len(orjson.loads(body)) for body in server.bodies) == 1_000
        assert server.peak_requests <= 2, server.peak_requests
        assert server.peak_connections <= 2, server.peak_connections


def test_single_mode_sends_a_jobs_events_one_after_another():
    """Job events (no run) share their order key (the job's): single mode must send them one
    after another, as it does a run's, not side by side (before: grouped by run id alone, so
    each went on its own and a backend answering in 0-50 ms got them out of order)."""
    events = 40
    with CountingServer(delay=(0.0, 0.05), seed=5) as server:
        outbox = Outbox(
            HttpTransport(server.url, mode="single", max_concurrent_requests=8),
            linger=0.05,
            close_at_exit=False,
        )
        for n in range(events):
            outbox.emit(
                {
                    "eventTime": "2026-12-02T10:00:00.000000+00:00",
                    "producer": "https://example.com/tests",
                    "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/JobEvent",
                    "job": {"namespace": "tests", "name": "one-job"},
                    "inputs": [],
                    "outputs": [],
                    "n": n,
                }
            )
        report = outbox.close(30)
        assert report.delivered == events == server.received
        assert [orjson.loads(body)["n"] for body in server.bodies] == list(range(events))
        assert server.peak_requests == 1  # one key: one request at a time
