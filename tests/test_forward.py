"""outbox forward: Kafka (embedded broker) to HTTP (outbox sink), at least once."""

import asyncio
import re
import signal
import subprocess
import sys
import threading
import time

import orjson

from outbox.tools.forward import Forwarder
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport

from helpers import run_event, wait_until
from kafka_helpers import committed_offsets, create_topic, produce, read_topic


def run_forwarder(forwarder: Forwarder, until, timeout: float = 30.0):
    """Run the forwarder on its own loop in a thread until ``until()`` holds, then stop it."""
    loop = asyncio.new_event_loop()
    result = {}

    def main():
        result["stats"] = loop.run_until_complete(forwarder.run())

    thread = threading.Thread(target=main)
    thread.start()
    ok = wait_until(until, timeout)
    loop.call_soon_threadsafe(forwarder.stop)
    thread.join(30)
    loop.close()
    assert ok, forwarder.stats
    return result["stats"]


def test_forwards_every_event_and_counts_the_rest(kafka_bootstrap, topic, session_timeout):
    create_topic(kafka_bootstrap, topic, partitions=3)
    events = [orjson.dumps(run_event(n=i)) for i in range(100)]
    garbage = [b"not json", b"[1, 2]", orjson.dumps({"hello": "world"})]
    produce(kafka_bootstrap, topic, events[:50] + garbage + events[50:])
    with Sink() as sink:
        forwarder = Forwarder(
            {"bootstrap.servers": kafka_bootstrap},
            topic,
            HttpTransport(sink.url),
            group_id="g-exact",
            session_timeout=session_timeout,
            progress_interval=0,
        )
        stats = run_forwarder(forwarder, lambda: forwarder.stats.consumed >= 103)
        assert sorted(e["n"] for e in sink.events) == list(range(100))
    assert stats.consumed == 103
    assert stats.delivered == 100
    assert stats.skipped == 3
    assert stats.rejected == 0
    assert committed_offsets(kafka_bootstrap, topic, "g-exact") == 103


def test_rejected_events_are_counted_and_committed(kafka_bootstrap, topic, session_timeout):
    bad = run_event(n=1)
    bad["run"]["runId"] = "not-a-uuid"
    produce(kafka_bootstrap, topic, [orjson.dumps(run_event(n=0)), orjson.dumps(bad)])
    with Sink() as sink:
        forwarder = Forwarder(
            {"bootstrap.servers": kafka_bootstrap},
            topic,
            HttpTransport(sink.url),
            group_id="g-rej",
            session_timeout=session_timeout,
            progress_interval=0,
        )
        stats = run_forwarder(forwarder, lambda: forwarder.stats.consumed >= 2)
    assert (stats.delivered, stats.rejected) == (1, 1)
    assert committed_offsets(kafka_bootstrap, topic, "g-rej") == 2


def test_dead_letter_topic(kafka_bootstrap, topic, session_timeout):
    dead = f"{topic}-dead"
    produce(kafka_bootstrap, topic, [b"garbage", orjson.dumps(run_event(n=0))], keys=[b"k1", b"k2"])
    with Sink() as sink:
        forwarder = Forwarder(
            {"bootstrap.servers": kafka_bootstrap},
            topic,
            HttpTransport(sink.url),
            group_id="g-dlq",
            session_timeout=session_timeout,
            dead_letter_topic=dead,
            progress_interval=0,
        )
        stats = run_forwarder(forwarder, lambda: forwarder.stats.consumed >= 2)
    assert stats.dead_lettered == 1
    assert stats.delivered == 1
    from aiokafka import AIOKafkaConsumer

    async def read_dead():
        consumer = AIOKafkaConsumer(dead, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            batch = await consumer.getmany(timeout_ms=5000)
            return [m for ms in batch.values() for m in ms]
        finally:
            await consumer.stop()

    records = asyncio.run(read_dead())
    assert [(m.key, m.value) for m in records] == [(b"k1", b"garbage")]
    assert dict(records[0].headers)["outbox-error"].startswith(b"pre-serialized event is not valid JSON")


def test_a_down_backend_holds_the_offsets_until_delivered(kafka_bootstrap, topic, session_timeout):
    produce(kafka_bootstrap, topic, [orjson.dumps(run_event(n=i)) for i in range(10)])
    with Sink() as sink:
        sink.behaviour.fail_status = 503
        forwarder = Forwarder(
            {"bootstrap.servers": kafka_bootstrap},
            topic,
            HttpTransport(sink.url),
            group_id="g-down",
            session_timeout=session_timeout,
            progress_interval=0,
            backoff_base=0.05,
            backoff_cap=0.1,
        )
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=lambda: loop.run_until_complete(forwarder.run()))
        thread.start()
        assert wait_until(lambda: len(sink.requests) >= 3, 15)
        assert committed_offsets(kafka_bootstrap, topic, "g-down") == 0
        sink.behaviour.fail_status = None
        assert wait_until(lambda: forwarder.stats.delivered == 10, 15)
        loop.call_soon_threadsafe(forwarder.stop)
        thread.join(30)
        loop.close()
    assert committed_offsets(kafka_bootstrap, topic, "g-down") == 10


def start_cli(kafka_bootstrap, topic, url, group, session_timeout):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "outbox.tools.cli",
            "forward",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--topic",
            topic,
            "--group-id",
            group,
            "--url",
            url,
            "--mode",
            "batch",
            "--progress-interval",
            "0.2",
            "--session-timeout",
            str(session_timeout),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_killed_mid_way_and_restarted_delivers_every_event_at_least_once(
    kafka_bootstrap, topic, session_timeout
):
    create_topic(kafka_bootstrap, topic, partitions=1)
    produce(kafka_bootstrap, topic, [orjson.dumps(run_event(n=i)) for i in range(3000)])
    with Sink() as sink:
        sink.behaviour.delay = 0.2  # slow enough to kill it mid-way
        first = start_cli(kafka_bootstrap, topic, sink.url, "g-kill", session_timeout)
        assert wait_until(lambda: len(sink.events) >= 1, 20)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        delivered_before = len(sink.events)
        assert delivered_before < 3000
        sink.behaviour.delay = 0
        second = start_cli(kafka_bootstrap, topic, sink.url, "g-kill", session_timeout)
        try:
            assert sink.wait_for(3000, 60)
            assert wait_until(lambda: {e["n"] for e in sink.events} == set(range(3000)), 60)
        finally:
            second.send_signal(signal.SIGTERM)
            out, _ = second.communicate(timeout=30)
        assert second.returncode == 0
    assert re.search(r"consumed \d+, delivered \d+, rejected 0, skipped 0, dead_lettered 0, lag \d+", out)
    assert committed_offsets(kafka_bootstrap, topic, "g-kill") == 3000


def test_sigterm_drains_and_commits(kafka_bootstrap, topic, session_timeout):
    produce(kafka_bootstrap, topic, [orjson.dumps(run_event(n=i)) for i in range(20)])
    with Sink() as sink:
        process = start_cli(kafka_bootstrap, topic, sink.url, "g-term", session_timeout)
        assert sink.wait_for(20, 30)
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert "delivered 20" in out.splitlines()[-1]
    assert committed_offsets(kafka_bootstrap, topic, "g-term") == 20
    assert len(read_topic(kafka_bootstrap, topic, 20)) == 20
