"""OpenTelemetry metrics through ``opentelemetry-api``: no-ops unless the application
installs an SDK.

Nothing here runs on the ``emit`` path.  The counters and gauges are observable:
when the SDK collects, one callback per instrument reads the counters of every
live outbox (each observation carries ``outbox.name``).  Only the batch-latency
histogram is recorded, by the worker, once per batch.  The instruments are made
once per process because an SDK keeps the first instrument of a name and ignores
later ones.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics

if TYPE_CHECKING:  # types only: the buffer and the spill sit above observability
    from .._buffer._buffer import Buffer
    from .._spill import Spill

__all__ = ["Metrics"]

_VERSION = "0.1.0"
_Reader = Callable[["Buffer"], Iterable[tuple[int, dict[str, str]]]]

_registry: weakref.WeakKeyDictionary[Buffer, str] = weakref.WeakKeyDictionary()
# The outboxes with a spill directory: (its spill, the outbox's name), by buffer.
_spills: weakref.WeakKeyDictionary[Buffer, tuple[Spill, str]] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()
_histogram: metrics.Histogram | None = None


def _observe(read: _Reader) -> Callable[[metrics.CallbackOptions], Iterable[metrics.Observation]]:
    def callback(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        with _registry_lock:
            live = list(_registry.items())
        observations = []
        for buf, name in live:
            with buf.lock:
                values = list(read(buf))
            for value, extra in values:
                observations.append(metrics.Observation(value, {"outbox.name": name, **extra}))
        return observations

    return callback


def _observe_spill(key: str) -> Callable[[metrics.CallbackOptions], Iterable[metrics.Observation]]:
    """One figure of every live spill's ``stats()`` (read without the buffer's lock)."""

    def callback(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        with _registry_lock:
            live = list(_spills.values())
        return [metrics.Observation(spill.stats()[key], {"outbox.name": name}) for spill, name in live]

    return callback


def _spill_instruments(meter: metrics.Meter) -> None:
    gauges = [
        ("outbox.spill.events", "spilled_events", "{event}", "Events on disk not yet delivered or dropped"),
        ("outbox.spill.bytes", "spilled_bytes", "By", "Bytes of this outbox's spill segments"),
        ("outbox.spill.segments", "segments", "{segment}", "This outbox's spill segments"),
        ("outbox.spill.oldest_age", "oldest_age", "s", "Age of the oldest undelivered spilled event"),
    ]
    for name, key, unit, description in gauges:
        meter.create_observable_gauge(name, [_observe_spill(key)], unit, description)
    meter.create_observable_counter(
        "outbox.spill.recovered",
        [_observe_spill("recovered")],
        "{event}",
        "Events of dead processes adopted from the spill directory",
    )

    def not_spilled(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        with _registry_lock:
            live = list(_spills.values())
        return [
            metrics.Observation(n, {"outbox.name": name, "reason": reason})
            for spill, name in live
            for reason, n in dict(spill.disk.not_spilled).items()
        ]

    meter.create_observable_counter(
        "outbox.spill.not_spilled",
        [not_spilled],
        "{event}",
        "Accepted events not written to the spill, by reason",
    )


def _instruments() -> metrics.Histogram:
    global _histogram
    if _histogram is not None:
        return _histogram
    meter = metrics.get_meter("lineage-outbox", _VERSION)
    counters: list[tuple[str, _Reader, str]] = [
        ("outbox.events.accepted", lambda b: [(b.holdings.accepted, {})], "Events accepted by emit"),
        ("outbox.events.delivered", lambda b: [(b.delivered, {})], "Events the backend acknowledged"),
        ("outbox.events.retried", lambda b: [(b.retried, {})], "Event deliveries retried"),
        (
            "outbox.events.dropped",
            lambda b: [(n, {"reason": r}) for r, n in b.dropped.items()],
            "Events lost, by reason",
        ),
    ]
    for name, read, description in counters:
        meter.create_observable_counter(name, [_observe(read)], "{event}", description)
    meter.create_observable_gauge(
        "outbox.queue.events",
        [_observe(lambda b: [(len(b.holdings.queue) + b.holdings.in_flight, {})])],
        "{event}",
        "Events held (queued and in flight)",
    )
    meter.create_observable_gauge(
        "outbox.queue.bytes",
        [_observe(lambda b: [(b.holdings.queued_bytes + b.holdings.in_flight_bytes, {})])],
        "By",
        "Bytes held (queued and in flight)",
    )
    _spill_instruments(meter)
    _histogram = meter.create_histogram(
        "outbox.batch.duration", "s", "Time to send one batch through the transport"
    )
    return _histogram


def forget_after_fork() -> None:
    """In a forked child: the parent's buffers are not the child's to report, and the lock may
    have been held by one of the parent's threads at the fork."""
    global _registry_lock
    _registry_lock = threading.Lock()
    _registry.clear()
    _spills.clear()


class Metrics:
    """One outbox's link to the process-wide instruments."""

    def __init__(self, name: str, buffer: Buffer, spill: Spill | None = None) -> None:
        with _registry_lock:
            self._histogram = _instruments()
            _registry[buffer] = name
            if spill is not None:
                _spills[buffer] = (spill, name)
        self._attrs: dict[str, Any] = {"outbox.name": name}

    def batch_sent(self, elapsed: float, delivered: int, retried: int, rejected: int) -> None:
        outcome = "retry" if retried else ("rejected" if rejected and not delivered else "delivered")
        self._histogram.record(elapsed, {**self._attrs, "outcome": outcome})
