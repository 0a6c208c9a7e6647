"""Test transports whose behaviour the test controls, and small event builders."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from outbox import Outcome, SerializedEvent
from outbox.transports import DELIVERED


def run_event(
    run_id: str | None = None, state: str = "START", n: int = 0, job: str = "job"
) -> dict[str, Any]:
    return {
        "eventType": state,
        "eventTime": "2026-12-02T10:00:00.000000+00:00",
        "producer": "https://example.com/tests",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": run_id or str(uuid.uuid4()), "facets": {}},
        "job": {"namespace": "tests", "name": job, "facets": {}},
        "inputs": [],
        "outputs": [],
        "n": n,
    }


class ScriptedTransport:
    """A transport driven by the test.

    - ``gate``: while cleared, ``send`` waits (a backend that does not answer).
    - ``decide``: maps each parsed event to an Outcome (default: delivered).
    - ``delay``: seconds each send takes.
    Records every attempt in ``attempts`` and delivered events in ``delivered``.
    """

    def __init__(
        self,
        decide: Callable[[dict[str, Any]], Outcome] | None = None,
        *,
        delay: float = 0.0,
        open_gate: bool = True,
    ) -> None:
        self.decide = decide or (lambda event: DELIVERED)
        self.delay = delay
        self.gate = threading.Event()
        if open_gate:
            self.gate.set()
        self.lock = threading.Condition()
        self.attempts: list[list[dict[str, Any]]] = []
        self.delivered: list[dict[str, Any]] = []
        self.send_started = threading.Event()
        self.closed = False

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        events = [orjson.loads(e.body) for e in batch]
        with self.lock:
            self.attempts.append(events)
        self.send_started.set()
        while not self.gate.is_set():  # noqa: ASYNC110 - a threading.Event, set from the test's thread
            await asyncio.sleep(0.002)
        if self.delay:
            await asyncio.sleep(self.delay)
        outcomes = [self.decide(e) for e in events]
        with self.lock:
            self.delivered.extend(e for e, o in zip(events, outcomes, strict=True) if o is DELIVERED)
            self.lock.notify_all()
        return outcomes

    async def aclose(self) -> None:
        self.closed = True

    def wait_delivered(self, count: int, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.lock:
            while len(self.delivered) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.lock.wait(remaining)
        return True


class FailingTransport:
    """Never delivers: every event is RETRY."""

    def __init__(self, retry_after: float | None = None) -> None:
        self.calls = 0
        self.retry_after = retry_after

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        self.calls += 1
        return [Outcome.retry("http_503", "backend unavailable", self.retry_after)] * len(batch)

    async def aclose(self) -> None:
        pass


# How much longer than its stated bound a wait may go on before a test gives up: the bounds
# only stop a test that would hang, and beside busy processes (or other suites) a child
# process's start-up alone can take 10-20 s here.  A wait that is met returns at once.
PATIENCE = float(os.environ.get("LINEAGE_OUTBOX_TEST_PATIENCE", "3"))


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``predicate`` held within ``timeout`` (times PATIENCE) seconds."""
    deadline = time.monotonic() + timeout * PATIENCE
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


def inside(thread: threading.Thread, function: str) -> bool:
    """Whether ``thread`` is now running ``function`` (a frame of that name is on its stack):
    a condition to wait on where a test needs a thread to have reached a point, such as an
    emitter blocked for room, before it acts."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def segment_bytes(folder: Any) -> int:
    """What a spill directory's segment files weigh now: a segment the sidecar deletes between
    the listing and its ``stat`` weighs nothing (it is gone)."""
    total = 0
    for path in folder.rglob("*.seg"):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


class TimedEmitter:
    """Emits ``run_event(n=n)`` through an outbox, asserting acceptance and keeping the
    slowest call: a transport that made emit wait would show here in seconds.  ``slow``
    keeps when each call over 0.05 s began and ended, to be judged in the time the process
    ran (``support.chaos.Pulse.unexplained``): beside load, a process left off the CPU for
    half a second is no emit that waited."""

    def __init__(self, outbox: Any) -> None:
        self.outbox = outbox
        self.worst = 0.0
        self.slow: list[tuple[float, float]] = []

    def __call__(self, n: int) -> None:
        started = time.monotonic()
        assert self.outbox.emit(run_event(n=n))
        ended = time.monotonic()
        self.worst = max(self.worst, ended - started)
        if ended - started > 0.05:
            self.slow.append((started, ended))


def run_script(code: str, timeout: float = 60.0, **popen: Any) -> tuple[Any, float]:
    """Run ``code`` in a fresh interpreter; returns (CompletedProcess, seconds it took)."""
    import subprocess
    import sys
    import textwrap

    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )
    return result, time.monotonic() - started


_HELD_PORTS: list[socket.socket] = []


def refused_port() -> int:
    """A TCP port on 127.0.0.1 that refuses connections for the rest of this process: bound
    (without ``SO_REUSEADDR``) and never listening, so the kernel gives it to no other socket.
    ``free_port()`` only says a port is free now: once its probe closes, a server of another
    test (in this worker or another) can be given the same port, and a "down" member then
    delivers to that test's sink (seen once in CI: 4,198 events)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(held)
    return int(held.getsockname()[1])


def close_account(log: str, why: str) -> tuple[int, int, dict[str, int]] | None:
    """(emitted, delivered, not delivered by reason) from the warning a close logs when it did
    not deliver everything (``outbox 'name' closed at exit: ...``); None when there is none."""
    said = re.search(
        rf"closed {re.escape(why)}: (\d+) lineage event\(s\) emitted, (\d+) delivered, "
        r"\d+ not delivered \(([^)]*)\)",
        log,
    )
    if said is None:
        return None
    undelivered = {reason: int(n) for reason, n in (part.split(": ") for part in said[3].split(", "))}
    return int(said[1]), int(said[2]), undelivered
