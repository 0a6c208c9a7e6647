"""OpenTelemetry metrics through an installed SDK, and logging at a bounded rate."""

import logging
import time

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from outbox import Outbox, Outcome
from outbox._observability._log import RateLimitedLog
from outbox._observability._metrics import Metrics
from outbox.transports import DELIVERED

from support.helpers import FailingTransport, ScriptedTransport, run_event, wait_until

_reader = InMemoryMetricReader()


@pytest.fixture(scope="module")
def reader():
    # The global provider can be set once per process; this module owns it.
    metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
    return _reader


def collect(reader) -> dict[tuple[str, tuple], float]:
    points = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    attrs = tuple(sorted(point.attributes.items()))
                    value = getattr(point, "value", None)
                    if value is None:
                        value = point.count  # histogram
                    points[(metric.name, attrs)] = value
    return points


def test_metrics_report_counters_gauges_and_batch_latency(reader):
    transport = ScriptedTransport(
        lambda e: Outcome.rejected("rejected_by_backend", "422") if e["n"] == 0 else DELIVERED
    )
    outbox = Outbox(transport, name="metrics-test", linger=0.01, close_at_exit=False)
    for i in range(5):
        outbox.emit(run_event(n=i))
    assert outbox.flush(2)
    points = collect(reader)
    name = ("outbox.name", "metrics-test")
    assert points[("outbox.events.accepted", (name,))] == 5
    assert points[("outbox.events.delivered", (name,))] == 4
    assert points[("outbox.events.dropped", (name, ("reason", "rejected_by_backend")))] == 1
    assert points[("outbox.queue.events", (name,))] == 0
    assert points[("outbox.batch.duration", (name, ("outcome", "delivered")))] >= 1
    outbox.close(1)


def test_a_flush_that_returns_finds_its_batches_in_the_metrics(reader, monkeypatch):
    # The sidecar held up between settling the buffer and recording the batch (as a loaded
    # machine can hold it up): flush() must not return before the batch's metric is recorded.
    recorded = Metrics.batch_sent

    def late(self, *args):  # type: ignore[no-untyped-def]
        time.sleep(0.3)
        recorded(self, *args)

    monkeypatch.setattr(Metrics, "batch_sent", late)
    outbox = Outbox(ScriptedTransport(lambda e: DELIVERED), name="metrics-flush", close_at_exit=False)
    for i in range(3):
        outbox.emit(run_event(n=i))
    assert outbox.flush(5)
    batches = collect(reader).get(
        ("outbox.batch.duration", (("outbox.name", "metrics-flush"), ("outcome", "delivered")))
    )
    assert batches is not None
    assert batches >= 1
    outbox.close(1)


def test_metrics_report_the_spill(reader, tmp_path):
    outbox = Outbox(
        FailingTransport(),
        name="metrics-spill",
        spill_dir=str(tmp_path / "spill"),
        max_spill_bytes=4096,
        shutdown_timeout=0.1,
        close_at_exit=False,
    )
    for i in range(50):
        outbox.emit(run_event(n=i))
    # The disk full, with events on it (the spill's figures are a snapshot a tick old: wait
    # for both rather than read one tick early on a loaded machine).
    assert wait_until(
        lambda: outbox.stats().spill["not_spilled_full"] > 0 and outbox.stats().spill["spilled_events"] > 0
    )
    points = collect(reader)
    name = ("outbox.name", "metrics-spill")
    spill = outbox.stats().spill
    assert points[("outbox.spill.events", (name,))] > 0
    assert 0 < points[("outbox.spill.bytes", (name,))] <= 4096
    assert points[("outbox.spill.segments", (name,))] >= 1
    assert points[("outbox.spill.recovered", (name,))] == 0
    assert points[("outbox.spill.oldest_age", (name,))] >= 0
    assert (
        0
        < points[("outbox.spill.not_spilled", (name, ("reason", "spill_full")))]
        <= spill["not_spilled_full"]
    )
    outbox.close(0.1)


def test_rate_limited_log_holds_back_repeats(caplog):
    log = RateLimitedLog(interval=0.2)
    with caplog.at_level(logging.WARNING, logger="outbox"):
        results = [log.warning("k", "backend down: %s", "refused") for _ in range(50)]
        time.sleep(0.25)
        log.warning("k", "backend down: %s", "refused")
    assert results.count(True) == 1
    # (Only this log's lines: another test's outbox, still ending in this process, may warn too.)
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("backend down")]
    assert messages == [
        "backend down: refused",
        "backend down: refused (49 similar messages held back in the last 0.2 s)",
    ]


def test_a_dead_backend_gives_a_bounded_number_of_warnings(caplog):
    transport = FailingTransport()
    with caplog.at_level(logging.WARNING, logger="outbox"):
        outbox = Outbox(
            transport, backoff_base=0.001, backoff_cap=0.002, log_interval=60, linger=0, close_at_exit=False
        )
        for i in range(200):
            outbox.emit(run_event(n=i))
        assert wait_until(lambda: transport.calls >= 50, 10)
        outbox.close(0.1)
    # One line per kind of trouble (retry, circuit, losses since the last report, what the
    # worker held at close, the close's own account), not one per attempt or event.
    # (Only the outbox's own lines: asyncio may log, here, about another test's garbage.)
    ours = [r for r in caplog.records if r.name == "outbox" or r.name.startswith("outbox.")]
    assert transport.calls >= 50
    assert len(ours) <= 5, [r.getMessage() for r in ours]
    assert any("retrying" in r.getMessage() for r in ours)
