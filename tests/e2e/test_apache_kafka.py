"""End to end against Apache Kafka 4.x in KRaft mode, started by the harness."""

import time
import uuid

import orjson
import pytest

from e2e.peers import serving
from outbox import Outbox
from outbox.tools.forward import Forwarder
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport, KafkaTransport

from support.helpers import TimedEmitter, run_event, wait_until
from support.kafka_helpers import committed_offsets, create_topic, produce, read_topic

pytestmark = pytest.mark.e2e

FAST = {"backoff_base": 0.05, "backoff_cap": 0.5, "linger": 0.01, "close_at_exit": False}


def test_acks_all_and_the_idempotent_producer(apache_kafka):
    topic = f"e2e-{uuid.uuid4().hex[:8]}"
    create_topic(apache_kafka.bootstrap_servers, topic, partitions=3)
    config = {
        "bootstrap.servers": apache_kafka.bootstrap_servers,
        "acks": "all",
        "enable.idempotence": "true",
    }
    outbox = Outbox(KafkaTransport(topic, config), **FAST)
    runs = {f"job-{i}": str(uuid.uuid4()) for i in range(5)}
    for state in ("START", "RUNNING", "COMPLETE"):
        for job, run in runs.items():
            outbox.emit(run_event(run_id=run, state=state, job=job))
    report = outbox.close(30)
    assert report.complete
    records = read_topic(apache_kafka.bootstrap_servers, topic, 15, timeout=30)
    assert len(records) == 15
    for job, run in runs.items():
        mine = sorted((r for r in records if r["event"]["run"]["runId"] == run), key=lambda r: r["offset"])
        assert {r["key"] for r in mine} == {f"run:tests/{job}"}
        assert len({r["partition"] for r in mine}) == 1
        assert [r["event"]["eventType"] for r in mine] == ["START", "RUNNING", "COMPLETE"]


def test_broker_restart_loses_nothing_acknowledged(apache_kafka):
    topic = f"e2e-restart-{uuid.uuid4().hex[:8]}"
    create_topic(apache_kafka.bootstrap_servers, topic, partitions=1)
    config = {
        "bootstrap.servers": apache_kafka.bootstrap_servers,
        "acks": "all",
        "enable.idempotence": "true",
        "request.timeout.ms": 5000,
    }
    outbox = Outbox(KafkaTransport(topic, config, start_timeout=5.0), **FAST)
    emit = TimedEmitter(outbox)

    for i in range(100):
        emit(i)
    assert wait_until(lambda: outbox.stats().delivered == 100, 30)
    apache_kafka.stop()
    for i in range(100, 200):  # the broker is down
        emit(i)
        time.sleep(0.002)
    assert outbox.stats().delivered == 100
    apache_kafka.start()  # same log dirs: what was acknowledged is still there
    for i in range(200, 300):
        emit(i)
    report = outbox.close(60)
    assert report.complete, report
    records = read_topic(apache_kafka.bootstrap_servers, topic, 300, timeout=60)
    numbers = [r["event"]["n"] for r in sorted(records, key=lambda r: r["offset"])]
    assert set(numbers) == set(range(300))  # nothing acknowledged (or emitted) is lost
    assert emit.worst < 0.5  # emit never waited for the broker


def test_forward_from_apache_kafka(apache_kafka):
    """Into outbox sink: the Marquez leg of this suite cannot run here (its jars are not
    served by the registries this machine reaches)."""
    topic = f"e2e-forward-{uuid.uuid4().hex[:8]}"
    create_topic(apache_kafka.bootstrap_servers, topic, partitions=3)
    produce(apache_kafka.bootstrap_servers, topic, [orjson.dumps(run_event(n=i)) for i in range(500)])
    import asyncio
    import threading

    with serving(Sink()) as sink:
        forwarder = Forwarder(
            {"bootstrap.servers": apache_kafka.bootstrap_servers},
            topic,
            HttpTransport(sink.url),
            group_id="e2e-forward",
            session_timeout=6.0,
            progress_interval=0,
        )
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=lambda: loop.run_until_complete(forwarder.run()))
        thread.start()
        try:
            assert wait_until(lambda: forwarder.stats.delivered == 500, 60), forwarder.stats
        finally:
            loop.call_soon_threadsafe(forwarder.stop)
            thread.join(60)
            loop.close()
        assert sorted(e["n"] for e in sink.events) == list(range(500))
    assert forwarder.stats.commits >= 1, forwarder.stats
    assert wait_until(
        lambda: committed_offsets(apache_kafka.bootstrap_servers, topic, "e2e-forward") == 500, 30
    )


def first_seen_in_order(numbers: list[int]) -> bool:
    """At least once, in order: a run's events, first occurrences, in emission order (a copy
    sent again after a timeout may follow, but nothing later may come before an earlier one)."""
    first = list(dict.fromkeys(numbers))
    return first == sorted(first)


@pytest.mark.parametrize("crash", ["killed", "stopped"])
def test_per_run_order_holds_across_a_broker_crash_and_restart(apache_kafka, crash):
    """Three long runs emitted at a steady pace while the broker crashes and comes back: each
    outbox batch spans several producer batches per partition (batch.size 4 KiB), the
    producer is not idempotent (the default), and every run's events must be in the topic,
    first occurrences in order (before: offsets 350-699 of a run were written before 0-349)."""
    topic = f"e2e-order-{uuid.uuid4().hex[:8]}"
    create_topic(apache_kafka.bootstrap_servers, topic, partitions=3)
    config = {
        "bootstrap.servers": apache_kafka.bootstrap_servers,
        "batch.size": 4096,
        "request.timeout.ms": 1000,
    }
    outbox = Outbox(KafkaTransport(topic, config, start_timeout=3.0), send_timeout=1.5, **FAST)
    runs = [str(uuid.uuid4()) for _ in range(3)]
    per_run = 1500
    worst = 0.0
    for n in range(per_run):
        if n == 500:
            apache_kafka.kill() if crash == "killed" else apache_kafka.stop()
        if n == 1000:
            apache_kafka.start()
        for index, run in enumerate(runs):
            started = time.monotonic()
            assert outbox.emit(run_event(run_id=run, n=n, job=f"order-{index}"))
            worst = max(worst, time.monotonic() - started)
        time.sleep(0.002)
    report = outbox.close(90)
    assert report.complete, report
    # Until every event is read, not a count of records: a batch sent again after a timeout
    # (the producer is not idempotent) puts copies in the topic, and a count that includes
    # them stops short of the last events (seen once in CI: a run's 1131-1499 unread).  A
    # partition is read in offset order, so each event's first copy is read before its others.
    records = read_topic(
        apache_kafka.bootstrap_servers,
        topic,
        3 * per_run,
        timeout=60,
        until=lambda got: len({(r["event"]["run"]["runId"], r["event"]["n"]) for r in got}) >= 3 * per_run,
    )
    for run in runs:
        mine = sorted(
            (r for r in records if r["event"]["run"]["runId"] == run),
            key=lambda r: (r["partition"], r["offset"]),
        )
        assert len({r["partition"] for r in mine}) == 1
        numbers = [r["event"]["n"] for r in mine]
        assert set(numbers) == set(range(per_run))
        assert first_seen_in_order(numbers), [n for i, n in enumerate(numbers) if i and n < numbers[i - 1]][
            :20
        ]
    assert worst < 0.5


def test_a_producer_batch_the_broker_finds_too_large_is_split_and_only_the_large_record_dropped(
    apache_kafka,
):
    """The broker weighs each producer batch against the topic's ``max.message.bytes``
    (4,000 here; the producer's own limit is 1 MB, so nothing is caught before sending).
    Batches of small records over the limit are split until they fit; the one record too
    large alone is counted ``too_large``; every run's events arrive, in order."""
    topic = f"e2e-large-{uuid.uuid4().hex[:8]}"
    create_topic(apache_kafka.bootstrap_servers, topic, partitions=1, configs={"max.message.bytes": "4000"})
    config = {"bootstrap.servers": apache_kafka.bootstrap_servers, "linger.ms": 50}
    outbox = Outbox(KafkaTransport(topic, config), **FAST)
    runs = [str(uuid.uuid4()) for _ in range(4)]
    for n in range(15):
        for index, run in enumerate(runs):
            outbox.emit(run_event(run_id=run, n=n, job=f"large-{index}"))
        if n == 7:
            large = run_event(job="too-large")
            large["run"]["facets"] = {"blob": {"text": "x" * 6000}}
            outbox.emit(large)
    report = outbox.close(60)
    assert report.undelivered == {"too_large": 1}, report
    assert outbox.stats().delivered == 60
    records = read_topic(apache_kafka.bootstrap_servers, topic, 60, timeout=30)
    assert len(records) == 60
    for run in runs:
        mine = sorted((r for r in records if r["event"]["run"]["runId"] == run), key=lambda r: r["offset"])
        assert [r["event"]["n"] for r in mine] == list(range(15))
