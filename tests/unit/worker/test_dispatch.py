"""The worker's decisions (``outbox._worker._dispatch``: the backlog, the breaker, the lanes) driven
with scripted answers and a clock of the test's own: no threads, no sockets, every run the
same for a seed.  A simulated backend answers each lane after a latency; the simulation
checks that every event ends delivered or settled as poison, that each key's events arrive in
the order they were emitted, and that the poison events (and only they) are settled as such.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox import About, Outcome
from outbox._run._serde import SerializedEvent
from outbox._worker._backlog import Backlog
from outbox._worker._dispatch import Dispatch
from outbox._worker._held import Held

DELIVERED = Outcome.delivered()


@dataclass
class Script:
    """What is emitted, and how the backend behaves."""

    runs: int
    per_run: int
    poison: set[int]  # positions (in emit order) of the events the backend cannot take
    max_batch_events: int = 1000
    max_concurrency: int = 8
    poison_attempts: int = 5
    #: "whole": a request with a poison event is refused as a whole (Marquez, single events
    #: too); "partial": the batch endpoint refuses that event only (its run's later ones wait).
    refusal: str = "whole"
    latency: float = 0.01
    #: The backend refuses every request (about itself) between these times.
    down: tuple[float, float] = (0.0, 0.0)
    #: Other runs' events keep coming, one every this many seconds (0: none), as in a function's
    #: normal life: the evidence that the backend takes events while it refuses the poison.
    traffic_every: float = 0.2
    lane_events: int | None = None


@dataclass
class Result:
    delivered: list[Held] = field(default_factory=list)
    poison: list[Held] = field(default_factory=list)
    requests: int = 0
    settled_at: float = float("inf")


def _held(seq: int, run: str, n: int, poison: bool) -> Held:
    body = orjson.dumps({"run": {"runId": run}, "n": n, "poison": poison})
    return Held(seq, SerializedEvent(body, run, None), len(body))


def simulate(script: Script, seed: int, horizon: float = 120.0, backlog: type[Backlog] = Backlog) -> Result:
    random.seed(seed)  # the backoff's jitter
    dispatch = Dispatch(
        max_batch_events=script.max_batch_events,
        max_batch_bytes=1 << 30,
        max_concurrency=script.max_concurrency,
        backoff_base=0.1,
        backoff_cap=30.0,
        circuit_threshold=5,
        poison_attempts=script.poison_attempts,
        max_retry_after=300.0,
        lane_events=script.lane_events,
    )
    dispatch.backlog = backlog(script.poison_attempts)
    ours = [
        _held(k, f"run-{k % script.runs}", k // script.runs, k in script.poison)
        for k in range(script.runs * script.per_run)
    ]
    dispatch.backlog.add(ours)
    outstanding = {item.seq for item in ours}
    result = Result()
    seq = len(ours)
    now = 0.0
    next_traffic = script.traffic_every or float("inf")
    in_flight: list[tuple[float, object]] = []

    def answer(items: list[Held], at: float) -> list[Outcome]:
        result.requests += 1
        if script.down[0] <= at < script.down[1]:
            return [Outcome.retry("http_503", "down")] * len(items)
        bad = [orjson.loads(item.event.body)["poison"] for item in items]
        if not any(bad):
            return [DELIVERED] * len(items)
        if script.lane_events is not None:  # single mode: each event a request of its own
            refused = Outcome.retry("http_500", "cannot map", about=About.EVENT)
            stopped: set[str] = set()
            answers = []
            for item, poisoned in zip(items, bad, strict=True):
                run = item.event.run_id
                if poisoned or run in stopped:  # a run's later events follow it: refused too
                    answers.append(refused if poisoned else Outcome.deferred())
                    stopped.add(run)
                else:
                    answers.append(DELIVERED)
            return answers
        if script.refusal == "whole":  # a 500 to the request: about one of its events, not which
            about = About.EVENT if len(items) == 1 else About.REQUEST
            return [Outcome.retry("http_500", "cannot map", about=about)] * len(items)
        outcomes: list[Outcome] = []
        stopped = set()
        for item, poisoned in zip(items, bad, strict=True):
            run = item.event.run_id
            if poisoned:
                outcomes.append(Outcome.retry("partial_success", "cannot map", about=About.EVENT))
                stopped.add(run)
            elif run in stopped:
                outcomes.append(Outcome.deferred())  # its run's earlier event failed: it waits
            else:
                outcomes.append(DELIVERED)
        return outcomes

    idle = 0
    while now < horizon:
        before = now
        for lane in dispatch.next_lanes(now, len(in_flight), more_queued=False):
            in_flight.append((now + script.latency, lane))
        if not outstanding:
            result.settled_at = now
            break
        # As the worker does: it sleeps until the next answer or the wake the dispatch names;
        # a wake at which no lane can go is a spin (caught by ``idle`` below).
        wake = now + dispatch.next_wake(now, len(in_flight))
        times = [at for at, _ in in_flight] + [next_traffic, wake]
        now = max(now, min(times)) if times else horizon
        idle = idle + 1 if now == before else 0
        assert idle < 1000, f"no progress at {now}: the worker would spin ({dispatch.backlog.ready} ready)"
        if now >= next_traffic:
            dispatch.backlog.add([_held(seq, f"traffic-{seq}", 0, False)])
            seq += 1
            next_traffic += script.traffic_every
        for entry in sorted((e for e in in_flight if e[0] <= now), key=lambda e: e[0]):
            in_flight.remove(entry)
            lane = entry[1]
            outcomes = answer(lane.items, now)  # type: ignore[attr-defined]
            settled = dispatch.answer(lane, outcomes, now, cpu=0.0).settled  # type: ignore[arg-type]
            for item in settled.delivered:
                result.delivered.append(item)
                outstanding.discard(item.seq)
            for item, _ in settled.poison:
                result.poison.append(item)
                outstanding.discard(item.seq)
            assert not settled.rejected
    return result


def check(script: Script, result: Result) -> None:
    ours = [item for item in result.delivered if item.event.run_id.startswith("run-")]
    assert {item.seq for item in result.poison} == script.poison, (script, result.requests)
    assert len(ours) + len(result.poison) == script.runs * script.per_run, (script, result.requests)
    by_run: dict[str, list[int]] = defaultdict(list)
    for item in ours:
        by_run[item.event.run_id].append(item.seq)
    assert all(seqs == sorted(seqs) for seqs in by_run.values()), "a run's events overtook each other"
    assert len(set(item.seq for item in result.delivered)) == len(result.delivered), "delivered twice"


class _Unfair(Backlog):
    """The backlog without its fairness rule: while the backend fails, the oldest key always
    goes first, even when it has just been refused."""

    def take_lane(self, now, most_events, most_bytes, *, fair=False):  # type: ignore[override]
        return super().take_lane(now, most_events, most_bytes)


def test_three_poison_events_and_a_good_one_each_in_its_own_run_are_isolated_by_close():
    """The stall: three poison events and one good one, each in its own run, batch mode,
    poison_attempts=2, nothing else coming.  Refused as a whole, bisected down to single
    events; the backend fails (nothing it takes), so one request at a time, and the oldest
    key went first every time: a poison event, tried again and again, while the good one
    (the evidence that the backend takes others) waited behind it for good.  Within a 30 s
    close everything must be settled; without the fairness rule some seeds never settle."""
    script = Script(runs=4, per_run=1, poison={0, 1, 2}, poison_attempts=2, traffic_every=0)
    stalled_unfair = 0
    for seed in range(40):
        result = simulate(script, seed, horizon=30.0)
        check(script, result)
        assert result.settled_at < 30.0
        unfair = simulate(script, seed, horizon=30.0, backlog=_Unfair)
        stalled_unfair += unfair.settled_at == float("inf")
    assert stalled_unfair >= 1, "the simulation no longer reproduces the stall it was written for"


@pytest.mark.parametrize("refusal", ["whole", "partial"])
@pytest.mark.parametrize("max_batch_events", [1, 3, 1000])
def test_poison_is_isolated_and_everything_else_delivered_in_order(refusal, max_batch_events):
    script = Script(
        runs=200, per_run=5, poison={3, 250, 751}, refusal=refusal, max_batch_events=max_batch_events
    )
    result = simulate(script, seed=1)
    check(script, result)
    # Simulated seconds (10 ms a request): isolation is a few round trips per bisection level
    # and per blamed attempt, not backoffs grown as if the backend were down.
    assert result.settled_at < 5.0, result.settled_at


def test_a_backend_that_refuses_everything_about_the_events_is_not_poisoned():
    """Every request refused with a 500 and nothing else taken: no evidence, nothing settled
    (a backend that is down, not poison), and the attempts are paced."""
    script = Script(runs=10, per_run=3, poison=set(range(30)), traffic_every=0)
    result = simulate(script, seed=3, horizon=60.0)
    assert result.poison == []
    assert result.delivered == []
    assert result.requests < 200  # paced: not a storm of single requests


def test_a_backend_down_for_a_while_loses_nothing_and_keeps_order():
    script = Script(runs=100, per_run=4, poison=set(), down=(0.0, 5.0), max_batch_events=50)
    result = simulate(script, seed=2)
    check(script, result)
    assert result.settled_at > 5.0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runs=st.integers(1, 40),
    per_run=st.integers(1, 5),
    data=st.data(),
    max_batch_events=st.sampled_from([1, 2, 3, 8, 64, 1000]),
    max_concurrency=st.sampled_from([1, 2, 8]),
    refusal=st.sampled_from(["whole", "partial"]),
    poison_attempts=st.integers(1, 5),
    down=st.sampled_from([(0.0, 0.0), (0.0, 2.0), (1.0, 3.0)]),
    lane_events=st.sampled_from([None, 4]),
    seed=st.integers(0, 1000),
)
def test_random_scripts_settle_every_event_and_keep_each_runs_order(
    runs, per_run, data, max_batch_events, max_concurrency, refusal, poison_attempts, down, lane_events, seed
):
    total = runs * per_run
    poison = set(data.draw(st.sets(st.integers(0, total - 1), max_size=min(4, total))))
    script = Script(
        runs=runs,
        per_run=per_run,
        poison=poison,
        max_batch_events=max_batch_events,
        max_concurrency=max_concurrency,
        refusal=refusal,
        poison_attempts=poison_attempts,
        down=down,
        lane_events=lane_events,
    )
    result = simulate(script, seed, horizon=300.0)
    check(script, result)


def test_nothing_to_wake_for_once_the_close_deadline_leaves_no_time_to_send():
    """Past the point where nothing more is sent, the dispatch names no wake (the worker ends
    at the deadline), rather than a wake at which no lane can go: a worker that believed it
    spun until the deadline's cancellation reached it, and forever if that was lost."""
    dispatch = Dispatch(
        max_batch_events=10,
        max_batch_bytes=1 << 20,
        max_concurrency=2,
        backoff_base=0.1,
        backoff_cap=1.0,
        circuit_threshold=5,
        poison_attempts=5,
        max_retry_after=300.0,
    )
    dispatch.backlog.add([_held(k, f"run-{k}", 0, False) for k in range(5)])
    dispatch.begin_close(1.0)
    assert dispatch.next_wake(0.5, in_flight=0) == 0.0  # time left: a lane may go now
    assert dispatch.next_lanes(0.95, in_flight=0, more_queued=False) == []
    assert dispatch.next_wake(0.95, in_flight=0) == float("inf")
    assert dispatch.next_wake(5.0, in_flight=0) == float("inf")
