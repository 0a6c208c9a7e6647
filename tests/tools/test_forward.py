"""outbox forward: Kafka (embedded broker) to HTTP (outbox sink), at least once."""

import asyncio
import contextlib
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import orjson
import pytest

from outbox.tools.broker import EmbeddedBroker
from outbox.tools.forward import Forwarder
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport

from support.helpers import refused_port, run_event, wait_until
from support.kafka_helpers import committed_offsets, create_topic, produce, read_topic


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


def start_cli(kafka_bootstrap, topic, url, group, session_timeout, *more, stderr=subprocess.DEVNULL):
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
            *more,
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
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


# -- a backend down for long, a stop while it is down, brokers that are not there --------------


def test_a_backend_down_for_over_a_thousand_attempts_is_retried_until_it_comes_back(
    kafka_bootstrap, topic, session_timeout
):
    # Hours of failure in attempts rather than hours: the old formula overflowed at 1,025.
    produce(kafka_bootstrap, topic, [orjson.dumps(run_event(n=i)) for i in range(5)])
    with Sink() as sink:
        sink.behaviour.fail_status = 503
        forwarder = Forwarder(
            {"bootstrap.servers": kafka_bootstrap},
            topic,
            HttpTransport(sink.url, mode="batch"),
            group_id="g-long",
            session_timeout=session_timeout,
            progress_interval=0,
            backoff_base=1e-4,
            backoff_cap=1e-4,
        )
        loop = asyncio.new_event_loop()
        failure = []

        def main():
            try:
                loop.run_until_complete(forwarder.run())
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=main)
        thread.start()
        try:
            assert wait_until(lambda: len(sink.requests) >= 1100 or not thread.is_alive(), 120)
            assert not failure
            assert thread.is_alive()
            sink.behaviour.fail_status = None
            assert wait_until(lambda: forwarder.stats.delivered == 5, 30)
        finally:
            loop.call_soon_threadsafe(forwarder.stop)
            thread.join(30)
            loop.close()
    assert not failure
    assert committed_offsets(kafka_bootstrap, topic, "g-long") == 5


def test_progress_lines_go_on_during_an_outage_with_the_true_lag(kafka_bootstrap, topic, session_timeout):
    create_topic(kafka_bootstrap, topic, partitions=2)
    produce(kafka_bootstrap, topic, [orjson.dumps(run_event(n=i)) for i in range(30)])
    lines: list[str] = []
    with Sink() as sink:
        sink.behaviour.fail_status = 503
        forwarder = Forwarder(
            {"bootstrap.servers": kafka_bootstrap},
            topic,
            HttpTransport(sink.url, mode="batch"),
            group_id="g-lag",
            session_timeout=session_timeout,
            progress_interval=0.2,
            backoff_base=0.05,
            backoff_cap=0.1,
            print_line=lines.append,
        )
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=lambda: loop.run_until_complete(forwarder.run()))
        thread.start()
        try:
            # Never committed, nothing delivered: the lag is every record, not 0.
            def outage():
                return [line for line in lines if "lag 30; the backend failing for" in line]

            assert wait_until(lambda: len(outage()) >= 3, 30), lines[-3:]
            assert "503" in outage()[-1]
            assert "delivered 0" in outage()[-1]
            assert forwarder.stats.delivered == 0
            sink.behaviour.fail_status = None
            assert wait_until(lambda: forwarder.stats.delivered == 30, 30)
            assert wait_until(lambda: any(line.endswith("lag 0") for line in lines), 30), lines[-3:]
        finally:
            loop.call_soon_threadsafe(forwarder.stop)
            thread.join(30)
            loop.close()


def test_sigterm_with_the_backend_down_paces_its_last_attempts_and_commits_nothing(
    kafka_bootstrap, topic, session_timeout
):
    produce(kafka_bootstrap, topic, [orjson.dumps(run_event(n=i)) for i in range(10)])
    with Sink() as sink:
        sink.behaviour.fail_status = 503
        process = start_cli(
            kafka_bootstrap,
            topic,
            sink.url,
            "g-pace",
            session_timeout,
            "--drain-timeout",
            "2",
            stderr=subprocess.PIPE,
        )
        assert wait_until(lambda: len(sink.requests) >= 3, 30)
        before = len(sink.requests)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
        during = len(sink.requests) - before
    assert process.returncode == 0, err
    assert "Traceback" not in err
    # One at once, then at least 0.1 s apart for 2 s (it sent about 1,020 before).
    assert 2 <= during <= 2 / 0.1 + 3, during
    assert "delivered 0" in out.splitlines()[-1]
    assert committed_offsets(kafka_bootstrap, topic, "g-pace") == 0  # at least once: sent again


def test_a_stop_while_a_request_hangs_in_a_black_hole_keeps_the_drain_timeout(
    kafka_bootstrap, topic, session_timeout
):
    # The backend accepts connections and never answers; the request's own timeout is 30 s.
    # The drain is 1 s: the request in flight is cut off there (it ran its 30 s before).
    produce(kafka_bootstrap, topic, [orjson.dumps(run_event(n=i)) for i in range(5)])
    hole = socket.create_server(("127.0.0.1", 0), backlog=16)
    try:
        forwarder = Forwarder(
            {"bootstrap.servers": kafka_bootstrap},
            topic,
            HttpTransport(f"http://127.0.0.1:{hole.getsockname()[1]}", mode="batch", timeout=30),
            group_id="g-hole",
            session_timeout=session_timeout,
            progress_interval=0,
            drain_timeout=1.0,
        )
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=lambda: loop.run_until_complete(forwarder.run()))
        thread.start()
        try:
            assert select.select([hole], [], [], 30)[0], "no request came"  # in flight now
            stopped = time.monotonic()
            loop.call_soon_threadsafe(forwarder.stop)
            thread.join(40)
            took = time.monotonic() - stopped
        finally:
            loop.call_soon_threadsafe(forwarder.stop)
            thread.join(40)
            loop.close()
    finally:
        hole.close()
    assert not thread.is_alive()
    assert took < 1.0 + 5.0, took  # the drain plus the consumer's own stop, not 30 s
    assert forwarder.stats.delivered == 0
    assert committed_offsets(kafka_bootstrap, topic, "g-hole") == 0  # sent again: at least once


def test_sigterm_uses_the_drain_time_a_backend_that_comes_back_gets_the_events(
    kafka_bootstrap, topic, session_timeout
):
    produce(kafka_bootstrap, topic, [orjson.dumps(run_event(n=i)) for i in range(10)])
    with Sink() as sink:
        sink.behaviour.fail_status = 503
        process = start_cli(
            kafka_bootstrap, topic, sink.url, "g-back", session_timeout, "--drain-timeout", "4"
        )
        assert wait_until(lambda: len(sink.requests) >= 3, 30)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the outage outlasts the signal, by a margin: part of the scenario
        sink.behaviour.fail_status = None
        out, _ = process.communicate(timeout=30)
        arrived = sorted(e["n"] for e in sink.events)
    assert process.returncode == 0
    assert arrived == list(range(10))
    assert "delivered 10" in out.splitlines()[-1]
    assert committed_offsets(kafka_bootstrap, topic, "g-back") == 10


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", "forward", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_forward_without_a_reachable_broker_says_so_in_one_line():
    brokers = f"127.0.0.1:{refused_port()}"
    result = run_cli("--bootstrap-servers", brokers, "--topic", "t", "--url", "http://127.0.0.1:9")
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"outbox forward: cannot reach the Kafka brokers {brokers} (")
    assert "--wait-for-brokers" in lines[0]
    assert "Traceback" not in result.stderr
    assert "Unclosed" not in result.stderr


def test_forward_waits_for_the_brokers_when_asked_with_progress_lines_then_forwards(topic, session_timeout):
    broker = EmbeddedBroker()  # its port chosen, not started yet
    with Sink() as sink:
        process = start_cli(
            broker.bootstrap_servers,
            topic,
            sink.url,
            "g-wait",
            session_timeout,
            "--wait-for-brokers",
            stderr=subprocess.PIPE,
        )
        try:
            first = process.stdout.readline()
            assert first.startswith(
                f"forward {topic}: waiting for the Kafka brokers {broker.bootstrap_servers}"
            )
            assert "(attempt 1, next in" in first
            broker.start()
            produce(broker.bootstrap_servers, topic, [orjson.dumps(run_event(n=i)) for i in range(5)])
            assert sink.wait_for(5, 60)
        finally:
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=30)
            broker.stop()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    assert "Unclosed" not in err
    assert "delivered 5" in out.splitlines()[-1]


def test_forward_waiting_for_brokers_stops_at_sigterm():
    brokers = f"127.0.0.1:{refused_port()}"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "outbox.tools.cli",
            "forward",
            "--bootstrap-servers",
            brokers,
            "--topic",
            "t",
            "--url",
            "http://127.0.0.1:9",
            "--wait-for-brokers",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert "waiting for the Kafka brokers" in process.stdout.readline()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Traceback" not in err
    assert "Unclosed" not in err


@pytest.mark.slow  # about 15 s: the consumer notices the loss by its own timeouts
def test_brokers_lost_mid_run_are_said_in_the_progress_lines_and_sigterm_still_exits_cleanly(
    topic, session_timeout
):
    # Before: the lines went on "lag 0" as if all were quiet, and SIGTERM with the brokers gone
    # ended in a CancelledError traceback from aiokafka's consumer.stop() (exit 1).
    import queue

    broker = EmbeddedBroker()
    broker.start()
    lines: queue.Queue[str] = queue.Queue()
    try:
        bootstrap = broker.bootstrap_servers
        process = subprocess.Popen(
            [
                sys.executable, "-m", "outbox.tools.cli", "forward", "--bootstrap-servers", bootstrap,
                "--topic", topic, "--url", "http://127.0.0.1:9", "--progress-interval", "0.5",
                "--session-timeout", str(session_timeout),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True)
        reader.start()
        assert "consumed 0" in lines.get(timeout=20)  # forwarding
    finally:
        broker.stop()
    said = ""
    deadline = time.monotonic() + 20
    while "error(s) since the last line" not in said and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            said = lines.get(timeout=1)
    process.send_signal(signal.SIGTERM)
    # The reader ends at the process's exit; communicate() closes stdout, under it otherwise
    # ("I/O operation on closed file" in the reader's thread).
    reader.join(30)
    _, err = process.communicate(timeout=30)
    assert f"; the Kafka brokers {bootstrap}: " in said, said
    assert process.returncode == 0, err
    assert "Traceback" not in err
    assert "Unclosed" not in err
