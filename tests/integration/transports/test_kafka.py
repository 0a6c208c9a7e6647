"""The Kafka transport against a real Kafka-protocol broker on loopback (Tansu, embedded)."""

import asyncio
import logging
import time
import uuid
from typing import Any

import pytest

from outbox import ConfigError, Outbox, Outcome, SerializedEvent
from outbox.tools.broker import EmbeddedBroker
from outbox.transports import KafkaTransport
from outbox.transports.kafka import producer_settings

from support.chaos import Pulse, running_time
from support.helpers import TimedEmitter, run_event, wait_until
from support.kafka_helpers import create_topic, read_topic

FAST = {"backoff_base": 0.05, "backoff_cap": 0.5, "linger": 0.01, "close_at_exit": False}


def test_events_arrive_keyed_and_in_order_per_run(kafka_bootstrap, topic):
    create_topic(kafka_bootstrap, topic, partitions=3)
    transport = KafkaTransport(topic, {"bootstrap.servers": kafka_bootstrap})
    outbox = Outbox(transport, **FAST)
    runs = {f"job-{i}": str(uuid.uuid4()) for i in range(6)}
    for state in ("START", "RUNNING", "COMPLETE"):
        for job, run in runs.items():
            outbox.emit(run_event(run_id=run, state=state, job=job))
    report = outbox.close(15)
    assert report.complete
    assert report.delivered == 18
    records = read_topic(kafka_bootstrap, topic, 18)
    assert len(records) == 18
    for job, run in runs.items():
        mine = [r for r in records if r["event"]["run"]["runId"] == run]
        assert {r["key"] for r in mine} == {f"run:tests/{job}"}
        assert len({r["partition"] for r in mine}) == 1  # one key, one partition
        mine.sort(key=lambda r: r["offset"])
        assert [r["event"]["eventType"] for r in mine] == ["START", "RUNNING", "COMPLETE"]


def test_fixed_message_key(kafka_bootstrap, topic):
    outbox = Outbox(
        KafkaTransport(topic, {"bootstrap.servers": kafka_bootstrap}, message_key="fixed"), **FAST
    )
    outbox.emit(run_event())
    assert outbox.close(10).delivered == 1
    assert read_topic(kafka_bootstrap, topic, 1)[0]["key"] == "fixed"


def test_too_large_record_is_rejected_not_retried(kafka_bootstrap, topic):
    transport = KafkaTransport(topic, {"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 4000})
    outbox = Outbox(transport, **FAST)
    big = run_event(n=1)
    big["run"]["facets"]["pad"] = {"x": "y" * 10_000}
    outbox.emit(run_event(n=0))
    outbox.emit(big)
    outbox.emit(run_event(n=2))
    report = outbox.close(10)
    assert report.delivered == 2
    assert report.undelivered == {"too_large": 1}
    assert outbox.stats().retried == 0
    assert sorted(r["event"]["n"] for r in read_topic(kafka_bootstrap, topic, 2)) == [0, 2]


def test_broker_down_at_start_then_started(topic):
    broker = EmbeddedBroker()
    outbox = Outbox(
        KafkaTransport(topic, {"bootstrap.servers": broker.bootstrap_servers}, start_timeout=1.0), **FAST
    )

    def emit_20() -> None:
        for i in range(20):
            assert outbox.emit(run_event(n=i))

    _, took = running_time(emit_20)  # (the time this process ran: not its stalls beside load)
    assert took < 0.5  # emit does not wait for the broker
    assert wait_until(lambda: outbox.stats().retried >= 20, 10)
    assert "cannot reach the Kafka brokers" in (outbox.stats().last_error or "")
    with broker:
        report = outbox.close(20)
        assert report.complete
        records = read_topic(broker.bootstrap_servers, topic, 20)
    assert sorted(r["event"]["n"] for r in records) == list(range(20))


def test_broker_killed_mid_stream_and_restarted(topic):
    """Tansu is memory-only: a restarted Tansu has no topics, and (seen here) it acknowledges
    records sent to a topic it does not have without keeping them. So the test recreates the
    topic right after the restart, as auto-creation or an operator would on a real broker,
    and checks what must hold whatever the broker keeps: emit never waits, nothing is lost
    silently on our side, and events emitted after the restart arrive."""
    pulse = Pulse(slow_emit=float("inf"))  # the emits are judged in the time the process ran
    try:
        with EmbeddedBroker() as broker:
            create_topic(broker.bootstrap_servers, topic, partitions=4)
            outbox = Outbox(
                KafkaTransport(
                    topic, {"bootstrap.servers": broker.bootstrap_servers, "request.timeout.ms": 2000}
                ),
                **FAST,
            )
            emit = TimedEmitter(outbox)

            for i in range(50):
                emit(i)
            assert wait_until(lambda: outbox.stats().delivered == 50, 15)
            broker.kill()
            for i in range(50, 100):  # the broker is gone
                emit(i)
                time.sleep(0.005)
            assert wait_until(lambda: outbox.stats().retried > 0, 15)
            assert outbox.stats().delivered == 50
            broker.start()  # same port, empty
            create_topic(broker.bootstrap_servers, topic, partitions=4)
            assert wait_until(lambda: outbox.stats().delivered == 100, 30)
            for i in range(100, 150):
                emit(i)
            report = outbox.close(30)
            records = read_topic(broker.bootstrap_servers, topic, 50)
        assert report.delivered + report.lost == 150  # every event delivered or counted
        assert report.complete, report
        assert {r["event"]["n"] for r in records} >= set(range(100, 150))
        worst = max((pulse.unexplained(began, ended) for began, ended in emit.slow), default=emit.worst)
    finally:
        pulse.stop()
    assert worst < 0.5  # emit never waited for the broker (a blocking client waits seconds)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "bootstrap.servers is required"),
        (
            {"bootstrap.servers": "b:9092", "partitioner": "crc16"},
            "partitioner='crc16': use one of consistent_random, consistent, murmur2_random",
        ),
        ({"bootstrap.servers": "b:9092", "acks": "most"}, "acks='most' is not valid; use all, 1 or 0"),
        ({"bootstrap.servers": "b:9092", "linger.ms": "soon"}, "linger.ms='soon' is not a whole number"),
        (
            {"bootstrap.servers": "b:9092", "compression.type": "brotli"},
            "compression.type='brotli': use one of",
        ),
        (
            {"bootstrap.servers": "b:9092", "security.protocol": "TLS"},
            "security.protocol='TLS': use one of PLAINTEXT",
        ),
        (
            {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"},
            "security.protocol=SASL_SSL needs sasl.username and sasl.password",
        ),
        (
            {"bootstrap.servers": "b:9092", "sasl.mechanism": "GSSAPI"},
            "sasl.mechanism='GSSAPI' is not supported",
        ),
        (
            {"bootstrap.servers": "b:9092", "enable.idempotence": "true", "acks": "1"},
            "enable.idempotence=true needs acks=all",
        ),
        (
            {"bootstrap.servers": "b:9092", "ssl.ca.location": "/nonexistent/ca.pem"},
            "cannot load the TLS files",
        ),
        # Servers aiokafka could only fail to reach at every send (an OverflowError, a
        # ValueError or a failed lookup there): refused here, naming the entry.
        ({"bootstrap.servers": "127.0.0.1:99999"}, r"'127.0.0.1:99999' has a port out of range \(1-65535\)"),
        ({"bootstrap.servers": "b:9092,127.0.0.1:abc"}, "'127.0.0.1:abc' has a port that is not a number"),
        (
            {"bootstrap.servers": "http://127.0.0.1:9092"},
            "'http://127.0.0.1:9092' has a scheme; use host:port",
        ),
        (
            {"bootstrap.servers": "<Event Broker address>:9092"},
            "'<Event Broker address>:9092' has no host name",
        ),
    ],
)
def test_invalid_producer_settings(config, message):
    with pytest.raises(ConfigError, match=message):
        KafkaTransport("t", config)


@pytest.mark.parametrize(
    "servers", ["b:9092", "b1:9092, b2:9093", "[::1]:9092", "broker", "b_1.example.com:9092"]
)
def test_bootstrap_servers_as_aiokafka_reads_them_are_accepted(servers):
    KafkaTransport("lineage.events_v1-x", {"bootstrap.servers": servers})


@pytest.mark.parametrize("topic", ["bad topic!", "t" * 250, "..", "événements"])
def test_a_topic_kafka_would_refuse_is_a_config_error(topic):
    with pytest.raises(ConfigError, match="is not a Kafka topic name: use at most 249 of the letters"):
        KafkaTransport(topic, {"bootstrap.servers": "b:9092"})


def test_every_librdkafka_key_is_accepted_aliases_mapped_the_rest_logged_once(caplog):
    """openlineage-python hands every key to librdkafka: the same config must not fail here.
    Aliases map to their keys; keys aiokafka has no equivalent for are named once in the log."""
    config = {
        "bootstrap.servers": "b:9092",
        "compression.codec": "gzip",  # librdkafka's alias of compression.type
        "queue.buffering.max.ms": 7,  # alias of linger.ms
        "request.required.acks": "1",  # alias of acks
        "retries": 3,  # openlineage-python's own tests use it
        "retry.backoff.ms": 250,
        "max.in.flight.requests.per.connection": 1,
        "statistics.interval.ms": 0,
    }
    settings = producer_settings(config)
    assert settings["compression_type"] == "gzip"
    assert settings["linger_ms"] == 7
    assert settings["acks"] == 1
    assert settings["retry_backoff_ms"] == 250
    with caplog.at_level("WARNING", logger="outbox"):
        KafkaTransport("t", config)
    warnings = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert warnings == [
        "Kafka settings with no effect in lineage-outbox (aiokafka has no equivalent): "
        "max.in.flight.requests.per.connection, retries, statistics.interval.ms"
    ]


def test_partitions_match_openlineage_pythons_producer_key_by_key(kafka_bootstrap, topic):
    """openlineage-python produces through confluent-kafka (librdkafka's consistent_random:
    CRC-32 of the key); the outbox puts every key in the same partition, and does as
    librdkafka does with partitioner=murmur2_random (the Java client's) or fnv1a_random."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    create_topic(kafka_bootstrap, topic, partitions=7)
    theirs: dict[str, int] = {}

    def delivered(error, message):
        assert error is None, error
        theirs[message.key().decode()] = message.partition()

    partitioners = ("consistent_random", "murmur2_random", "fnv1a_random")
    for partitioner in partitioners:
        jobs = [f"{partitioner}-{i}" for i in range(60)]
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": kafka_bootstrap, "partitioner": partitioner}
        )
        for job in jobs:
            producer.produce(topic, b"{}", key=f"run:tests/{job}".encode(), on_delivery=delivered)
        assert producer.flush(30) == 0
        outbox = Outbox(
            KafkaTransport(topic, {"bootstrap.servers": kafka_bootstrap, "partitioner": partitioner}), **FAST
        )
        for job in jobs:
            outbox.emit(run_event(job=job))
        assert outbox.close(15).delivered == len(jobs)
    records = read_topic(kafka_bootstrap, topic, 2 * len(theirs), timeout=30)
    ours = {r["key"]: r["partition"] for r in records if r["event"]}  # theirs carry {}
    assert len(theirs) == len(ours) == 3 * 60
    for partitioner in partitioners:
        keys = [key for key in theirs if key.startswith(f"run:tests/{partitioner}-")]
        assert [ours[key] for key in keys] == [theirs[key] for key in keys], partitioner
        assert len({theirs[key] for key in keys}) > 3  # the keys spread over the partitions


def test_producer_settings_mapping():
    settings = producer_settings(
        {
            "bootstrap.servers": "b1:9092, b2:9092",
            "acks": "-1",
            "compression.type": "gzip",
            "linger.ms": 5,
            "batch.size": "65536",
            "message.max.bytes": 2_000_000,
            "client.id": "lineagefn",
            "request.timeout.ms": 10_000,
            "security.protocol": "sasl_plaintext",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "user",
            "sasl.password": "hunter2",
            "enable.idempotence": "true",
        }
    )
    assert settings == {
        "bootstrap_servers": ["b1:9092", "b2:9092"],
        "acks": "all",
        "compression_type": "gzip",
        "linger_ms": 5,
        "max_batch_size": 65536,
        "max_request_size": 2_000_000,
        "client_id": "lineagefn",
        "request_timeout_ms": 10_000,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "user",
        "sasl_plain_password": "hunter2",
        "enable_idempotence": True,
    }
    assert producer_settings({"bootstrap.servers": "b:9092"})["acks"] == "all"  # the default


def test_from_environment_like_openlineage_python(monkeypatch, tmp_path, caplog):
    monkeypatch.chdir(tmp_path)
    env = {
        "OPENLINEAGE__TRANSPORT__TYPE": "kafka",
        "OPENLINEAGE__TRANSPORT__TOPIC": "lineage-events",
        "OPENLINEAGE__TRANSPORT__CONFIG": '{"bootstrap.servers": "broker:9092", "acks": "all", '
        '"sasl.username": "u", "sasl.password": "hunter2", "security.protocol": "SASL_PLAINTEXT", '
        '"sasl.mechanism": "PLAIN"}',
        "OPENLINEAGE__TRANSPORT__FLUSH": "true",
        "OPENLINEAGE__TRANSPORT__MESSAGE_KEY": "k1",
    }
    outbox = Outbox.from_env(env, close_at_exit=False)
    transport = outbox.transport
    assert isinstance(transport, KafkaTransport)
    assert transport.topic == "lineage-events"
    assert transport.message_key == b"k1"
    assert "hunter2" not in repr(transport)
    assert "hunter2" not in repr(outbox)
    outbox.close(0)
    # A key neither aiokafka nor the outbox knows: a warning naming the closest one, not an error.
    with caplog.at_level("WARNING", logger="outbox"):
        typo = Outbox.from_env(
            {**env, "OPENLINEAGE__TRANSPORT__CONFIG": '{"bootstrap.servers": "b:1", "batch.sizes": 1}'},
            close_at_exit=False,
        )
    typo.close(0)
    assert "batch.sizes (did you mean batch.size?)" in caplog.text
    with caplog.at_level("WARNING", logger="outbox"):
        Outbox.from_env({**env, "OPENLINEAGE__TRANSPORT__PARTITION": "1"}, close_at_exit=False).close(0)
    assert (
        "OPENLINEAGE__TRANSPORT__PARTITION: 'partition' is not a Kafka transport setting (ignored)"
        in caplog.text
    )


def test_a_down_broker_is_logged_at_a_bounded_rate(caplog, topic):
    import logging

    broker = EmbeddedBroker()  # never started: connection refused
    with caplog.at_level(logging.DEBUG):
        outbox = Outbox(
            KafkaTransport(topic, {"bootstrap.servers": broker.bootstrap_servers}, start_timeout=0.2),
            backoff_base=0.01,
            backoff_cap=0.02,
            linger=0,
            log_interval=60,
            close_at_exit=False,
        )
        outbox.emit(run_event())
        assert wait_until(lambda: outbox.stats().retried >= 30, 20)
        outbox.close(0.1)
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
    # 30+ failed attempts, each with several aiokafka errors: a handful of lines in all.
    assert len(noisy) <= 12, [f"{r.name}: {r.getMessage()}" for r in noisy]


def test_the_embedded_broker_takes_its_log_folder_with_it_and_a_failed_start_quotes_the_log():
    import gc
    import os
    import sys

    from outbox.tools.broker import start_server

    broker = EmbeddedBroker().start()
    folder = os.path.dirname(broker.log_path)
    broker.stop()
    assert os.path.isdir(folder)  # kept while the broker may start again
    del broker
    gc.collect()
    assert not os.path.exists(folder)  # (each test run once left hundreds behind)

    log = folder + ".log"
    try:
        with pytest.raises(RuntimeError, match=r"(?s)exited at start; see .*\n  the reason it gave"):
            start_server([sys.executable, "-c", "print('the reason it gave')"], 1, log, 10, "a server")
    finally:
        os.unlink(log)


def test_lanes_that_send_at_once_at_start_up_share_one_producer(kafka_bootstrap, topic):
    # Every lane that found no producer made one of its own; all but the last were left
    # connected, never stopped ("Unclosed AIOKafkaProducer" when collected).  A slow bootstrap
    # (1 s before each chunk) keeps the first lane's start going while a second lane arrives.
    import gc
    import warnings

    from aiokafka import AIOKafkaProducer

    from outbox.tools.faultproxy import FaultProxy

    host, port = kafka_bootstrap.rsplit(":", 1)
    with warnings.catch_warnings(record=True) as caught, FaultProxy(host, int(port), latency=1.0) as slow:
        warnings.simplefilter("always", ResourceWarning)
        transport = KafkaTransport(topic, {"bootstrap.servers": f"127.0.0.1:{slow.port}"})
        box = Outbox(transport, linger=0, close_at_exit=False)
        box.emit(run_event(run_id=str(uuid.uuid4()), n=0))
        assert wait_until(lambda: box.stats().in_flight == 1, 10), box.stats()  # the first lane
        for n in range(1, 64):  # a run each: the others' lanes
            box.emit(run_event(run_id=str(uuid.uuid4()), n=n))
        assert wait_until(lambda: box.stats().in_flight == 64, 10), box.stats()
        report = box.close(30)
        box = transport = None  # (collected: an unclosed producer warns then)
        gc.collect()
    assert report.delivered == 64, report
    unclosed = [str(w.message) for w in caught if "Unclosed AIOKafkaProducer" in str(w.message)]
    assert unclosed == []
    assert [o for o in gc.get_objects() if isinstance(o, AIOKafkaProducer) and not o._closed] == []


def test_a_transport_used_from_a_second_loop_starts_its_producer_there(kafka_bootstrap, topic):
    # The start lock binds to the loop it is first contended in.  A transport given to a second
    # outbox (another sidecar, another loop) after the first closed must not meet the old
    # lock ("bound to a different event loop") when its sends wait on a start.
    from outbox.tools.faultproxy import FaultProxy

    async def sends_at_once(transport: KafkaTransport, n: int) -> list[list[Outcome]]:
        deadline = time.monotonic() + 30
        batches = [[SerializedEvent(b'{"n": %d}' % i, None, None)] for i in range(n)]
        try:
            return [list(o) for o in await asyncio.gather(*(transport.send(b, deadline) for b in batches))]
        finally:
            await transport.aclose()

    host, port = kafka_bootstrap.rsplit(":", 1)
    with FaultProxy(host, int(port), latency=0.2) as slow:
        transport = KafkaTransport(topic, {"bootstrap.servers": f"127.0.0.1:{slow.port}"})
        first = asyncio.run(sends_at_once(transport, 4))
        second = asyncio.run(sends_at_once(transport, 4))
    kinds = [[o.kind.value for o in outcomes] for outcomes in first + second]
    assert kinds == [["delivered"]] * 8, (first, second)


@pytest.mark.parametrize("ended_by", ["deadline", "cancel"])
def test_a_batch_that_fails_after_its_round_ended_is_never_logged_raw(topic, caplog, ended_by):
    # The round ends (its deadline, or the worker cancels it) with the batch unacknowledged;
    # the batch then fails (request.timeout.ms, against a broker that went silent).  Before,
    # asyncio logged that failure as "Future exception was never retrieved": no one read the
    # batch's future.
    import gc

    from outbox.tools.faultproxy import FaultProxy, free_port

    async def scenario(proxy: FaultProxy) -> tuple[str, str]:
        second: Any
        transport = KafkaTransport(
            topic, {"bootstrap.servers": f"127.0.0.1:{proxy.port}", "request.timeout.ms": 1500}
        )
        try:
            event = SerializedEvent(b'{"n": 0}', None, None)
            first = await transport.send([event], time.monotonic() + 30)
            proxy.mode = "blackhole"
            proxy.cut()
            if ended_by == "deadline":
                second = await transport.send([event], time.monotonic() + 0.5)
            else:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(transport.send([event], time.monotonic() + 30), 0.5)
                second = [Outcome.retry("timeout", "cancelled")]
        finally:
            # The producer's stop waits for its batches: the one left has failed once it returns.
            await transport.aclose()
        gc.collect()
        return first[0].kind.value, second[0].kind.value

    caplog.set_level(logging.DEBUG, logger="asyncio")
    port = free_port()
    # The broker advertises the proxy: every request, not only the bootstrap, goes through it.
    with FaultProxy("127.0.0.1", port) as proxy, EmbeddedBroker(port, advertised_port=proxy.port):
        create_topic(f"127.0.0.1:{proxy.port}", topic, partitions=1)
        kinds = asyncio.run(scenario(proxy))
    gc.collect()
    assert kinds == ("delivered", "retry")
    unread = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert unread == []
