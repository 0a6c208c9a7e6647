"""End to end against Apache Kafka 4.x in KRaft mode, started by the harness."""

import time
import uuid

import orjson
import pytest

from outbox import Outbox
from outbox.forward import Forwarder
from outbox.sink import Sink
from outbox.transports import HttpTransport, KafkaTransport

from helpers import TimedEmitter, run_event, wait_until
from kafka_helpers import committed_offsets, create_topic, produce, read_topic

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

    with Sink() as sink:
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
