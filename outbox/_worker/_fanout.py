"""A composite's members, each with a runtime of its own (as Vector gives each sink its own
buffer, and OpenTelemetry each processor its own queue).

An outbox whose transport is a :class:`~outbox.transports.CompositeTransport` sending to every
member (``continue_on_success``, the default) runs in two stages::

    emit ──► intake buffer ──► intake worker ──hand-off──► member A: buffer ──► worker ──► A
                                (serializes once)      └─► member B: buffer ──► worker ──► B

The intake is the outbox's own buffer and worker, unchanged (so ``emit`` is the same few
microseconds whatever the members do); its transport is :class:`HandOff`, which puts each
serialized event (the same object, shared by every member, not copied) in every member's
buffer and answers DELIVERED at once.  Each member then has its own buffer, worker, retry
list, circuit, lanes and sidecar thread: a member that is down, black-holed or slow fills
and drops from its own buffer, backs off on its own circuit, and never delays or drops
another member's events.

The memory bound: each member's buffer has the outbox's ``max_events`` and ``max_bytes``, as
the intake's has; a member's share does not shrink because it has siblings.  Held bytes are
shared (every member holds the same ``bytes`` object of an event), so while the members hold
the same events the whole holds about one ``max_bytes`` of bodies beyond the intake's; in
the worst case (members holding different events) at most ``(members + 1) x max_bytes``.
A member never blocks: under the ``block`` policy the intake blocks ``emit`` as configured,
and a member that is full refuses the newest (``dropped_full`` in its own count); under
``drop_oldest`` it evicts its own oldest.

Close: the outbox's deadline is every member's.  The intake hands on what it holds (within
milliseconds), then every member drains until the same deadline, at the same time, on its
own thread; ``close()`` returns when the last one has, by the deadline plus the close grace.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._buffer._buffer import Buffer, Policy, Reason
from .._config._settings import WorkerSettings
from .._observability._deadletter import DeadLetter
from .._observability._metrics import Metrics
from .._run._serde import weight
from .._runtime._slices import checkpoint
from ..transports._base import DELIVERED, Outcome, SerializedEvent, Transport
from ..transports.composite import CompositeTransport
from ._sidecar import CLOSE_GRACE, Sidecar

__all__ = ["FanOut", "HandOff", "fans_out"]

_INF = float("inf")
# Events handed to a member under one hold of its lock.
_CHUNK = 64


def fans_out(transport: Any) -> bool:
    """Whether ``transport`` is a composite whose members each get every event (and so each
    get a runtime of their own); a failover chain (``continue_on_success=False``) is one
    transport behind one worker."""
    return isinstance(transport, CompositeTransport) and transport.continue_on_success


@dataclasses.dataclass(frozen=True, slots=True)
class _Shape:
    """What every member's runtime is built with (the outbox's own settings)."""

    max_events: int
    max_bytes: int
    policy: Policy
    settings: WorkerSettings
    shutdown_timeout: float
    dead_letter: DeadLetter | None


class Member:
    """One member's runtime: its buffer and its sidecar (thread, worker, retry list, circuit,
    lanes).  A member that is itself a fan-out composite has members of its own."""

    def __init__(self, name: str, outbox_name: str, transport: Transport, shape: _Shape) -> None:
        self.name = name
        nested = transport if isinstance(transport, CompositeTransport) and fans_out(transport) else None
        self.members = FanOut(nested, f"{outbox_name}.{name}", shape) if nested is not None else None
        # A member never blocks the intake's thread: block becomes "refuse the newest".
        policy = Policy.DROP_OLDEST if shape.policy is Policy.DROP_OLDEST else Policy.DROP_NEWEST
        self.buffer = Buffer(
            max_events=shape.max_events, max_bytes=shape.max_bytes, policy=policy, block_timeout=0.0
        )
        # The intake has lingered already: a member sends what it is handed at once.
        settings = dataclasses.replace(shape.settings, linger=0.0)
        self.sidecar = Sidecar(
            self.buffer,
            self.members.hand_off if self.members is not None else transport,
            settings,
            Metrics(f"{outbox_name}.{name}", self.buffer),
            name=f"{outbox_name}.{name}",
            shutdown_timeout=shape.shutdown_timeout,
            close_at_exit=False,  # the outbox's own close (and its exit hook) closes it
            log_prefix=f"composite member {name!r} of {outbox_name!r}: ",
            dead_letter=shape.dead_letter,
            members=self.members,
            tells_losses=False,  # the outbox's close warns of every member's losses
        )

    def take(self, batch: Sequence[SerializedEvent]) -> None:
        """Queue ``batch`` (on the intake's thread; never waits for room).  In chunks, the GIL
        handed to the application's threads between two (as the intake's own work is)."""
        buf = self.buffer
        accepted = False
        for start in range(0, len(batch), _CHUNK):
            chunk = batch[start : start + _CHUNK]
            with buf.lock:
                if buf.holdings.closed:
                    # Handed on after the member's close began (the intake was cut by the deadline).
                    buf.drop_offered_locked(Reason.DROPPED_SHUTDOWN, len(batch) - start)
                    break
                for event in chunk:
                    # Serialized already: the member's worker takes it as it is (no parsing),
                    # and every member holds the same object.
                    if buf.put_locked(event, weight(event) or 1):
                        accepted = True
                    else:
                        buf.drop_offered_locked(Reason.DROPPED_FULL)
            checkpoint()
        if accepted:
            self.sidecar.wake()

    def stats(self) -> dict[str, int]:
        """Its own accounts: ``emitted`` (handed to it) == ``delivered`` + its drops by
        reason + ``queued_events`` + ``in_flight``."""
        buf = self.buffer
        with buf.lock:
            snap = buf.snapshot_locked()
        counts = {
            "emitted": snap["emitted"],
            "delivered": snap["delivered"],
            "retried": snap["retried"],
            "queued_events": snap["queued_events"],
            "in_flight": snap["in_flight"],
        }
        for reason, n in snap["dropped"].items():
            if n:
                counts[reason] = n
        return counts


class FanOut:
    """Every member's runtime, driven by the outbox's sidecar: started with it, closed with
    its deadline, waited for, and reported."""

    def __init__(self, composite: CompositeTransport, outbox_name: str, shape: _Shape) -> None:
        self.members = {
            name: Member(name, outbox_name, transport, shape) for name, transport in composite.members.items()
        }
        self.hand_off = HandOff(self)
        self.deadline = _INF
        self._lock = threading.Lock()
        self._closing = False

    @classmethod
    def build(
        cls,
        composite: CompositeTransport,
        outbox_name: str,
        *,
        max_events: int,
        max_bytes: int,
        policy: Policy,
        settings: WorkerSettings,
        shutdown_timeout: float,
        dead_letter: DeadLetter | None,
    ) -> FanOut:
        shape = _Shape(max_events, max_bytes, policy, settings, shutdown_timeout, dead_letter)
        return cls(composite, outbox_name, shape)

    def hand(self, batch: Sequence[SerializedEvent]) -> None:
        for member in self.members.values():
            member.take(batch)

    def start(self) -> None:
        for member in self.members.values():
            member.sidecar.start_thread()

    def set_deadline(self, deadline: float) -> None:
        with self._lock:
            self.deadline = min(self.deadline, deadline)

    def close(self, deadline: float | None = None) -> None:
        """The intake has handed on all it will: every member drains until the deadline."""
        if deadline is not None:
            self.set_deadline(deadline)
        with self._lock:
            self._closing = True
            deadline = self.deadline
        if deadline == _INF:  # (the intake stopped by itself: give the members their usual time)
            deadline = time.monotonic() + max(m.sidecar.shutdown_timeout for m in self.members.values())
        for member in self.members.values():
            member.sidecar.request_close(deadline)

    def wait(self, deadline: float) -> None:
        """Block until every member has ended, or ``deadline`` plus the close grace (all of
        them at once: they drain on their own threads)."""
        for member in self.members.values():
            if member.sidecar.worker is not None:
                member.sidecar.wait(deadline)

    def _sidecars(self) -> list[Sidecar]:
        """Every member's sidecar, and a nested composite's members' too: a member's own
        worker ends before its members have drained what it handed them."""
        sidecars = []
        for member in self.members.values():
            sidecars.append(member.sidecar)
            if member.members is not None:
                sidecars.extend(member.members._sidecars())
        return sidecars

    async def wait_async(self, deadline: float) -> None:
        running = [sidecar for sidecar in self._sidecars() if sidecar.worker is not None]
        futures = [asyncio.wrap_future(sidecar.finished) for sidecar in running]
        if futures:
            budget = max(0.0, deadline - time.monotonic()) + CLOSE_GRACE
            await asyncio.wait(futures, timeout=budget)

    def when_done(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (on whichever thread ends last) once every member has ended."""
        futures = [sidecar.finished for sidecar in self._sidecars()]
        left = [len(futures)]
        guard = threading.Lock()

        def one_done(_: concurrent.futures.Future[None]) -> None:
            with guard:
                left[0] -= 1
                last = left[0] == 0
            if last:
                callback()

        for future in futures:
            future.add_done_callback(one_done)

    def finish(self) -> dict[str, dict[str, int]]:
        """Settle every member (what each still holds is lost to shutdown) and report each."""
        if not self._closing:
            self.close(time.monotonic())
        for member in self.members.values():
            member.sidecar.finish()
        return self.stats()

    def stats(self) -> dict[str, dict[str, int]]:
        """Each member's accounts by its name; a nested composite's members follow it, named
        ``inner.member`` (the nested member's own accounts are its hand-off to them)."""
        stats = {}
        for name, member in self.members.items():
            stats[name] = member.stats()
            if member.members is not None:
                stats.update((f"{name}.{inner}", counts) for inner, counts in member.members.stats().items())
        return stats

    def flush_targets(self) -> list[tuple[Buffer, int]]:
        """Ask every member to send now what it holds; the (buffer, last sequence) pairs to
        wait for."""
        targets = []
        for member in self.members.values():
            buf = member.buffer
            with buf.lock:
                target = buf.holdings.next_seq - 1
                if buf.holdings.lowest_unsettled_locked() <= target:
                    buf.ask_flush_locked(target)
                    targets.append((buf, target))
            member.sidecar.wake_now()
            if member.members is not None:
                targets.extend(member.members.flush_targets())
        return targets


class HandOff:
    """The intake worker's transport: every event to every member's buffer, DELIVERED at once
    (from here on, each member accounts for it: ``stats().members``)."""

    def __init__(self, fanout: FanOut) -> None:
        self.fanout = fanout

    def __repr__(self) -> str:
        return f"HandOff({', '.join(self.fanout.members)})"

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        self.fanout.hand(batch)
        return [DELIVERED] * len(batch)

    async def aclose(self) -> None:
        self.fanout.close()
