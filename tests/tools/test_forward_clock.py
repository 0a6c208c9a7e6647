"""outbox forward through outages of hours, on a fake clock: the real ``Forwarder`` code, with
``time.monotonic`` and the waits of its module replaced by a clock that jumps instead of
sleeping.  (tests/tools/test_forward.py runs it against the embedded broker and the sink, in real
time.)"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import types
from typing import Any

import orjson
import pytest

from outbox import Outcome
from outbox._worker import _retry
from outbox.tools import forward
from outbox.tools.forward import Forwarder
from outbox.transports import DELIVERED

from support.helpers import run_event

HOUR = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def monotonic(self) -> float:
        return self.now


class Waits:
    """``asyncio`` as forward.py uses it, but ``sleep`` and ``wait_for`` move the clock.  At
    ``stop_at`` (fake seconds) the forwarder is stopped, as SIGTERM would, in the wait under way."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.stop_at: float | None = None
        self.forwarder: Forwarder | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    def _stop_within(self, delay: float) -> bool:
        if self.stop_at is None or self.clock.now + delay < self.stop_at:
            return False
        self.clock.now = max(self.clock.now, self.stop_at)
        self.stop_at = None
        assert self.forwarder is not None
        self.forwarder.stop()
        return True

    async def sleep(self, delay: float) -> None:
        assert delay >= 0, delay
        if not self._stop_within(delay):
            self.clock.now += delay
        await asyncio.sleep(0)

    async def wait_for(self, awaitable: Any, timeout: float) -> Any:
        assert timeout >= 0, timeout
        task = asyncio.ensure_future(awaitable)
        await asyncio.sleep(0)
        if not task.done() and self._stop_within(timeout):
            await asyncio.sleep(0)
        if task.done():
            return task.result()
        task.cancel()
        self.clock.now += timeout
        raise TimeoutError


class DownFor:
    """A backend that answers 503 to the first ``failures`` requests; notes when each came."""

    def __init__(self, clock: Clock, failures: int) -> None:
        self.clock = clock
        self.failures = failures
        self.calls: list[float] = []

    async def send(self, batch: Any, deadline: float) -> list[Outcome]:
        assert deadline > self.clock.now
        self.calls.append(self.clock.now)
        if len(self.calls) <= self.failures:
            return [Outcome.retry("http_503", "backend unavailable")] * len(batch)
        return [DELIVERED] * len(batch)

    async def aclose(self) -> None:
        pass


class Consumer:
    """What ``_Offsets.lag`` asks of the consumer: partition 0 fetched from offset 0 and never committed
    (held), partition 1 never fetched by the loop, its position at 20 of 50."""

    def assignment(self) -> set[str]:
        return {"p0", "p1"}

    def highwater(self, partition: str) -> int:
        return {"p0": 100, "p1": 50}[partition]

    async def position(self, partition: str) -> int:
        return 20


@pytest.fixture
def fake_clock(monkeypatch):
    clock = Clock()
    waits = Waits(clock)
    monkeypatch.setattr(forward, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(forward, "asyncio", waits)
    return clock, waits


def make(clock: Clock, waits: Waits, failures: int, lines: list[str], **kw: Any) -> tuple[Forwarder, DownFor]:
    backend = DownFor(clock, failures)
    forwarder = Forwarder(
        {"bootstrap.servers": "127.0.0.1:9"},
        "lineage",
        backend,
        progress_interval=600.0,
        backoff_base=0.2,
        backoff_cap=30.0,
        print_line=lines.append,
        **kw,
    )
    forwarder._consumer = Consumer()
    forwarder._offsets.held = {"p0": 0}
    waits.forwarder = forwarder
    return forwarder, backend


def records(count: int) -> list[Any]:
    return [
        types.SimpleNamespace(value=orjson.dumps(run_event(n=n)), key=None, partition=0, offset=n)
        for n in range(count)
    ]


def test_forward_retries_one_implementation_of_the_workers_pacing():
    assert forward.backoff_delay is _retry.backoff_delay
    assert forward.close_paced is _retry.close_paced


def test_ten_thousand_failed_attempts_over_hours_are_paced_reported_and_then_delivered(fake_clock):
    clock, waits = fake_clock
    random.seed(7)
    lines: list[str] = []
    forwarder, backend = make(clock, waits, 10_000, lines)
    start = clock.now
    assert asyncio.run(forwarder._forward(records(5), None)) is True
    outage = backend.calls[-1] - start
    assert forwarder.stats.delivered == 5
    assert len(backend.calls) == 10_001
    # Full jitter up to the 30 s cap: hours, each wait within the cap, no burst.
    assert outage > 24 * HOUR, outage / HOUR
    gaps = [b - a for a, b in zip(backend.calls, backend.calls[1:], strict=False)]
    assert max(gaps) <= 30.0
    assert sum(gap < 0.01 for gap in gaps) < 100  # a jittered draw near 0 now and then, no spin
    # A progress line every 10 minutes of the outage (give or take the wait under way), each
    # with the true lag, for how long and how many attempts.
    during = [line for line in lines if "the backend failing for" in line]
    failing_for = [int(re.search(r"failing for (\d+) s", line)[1]) for line in during]  # type: ignore[index]
    assert failing_for[0] <= 600 + 30
    assert max(b - a for a, b in itertools.pairwise(failing_for)) <= 600 + 30 + 1
    assert failing_for[-1] >= outage - 600 - 30
    assert all("lag 130;" in line for line in during), during[-1]  # 100 held + 30 not fetched
    attempts = [int(re.search(r"(\d+) attempt\(s\): backend unavailable", line)[1]) for line in during]  # type: ignore[index]
    assert attempts == sorted(attempts)
    assert attempts[-1] >= 9_000
    assert forwarder._failing_since is None  # settled: the next line says nothing of a failure


def test_a_stop_five_hours_into_an_outage_paces_its_last_attempts_and_leaves_the_batch(fake_clock):
    clock, waits = fake_clock
    random.seed(8)
    lines: list[str] = []
    forwarder, backend = make(clock, waits, 10**9, lines, drain_timeout=10.0)
    stop_at = clock.now + 5 * HOUR
    waits.stop_at = stop_at
    assert asyncio.run(forwarder._forward(records(5), None)) is False  # not settled: not committed
    assert forwarder.stats.delivered == 0
    after = [t for t in backend.calls if t >= stop_at]
    # One attempt at once, then paced as the worker's close: at most a second apart, at least
    # 0.1 s, none in the last 0.1 s (it sent about 1,020 in 2 s before).
    assert after[0] == stop_at
    gaps = [b - a for a, b in itertools.pairwise(after)]
    assert all(_retry.MIN_CLOSE_GAP - 1e-9 <= gap <= _retry.CLOSE_BACKOFF_CAP + 1e-9 for gap in gaps), gaps
    assert len(after) >= 10
    assert after[-1] <= stop_at + 10.0 - _retry.NO_TIME_LEFT
    assert clock.now <= stop_at + 10.0
