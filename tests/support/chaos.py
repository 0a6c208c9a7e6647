"""A seeded, randomized stateful test of the outbox: real threads, a real HTTP backend behind a
fault-injecting proxy, forks and SIGTERM, with the invariants of ARCHITECTURE.md checked after
every step.

    python tests/support/chaos.py --seed 7 --seconds 600      # a longer soak
    python tests/support/chaos.py --seed 7 --steps 40         # replay the first 40 steps of seed 7

The seed fixes every choice (which step, its arguments, the outbox's settings); the timing of
threads and sockets does not repeat exactly, so a replay runs the same steps, not the same
interleaving.  A failure prints the seed and the steps taken.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/: the support package
sys.path.insert(0, str(Path(__file__).parent.parent.parent))  # the repository: outbox

import orjson

from outbox import Outbox
from outbox._config._config import ResolvedTransport
from outbox._observability._deadletter import Torn, rotated_path, scan
from outbox.tools.faultproxy import FaultProxy
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import CompositeTransport, HttpTransport, OpenLineageTransportAdapter

from support import parts
from support.disk import fill, free, small_disk
from support.helpers import close_account, run_event, wait_until

GRACE = 0.5  # what close() may take beyond its deadline
SLACK = 0.25  # scheduling noise on a shared, busy machine
KiB = 1024

POISON = "POISON-7f3a"  # the backend answers 500 to any request carrying it
# The reasons whose events go to the dead-letter file.
DEAD_LETTERED = ("rejected_by_backend", "poison", "too_large", "invalid_event")
BACKENDS = (
    "healthy",
    "refused",
    "blackhole",
    "reset",
    "garble",
    "http_503",
    "http_429",
    "stalled",
    "small_bodies",
    "slow",
)
# What an outbox of a generation ships through: the HTTP transport; a composite of it and a second
# member (its own sink, behind its own proxy: down, black-holed or slow on its own); or
# openlineage-python's own HTTP transport behind the adapter (its emit blocks, slow when the
# backend is).
SHAPES = ("http", "http", "composite", "adapter")
MEMBER_BACKENDS = ("healthy", "refused", "blackhole", "slow")

SIGTERM_CHILD = """
import logging, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from outbox import Outbox
from outbox.transports import HttpTransport
url, mode, shutdown = sys.argv[1], sys.argv[2], float(sys.argv[3])
outbox = Outbox(HttpTransport(url, mode=mode, timeout=1.0), shutdown_timeout=shutdown, linger=0.01,
                max_events=500, backoff_base=0.05, backoff_cap=0.5)
outbox.close_on_signal()
print("ready", flush=True)
n = 0
while True:
    outbox.emit({"eventType": "START", "eventTime": "2026-12-02T10:00:00+00:00", "producer": "p",
                 "schemaURL": "s", "run": {"runId": "22222222-2222-2222-2222-222222222222"},
                 "job": {"namespace": "chaos", "name": "sigterm"}, "n": n})
    n += 1
    if n % 100 == 0:
        time.sleep(0.001)
"""


# A composite member's accounts that are not losses.
_MEMBER_FIELDS = ("emitted", "delivered", "retried", "queued_events", "in_flight")


class InvariantError(AssertionError):
    pass


class Pulse:
    """A thread of this process that ticks every ``TICK`` seconds, to tell a library that made
    a caller wait from a process that did not run at all.

    A shared machine can leave the whole process off the CPU (or its GIL with a thread stuck in C)
    for a second: then every thread stalls alike, the emitting ones and this one.  The timing
    checks below count against the library only the time this pulse went on beating
    (:meth:`unexplained`); an emit that waits on a lock or a condition while the pulse beats
    still fails them.  While an emit runs long, every thread's stack is sampled once, so that
    the report shows what it waited on."""

    TICK = 0.02
    GAP = 0.1  # a beat this late is a stall of the process

    def __init__(self, slow_emit: float, gap: float = GAP) -> None:
        self.slow_emit = slow_emit
        #: A beat later than this is a stall (``GAP`` by default; a check whose other threads
        #: all wait, not holding the GIL, can tell shorter stalls: two ticks).
        self.gap = gap
        self.emitting: dict[int, float] = {}
        self.gaps: list[tuple[float, float]] = []
        self.last = time.monotonic()  # the latest beat
        self.stacks = "(no emit ran long enough to sample)"
        self._sampled = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="chaos-pulse", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(5)

    def emit_began(self) -> float:
        now = time.monotonic()
        self.emitting[threading.get_ident()] = now
        return now

    def emit_ended(self) -> float:
        self.emitting.pop(threading.get_ident(), None)
        return time.monotonic()

    def unexplained(self, began: float, ended: float) -> float:
        """Of the time from ``began`` to ``ended``, what the process was seen running.  Waits
        for a beat after ``ended`` first: a caller resumed with the rest of a stopped process
        usually runs before the pulse has noted the gap."""
        give_up = time.monotonic() + 5.0
        while self.last < ended and self._thread.is_alive() and time.monotonic() < give_up:
            time.sleep(self.TICK / 4)
        gaps = list(self.gaps)
        if self.last < ended:  # the pulse itself has not run for 5 s: a stall still going on
            gaps.append((self.last, ended))
        stalled = sum(max(0.0, min(end, ended) - max(start, began)) for start, end in gaps)
        return ended - began - stalled

    def _beat(self) -> None:
        while not self._done.wait(self.TICK):
            now = time.monotonic()
            if now - self.last > self.gap:
                self.gaps.append((self.last, now))
                del self.gaps[:-1000]
            self.last = now
            if not self._sampled and any(now - t > self.slow_emit for t in list(self.emitting.values())):
                self._sampled = True
                names = {t.ident: t.name for t in threading.enumerate()}
                self.stacks = "\n".join(
                    f"--- {names.get(ident, ident)} ---\n" + "".join(traceback.format_stack(frame))
                    for ident, frame in sys._current_frames().items()
                )


T = TypeVar("T")


def running_time(call: Callable[[], T]) -> tuple[T, float]:
    """``call()``'s result, and the seconds this process ran while it did: the process's stalls
    on a loaded machine (a beat of :class:`Pulse` more than ``Pulse.GAP`` late) left out, as
    the chaos test counts a close against its deadline.  A call that waits on anything while
    the process runs is counted whole."""
    pulse = Pulse(slow_emit=float("inf"))
    try:
        began = time.monotonic()
        result = call()
        ended = time.monotonic()
        return result, pulse.unexplained(began, ended)
    finally:
        pulse.stop()


def check(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantError(message)


class Chaos:
    def __init__(
        self, seed: int, *, seconds: float, max_steps: int | None = None, disk: bool = False
    ) -> None:
        # With ``disk``, the spill directory is on a 4 MiB tmpfs (root only) that a file of
        # someone else's fills and frees before some steps, drawn from a stream of its own.
        self.mounts = contextlib.ExitStack()
        self.disk: Path | None = self.mounts.enter_context(small_disk("4m")) if disk else None
        self.disk_rng = random.Random(seed ^ 0xD15C)
        self.seed = seed
        self.rng = random.Random(seed)
        self.seconds = seconds
        self.max_steps = max_steps
        self.steps: list[str] = []
        self.errors: list[str] = []  # exceptions that escaped to a caller (on any thread)
        self.pulse = Pulse(slow_emit=0.5)
        self.sink = Sink(behaviour=SinkBehaviour(poison=POISON)).start()
        self.proxy = FaultProxy("127.0.0.1", self.sink.port).start()
        self.backend = "healthy"
        # The composite's second member: a backend of its own.
        self.sink2 = Sink(behaviour=SinkBehaviour(poison=POISON)).start()
        self.proxy2 = FaultProxy("127.0.0.1", self.sink2.port).start()
        self.member_backend = "healthy"
        self.shapes: dict[str, int] = defaultdict(int)
        self.generation = 0
        self.closes = 0
        self.forks = 0
        self.sigterms = 0
        self.folder = tempfile.mkdtemp(prefix="outbox-chaos-")
        # The spill: one directory for every generation, each outbox using it or not (drawn from
        # a stream of its own, so that a seed's other steps stay what they were): a generation
        # closed with events held hands them to the next one that uses it.
        # (With ``disk``, on the tmpfs.)
        self.spill_dir = str(self.disk / "spill") if self.disk else tempfile.mkdtemp(prefix="chaos-spill-")
        self.spill_rng = random.Random(seed ^ 0x5EED)
        self.spilled = 0  # generations with a spill
        self.checked: dict[int, int] = {}  # per sink: its events looked at by the last check
        self._new_outbox()

    # -- the system under test ------------------------------------------------------------

    def _new_outbox(self) -> None:
        rng = self.rng
        self.generation += 1
        self.job = f"chaos-{self.seed}-{self.generation}"
        max_bytes = rng.choice([64 * KiB, 256 * KiB, 4096 * KiB])
        self.settings: dict[str, Any] = {
            "max_events": rng.choice([50, 300, 2000]),
            "max_bytes": max_bytes,
            "policy": rng.choice(["drop_oldest", "drop_newest", "block"]),
            "block_timeout": 0.01,
            "linger": rng.choice([0.0, 0.01, 0.1]),
            "shutdown_timeout": rng.choice([0.5, 1.0, 2.0]),
            "backoff_base": rng.choice([0.01, 0.05, 0.2]),
            "backoff_cap": rng.choice([0.2, 1.0, 5.0]),
            "send_timeout": rng.choice([1.0, 3.0]),
            "close_at_exit": False,
        }
        # Half the outboxes keep a dead-letter file, some with a cap small enough to rotate and fill.
        self.dead_letter: str | None = None
        if rng.random() < 0.5:
            self.dead_letter = os.path.join(self.folder, f"dead-{self.generation}.jsonl")
            self.settings["dead_letter"] = self.dead_letter
            self.settings["dead_letter_max_bytes"] = rng.choice([16 * KiB, 64 * 1024 * KiB])
        self.mode = rng.choice(["batch", "single", "auto"])
        spill: dict[str, Any] = {}
        self.shape = rng.choice(SHAPES)
        self.shapes[self.shape] += 1
        transport: Any = HttpTransport(self.proxy.url, mode=self.mode, timeout=1.0)
        if self.shape == "composite":
            other = HttpTransport(self.proxy2.url, mode="batch", timeout=1.0)
            transport = CompositeTransport({"main": transport, "other": other})
        elif self.shape == "adapter":
            config = {
                "type": "openlineage.client.transport.http.HttpTransport",
                "url": self.proxy.url,
                "timeout": 1.0,
                "retry": {"total": 0},
            }
            transport = OpenLineageTransportAdapter.from_config(ResolvedTransport(config))
        # The spill with the HTTP transport alone (a composite's members and the adapter have none),
        # every time on a disk that fills.
        if self.shape == "http" and (self.disk is not None or self.spill_rng.random() < 0.5):
            self.spilled += 1
            spill = {
                "spill_dir": self.spill_dir,
                "spill_interval": self.spill_rng.choice([0.02, 0.1]),
                # One in three small enough that an outage fills it (max_spill_bytes reached).
                "max_spill_bytes": self.spill_rng.choice([1024**3, 1024**3, 48 * 1024]),
            }
        self.outbox = Outbox(transport, **self.settings, **spill)
        self.runs = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(12)]
        self.next_n: dict[str, int] = defaultdict(int)
        self.accepted: dict[str, list[int]] = defaultdict(list)  # run id -> n accepted, in order
        # Poison events accepted by earlier generations (one may be adopted through the spill).
        self.poisoned_before = getattr(self, "poisoned_before", 0) + getattr(self, "poisoned", 0)
        self.poisoned = 0  # poison events accepted
        self.run_locks = {run: threading.Lock() for run in self.runs}

    # -- steps ------------------------------------------------------------------------------

    def run(self) -> None:
        started = time.monotonic()
        step = 0
        while time.monotonic() - started < self.seconds and (self.max_steps is None or step < self.max_steps):
            step += 1
            name, action = self._choose()
            if self.disk is not None and self.disk_rng.random() < 0.1:
                if self.disk_rng.random() < 0.5:
                    fill(self.disk)
                    name += " (disk filled first)"
                else:
                    free(self.disk)
                    name += " (disk freed first)"
            self.steps.append(name)
            action()
            self.check_invariants()
        self.steps.append("close (end)")
        self._close([self.rng.choice([1.0, 2.0])], final=True)

    def _choose(self) -> tuple[str, Any]:
        rng = self.rng
        roll = rng.random()
        if roll < 0.40:
            threads, count = rng.randint(1, 4), rng.choice([1, 10, 100, 400])
            big = rng.random() < 0.15
            poison = rng.random() < 0.2
            name = f"emit threads={threads} count={count} big={big} poison={poison}"
            return name, lambda: self._emit(threads, count, big, poison)
        if roll < 0.50:
            member = rng.choice(MEMBER_BACKENDS)
            return f"member backend {member}", lambda: self._set_member_backend(member)
        if roll < 0.62:
            backend = rng.choice(BACKENDS)
            retry_after = rng.choice(["0", "1", "2"])
            return f"backend {backend} retry_after={retry_after}", lambda: self._set_backend(
                backend, retry_after
            )
        if roll < 0.75:
            timeout = rng.choice([0.0, 0.2, 1.0])
            return f"flush {timeout}", lambda: self._flush(timeout)
        if roll < 0.88:
            deadlines = [rng.choice([0.0, 0.3, 1.0, 2.5]) for _ in range(rng.choice([1, 1, 2]))]
            return f"close {deadlines}", lambda: self._close(deadlines)
        if roll < 0.96:
            return "fork", self._fork
        shutdown = rng.choice([0.5, 1.0])
        at = rng.choice([0.1, 0.4])
        return f"sigterm shutdown={shutdown} at={at}", lambda: self._sigterm(shutdown, at)

    def _emit(self, threads: int, count: int, big: bool, poison: bool) -> None:
        rng = self.rng
        assignments = [self.runs[i::threads] for i in range(threads)]
        plans = [[rng.choice(runs) for _ in range(count)] for runs in assignments if runs]
        # A few events the backend cannot map (it answers 500 to any request carrying one).
        poisoned = {(p, rng.randrange(count)) for p in range(len(plans))} if poison else set()
        padding = "x" * (20 * KiB) if big else ""
        block = self.settings["block_timeout"]
        pulse = self.pulse

        def emitter(index: int, plan: list[str]) -> None:
            try:
                for position, run in enumerate(plan):
                    with self.run_locks[run]:  # one emitter per run at a time: its order is defined
                        n = self.next_n[run]
                        self.next_n[run] = n + 1
                        event = run_event(run_id=run, n=n, job=self.job)
                        facets = event["run"]["facets"]
                        if padding:
                            facets["pad"] = {"_producer": "p", "_schemaURL": "s", "x": padding}
                        if (index, position) in poisoned:
                            facets["bad"] = {"_producer": "p", "_schemaURL": "s", "x": POISON}
                        began = pulse.emit_began()
                        if self.outbox.emit(event):
                            self.accepted[run].append(n)
                            if (index, position) in poisoned:
                                self.poisoned += 1
                        ended = pulse.emit_ended()
                        limit = block + GRACE + SLACK
                        if ended - began > limit and (running := pulse.unexplained(began, ended)) > limit:
                            self.errors.append(
                                f"emit took {ended - began:.3f} s (block_timeout {block}), "
                                f"{running:.3f} s of it with the process running; every thread "
                                f"while it waited:\n{pulse.stacks}"
                            )
            except BaseException:
                self.errors.append(traceback.format_exc())

        workers = [threading.Thread(target=emitter, args=(i, plan)) for i, plan in enumerate(plans)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
            check(not worker.is_alive(), "an emitting thread is stuck")

    def _set_backend(self, backend: str, retry_after: str) -> None:
        self.backend = backend
        behaviour = SinkBehaviour(poison=POISON)
        mode = "pass"
        if backend == "refused":
            mode = "refuse"
        elif backend == "blackhole":
            mode = "blackhole"
        elif backend == "reset":
            mode = "reset"
        elif backend == "garble":
            mode = "garble"
        elif backend == "http_503":
            behaviour.fail_status = 503
        elif backend == "http_429":
            behaviour.fail_status = 429
            behaviour.retry_after = retry_after
        elif backend == "stalled":
            behaviour.delay = 1.5
        elif backend == "small_bodies":
            behaviour.max_body = 60 * KiB  # 413 to larger requests: batches are split
        self.sink.behaviour = behaviour
        self.proxy.latency = 0.5 if backend == "slow" else 0.0  # a slow emit behind the adapter
        self.proxy.mode = mode  # type: ignore[assignment]

    def _set_member_backend(self, backend: str) -> None:
        """The composite's second member's backend, apart from the first's."""
        self.member_backend = backend
        self.proxy2.latency = 0.5 if backend == "slow" else 0.0
        self.proxy2.mode = {"refused": "refuse", "blackhole": "blackhole"}.get(backend, "pass")  # type: ignore[assignment]

    def _flush(self, timeout: float) -> None:
        began = time.monotonic()
        try:
            self.outbox.flush(timeout)
        except BaseException:
            self.errors.append(traceback.format_exc())
        ended = time.monotonic()
        took = self.pulse.unexplained(began, ended)
        check(
            took <= timeout + GRACE + SLACK,
            f"flush({timeout}) took {ended - began:.3f} s ({took:.3f} s running)",
        )

    def _close(self, deadlines: list[float], final: bool = False) -> None:
        self.closes += 1
        results: list[tuple[float, float, float, Any]] = []  # deadline, running, wall, report

        def closer(deadline: float) -> None:
            began = time.monotonic()
            try:
                report = self.outbox.close(deadline)
            except BaseException:
                self.errors.append(traceback.format_exc())
                return
            ended = time.monotonic()
            results.append((deadline, self.pulse.unexplained(began, ended), ended - began, report))

        threads = [threading.Thread(target=closer, args=(d,)) for d in deadlines[1:]]
        for thread in threads:
            thread.start()
        closer(deadlines[0])
        for thread in threads:
            thread.join(10)
            check(not thread.is_alive(), "a closing thread is stuck")
        earliest = min(deadlines)
        reports = {id(report) for *_, report in results}
        check(len(reports) == 1, f"overlapping closes returned different reports: {results}")
        for deadline, running, took, report in results:
            check(
                running <= deadline + GRACE + SLACK,
                f"close({deadline}) took {took:.3f} s ({running:.3f} s running)",
            )
            check(report.pending == 0, f"a final report has pending events: {report}")
            if report.timed_out and deadline == earliest:
                # Events remained: it must have kept trying until the (earliest) deadline.
                check(took >= earliest - SLACK, f"close({deadline}) gave up after {took:.3f} s: {report}")
        report = results[0][3]
        check(report.emitted == report.delivered + report.lost, f"close report not exact: {report}")
        self._check_generation(report)
        self._check_dead_letters(report)
        if not final:
            self._new_outbox()

    def _check_generation(self, report: Any) -> None:
        """What the backend holds of this generation agrees with what the outbox reported (for a
        composite: what each member's backend holds with what that member reported)."""
        time.sleep(0.05)  # a response the proxy relayed may still be on its way to the sink's list
        if self.shape != "composite":
            self._check_sink(self.sink, report.delivered, report.undelivered)
            return
        for name, sink in (("main", self.sink), ("other", self.sink2)):
            counts = report.members[name]
            self._check_sink(sink, counts["delivered"], counts)
            losses = sum(n for key, n in counts.items() if key not in _MEMBER_FIELDS)
            check(
                counts["emitted"] == counts["delivered"] + losses and counts["emitted"] == report.delivered,
                f"member {name}'s final accounts are not exact: {counts} ({report})",
            )

    def _check_sink(self, sink: Sink, delivered: int, undelivered: Any) -> None:
        arrived: dict[str, list[int]] = defaultdict(list)
        for event in sink.events:
            check("bad" not in event["run"].get("facets", {}), "the backend took a poison event")
            if event["job"]["name"] == self.job:
                arrived[event["run"]["runId"]].append(event["n"])
        distinct = sum(len(set(ns)) for ns in arrived.values())
        # Events of earlier generations (and of their forked children) this one adopted from the
        # spill and delivered.
        earlier = {f"chaos-{self.seed}-{g}" for g in range(1, self.generation)}
        earlier |= {f"{job}-child" for job in [*earlier, self.job]}
        events = sink.events
        # (Counted with duplicates: at least once across a restart may send an event twice.)
        checked = self.checked.get(id(sink), 0)
        adopted = sum(e["job"]["name"] in earlier for e in events[checked:])
        self.checked[id(sink)] = len(events)
        poison = undelivered.get("poison", 0)
        could = self.poisoned + (self.poisoned_before if parts.spill(self.outbox) is not None else 0)
        check(poison <= could, f"{poison} events dropped as poison, {could} were")
        check(
            distinct + adopted >= delivered,
            f"{delivered} reported delivered, {distinct} + {adopted} adopted arrived",
        )
        # A run's order holds across generations too (the spill hands events on, oldest first).
        across: dict[str, list[int]] = defaultdict(list)
        for event in events:
            if event["job"]["name"] in earlier:
                across[event["run"]["runId"]].append(event["n"])
        for run, ns in across.items():
            firsts = list(dict.fromkeys(ns))
            check(
                firsts == sorted(firsts), f"run {run}: arrived out of order across a restart: {firsts[:40]}"
            )
        for run, ns in arrived.items():
            accepted = set(self.accepted[run])
            phantom = set(ns) - accepted
            check(not phantom, f"run {run}: events {sorted(phantom)[:5]} arrived but were never accepted")
            firsts = list(dict.fromkeys(ns))  # first arrival of each event, duplicates dropped
            check(firsts == sorted(firsts), f"run {run}: arrived out of order: {firsts[:40]}")

    def _check_dead_letters(self, report: Any) -> None:
        """Every event settled for good is in the dead-letter file, whole, or counted as what the
        file could not take; nothing in it is torn."""
        if self.dead_letter is None:
            return
        due = sum(report.undelivered.get(reason, 0) for reason in DEAD_LETTERED)
        # A composite's members settle for good on their own (each its own worker), and write
        # to the same file: their losses are in the report's members, not in undelivered.
        due += sum(counts.get(reason, 0) for counts in report.members.values() for reason in DEAD_LETTERED)

        def counted() -> int:
            return sum(self.outbox.stats().dead_letter.values())

        deadline = time.monotonic() + 2.0  # the worker accounts, then writes
        while counted() < due and time.monotonic() < deadline:
            time.sleep(0.01)
        accounts = dict(self.outbox.stats().dead_letter)
        check(counted() == due, f"dead letters {accounts} for {due} events settled for good: {report}")
        # This generation's events, and with a spill those of earlier generations (and of their
        # forked children) it adopted: a poison among them is dead-lettered here.  (A child of
        # this generation writes the same file under its own accounts.)
        own = {self.job}
        if parts.spill(self.outbox) is not None:
            earlier = {f"chaos-{self.seed}-{g}" for g in range(1, self.generation)}
            own |= earlier | {f"{job}-child" for job in earlier}
        kept = 0
        jobs: dict[str, int] = {}
        for path in (rotated_path(self.dead_letter), self.dead_letter):
            if not os.path.exists(path):
                continue
            with open(path, "rb") as file:
                for item in scan(file):
                    check(not isinstance(item, Torn), f"a torn dead-letter record in {path}: {item}")
                    assert not isinstance(item, Torn)
                    check(item.event is not None, f"a dead letter without its event in {path}")
                    assert item.event is not None
                    job = orjson.loads(item.event)["job"]["name"]
                    jobs[job] = jobs.get(job, 0) + 1
                    if job in own:
                        kept += 1
        check(
            kept == accounts.get("written", 0),
            f"{kept} dead letters in the file, {accounts} counted (jobs in the file: {jobs})",
        )

    def _fork(self) -> None:
        self.forks += 1
        job = f"{self.job}-child"
        if not faulthandler.is_enabled():  # (for a child stuck before its own watchdog)
            faulthandler.enable(all_threads=True)
        with warnings.catch_warnings():  # Python 3.12+ warns of forking a threaded process
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            code = 3
            # A child stuck for 8 s writes every thread's stack to stderr (captured with the
            # failure) and exits 1, before the parent gives up on it at 10 s.
            faulthandler.dump_traceback_later(8.0, exit=True)
            try:
                stats = self.outbox.stats()
                fresh = stats.emitted == 0 and stats.queued_events == 0 and stats.in_flight == 0
                for n in range(5):
                    self.outbox.emit(run_event(n=n, job=job))
                report = self.outbox.close(1.0)
                exact = report.emitted == report.delivered + report.lost
                # Its own five, and the events of dead owners it adopted (an earlier child's
                # left on disk at its close): an outbox's accounts include what it adopts.
                adopted = self.outbox.stats().spill.get("recovered", 0)
                code = 0 if (fresh and exact and report.emitted - adopted in (0, 5)) else 2
                if code:
                    sys.stderr.write(f"forked child: fresh={fresh} ({stats}) report={report}\n")
            finally:
                os._exit(code)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                check(
                    os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
                    f"forked child: status {status} (exit 1: stuck for 8 s, its stack is in stderr;"
                    " exit 2: not fresh or not exact, its stats and report are in stderr)",
                )
                return
            time.sleep(0.01)
        # Not even its own watchdog (armed as it starts) ended it: stuck before that, in
        # os.fork's after-fork hooks (ours or the interpreter's).  SIGABRT has the fault handler
        # it inherited (pytest's, or enabled by this harness) write every thread's stack to
        # stderr, captured with the failure; then SIGKILL, if that did not end it either.
        os.kill(pid, signal.SIGABRT)
        aborted, reaped = time.monotonic() + 3, False
        while not reaped and time.monotonic() < aborted:
            reaped = os.waitpid(pid, os.WNOHANG)[0] != 0
            time.sleep(0.01)
        if not reaped:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise InvariantError(
            "a forked child did not finish in 10 s, nor arm its watchdog: stuck in os.fork's "
            "after-fork hooks? (SIGABRT sent: its threads' stacks are in the captured stderr)"
        )

    def _sigterm(self, shutdown: float, at: float) -> None:
        self.sigterms += 1
        proc = subprocess.Popen(
            [sys.executable, "-c", SIGTERM_CHILD, self.proxy.url, self.mode, str(shutdown)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            check(proc.stdout.readline().strip() == "ready", "the SIGTERM child did not start")
            time.sleep(at)
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            if self.rng.random() < 0.5:
                time.sleep(0.05)
                proc.send_signal(signal.SIGTERM)  # a second one, while it closes
            _, err = proc.communicate(timeout=shutdown + 10)
            took = time.monotonic() - signalled
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise InvariantError("the SIGTERM child did not end") from None
        check(proc.returncode == -signal.SIGTERM, f"SIGTERM child exited {proc.returncode}: {err[-1500:]}")
        check(took <= shutdown + 1.0 + SLACK, f"SIGTERM child ended {took:.2f} s after the signal")
        lines = [line for line in err.splitlines() if "closed on signal" in line]
        if lines:  # logged when something was lost; check that the account adds up
            text = lines[0]
            account = close_account(text, f"on signal {signal.SIGTERM.value}")
            check(account is not None, f"SIGTERM report unreadable: {text}")
            assert account is not None
            emitted, delivered, undelivered = account
            undelivered.pop("after_close", None)
            check(emitted == delivered + sum(undelivered.values()), f"SIGTERM report not exact: {text}")

    # -- invariants ---------------------------------------------------------------------------

    def check_invariants(self) -> None:
        check(not self.errors, "an exception escaped to a caller:\n" + "\n".join(self.errors[:3]))
        outbox = self.outbox
        stats = outbox.stats()
        check(
            stats.offered == stats.delivered + stats.lost + stats.queued_events + stats.in_flight,
            f"accounting is not exact: {stats}",
        )
        buf = parts.buffer(outbox)
        max_bytes = self.settings["max_bytes"]
        held, held_bytes, overflow, evicted, estimate = memory(buf)
        window = buf.holdings.overflow
        if held_bytes > max_bytes and window is not None and window.events and not window.stuck:
            # The spill's overflow holds objects admitted at an estimate that grew since they
            # came (priced anew, or measured by a sample: the queue's are shed at once), or
            # what is in flight weighs more than its estimate: the overflow is written to disk
            # at the sidecar's next turn (``Window.wants_write``), and then memory holds the
            # bound again.
            wait_until(lambda: memory(buf)[1] <= max_bytes or window.stuck, 5.0)
            held, held_bytes, overflow, evicted, estimate = memory(buf)
        check(
            evicted * estimate <= max_bytes // 32,
            f"{evicted} evicted events of {estimate} bytes wait to be freed, max_bytes {max_bytes}",
        )
        check(
            held <= self.settings["max_events"],
            f"{held} events held, max_events {self.settings['max_events']}",
        )
        # (Unless the disk cannot take the overflow: then its objects hold beyond max_bytes as
        # objects may, at most 2,048 of them: docs/operations.md, "Memory".  Chaos emits objects
        # only: each came into the overflow at an estimate, priced anew or measured since.)
        stuck = window is not None and (window.stuck or not window.usable)
        check(
            held_bytes <= max_bytes
            or (stuck and held_bytes - overflow[1] <= max_bytes and overflow[0] <= 2048),
            f"{held_bytes} bytes held ({overflow[0]} objects of the overflow), max {max_bytes}: "
            + held_in_memory(buf),
        )
        for name, counts in stats.members.items() if self.shape == "composite" else ():
            losses = sum(n for key, n in counts.items() if key not in _MEMBER_FIELDS)
            check(
                counts["emitted"]
                == counts["delivered"] + losses + counts["queued_events"] + counts["in_flight"],
                f"member {name}'s accounting is not exact: {counts}",
            )
        fanout = parts.sidecar(outbox).members
        for name, member in fanout.members.items() if fanout is not None else ():
            mbuf = member.buffer
            with mbuf.lock:
                held, held_bytes = (
                    len(mbuf.holdings.queue) + mbuf.holdings.in_flight,
                    mbuf.holdings.queued_bytes + mbuf.holdings.in_flight_bytes,
                )
            check(held <= self.settings["max_events"], f"member {name} holds {held} events")
            check(held_bytes <= self.settings["max_bytes"], f"member {name} holds {held_bytes} bytes")
            msidecar = member.sidecar
            if msidecar.report is None and msidecar.thread is not None:
                check(msidecar.thread.is_alive(), f"member {name}'s sidecar thread died")
        sidecar = parts.sidecar(outbox)
        if sidecar.report is None and sidecar.thread is not None:
            check(sidecar.thread.is_alive(), f"the sidecar thread died: {stats.last_error}")
        check(sidecar.stopped is None, f"the worker stopped: {sidecar.stopped}")

    def close(self) -> None:
        self.pulse.stop()
        self.proxy.stop()
        self.sink.stop()
        self.proxy2.stop()
        self.sink2.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
        shutil.rmtree(self.spill_dir, ignore_errors=True)
        self.mounts.close()

    def summary(self) -> str:
        return (
            f"seed {self.seed}: {len(self.steps)} steps, {self.generation} outboxes, {self.closes} closes, "
            f"{self.forks} forks, {self.sigterms} SIGTERMs, shapes {dict(self.shapes)}, "
            f"{self.spilled} outboxes with a spill, the process stalled {len(self.pulse.gaps)} time(s) "
            f"(longest {max((b - a for a, b in self.pulse.gaps), default=0.0):.2f} s)"
        )


def held_in_memory(buf: Any) -> str:
    """Where a buffer's bytes are, for a failure's message: queued, in flight, the overflow."""
    with buf.lock:
        held = buf.holdings
        text = (
            f"queued {len(held.queue)} ({held.queued_bytes} bytes, {held.estimated} at the estimate "
            f"{held.estimate}), in flight {held.in_flight} ({held.in_flight_bytes} bytes)"
        )
        window = held.overflow
        if window is not None:
            text += (
                f", overflow {len(window.events)} ({window.bytes(held.estimate)} bytes), reading "
                f"{window.reading_events} ({window.reading_bytes} bytes), stuck {window.stuck}"
            )
        return text


def memory(buf: Any) -> tuple[int, int, tuple[int, int], int, int]:
    """What a buffer holds in memory, under its lock: events, bytes (objects at the estimate),
    the spill's overflow's events and bytes, evicted events not yet freed, the estimate.
    A spill's overflow and the room a read of its stretch holds are memory too."""
    with buf.lock:
        held = buf.holdings
        events = len(held.queue) + held.in_flight
        nbytes = held.queued_bytes + held.in_flight_bytes
        window, overflow = held.overflow, (0, 0)
        if window is not None:
            events += len(window.events) + window.reading_events
            nbytes += window.bytes(held.estimate) + window.reading_bytes
            overflow = (len(window.events), window.bytes(held.estimate))
        return events, nbytes, overflow, len(held.evicted), held.estimate


def run_chaos(seed: int, seconds: float, max_steps: int | None = None, disk: bool = False) -> Chaos:
    chaos = Chaos(seed, seconds=seconds, max_steps=max_steps, disk=disk)
    try:
        chaos.run()
        chaos.check_invariants()
    except BaseException as exc:
        steps = "\n".join(f"  {i + 1:4d}. {step}" for i, step in enumerate(chaos.steps))
        raise AssertionError(
            f"chaos seed {seed} failed at step {len(chaos.steps)}: {exc}\n"
            f"replay: python tests/support/chaos.py --seed {seed} --steps {len(chaos.steps)}"
            f"{' --disk' if disk else ''}\nsteps:\n{steps}"
        ) from exc
    finally:
        chaos.close()
    return chaos


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=60.0, help="run for this long (default 60)")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--disk", action="store_true", help="the spill on a 4 MiB tmpfs that fills (root)")
    args = parser.parse_args()
    print(run_chaos(args.seed, args.seconds, args.steps, args.disk).summary())


if __name__ == "__main__":
    main()
