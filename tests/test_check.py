"""``outbox check``, run as operators run it (a process, its environment), against a running sink,
a refused URL, a TLS backend, a Kafka-protocol broker and a broker that is down."""

import os
import ssl
import subprocess
import sys

import pytest

from outbox.tools.faultproxy import free_port
from outbox.tools.sink import Sink, SinkBehaviour

from kafka_helpers import create_topic


def check(env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    """Run ``outbox check`` with only ``env`` (and PATH) set; (exit status, its lines)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    done = subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", "check", "--timeout", "3", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, (done.stdout + done.stderr).splitlines()


def line(lines: list[str], name: str) -> str:
    found = [entry for entry in lines if entry.split()[1:2] == [name]]
    assert len(found) == 1, lines
    return found[0]


def test_a_running_sink_passes_every_check_and_nothing_is_written(tmp_path):
    with Sink() as sink:
        status, lines = check({"OPENLINEAGE_URL": sink.url, "OUTBOX_MAX_EVENTS": "5000"})
        assert status == 0, lines
        assert sink.events == []  # nothing was written
        assert len(sink.requests) == 1  # reached once
    assert line(lines, "config").startswith("ok")
    assert line(lines, "connect").startswith("ok")
    assert "422" in line(lines, "answer")
    assert line(lines, "answer").startswith("ok")
    assert lines[-1] == "3 of 3 checks passed"
    settings = " ".join(entry for entry in lines if entry.startswith(("settings", "  ")))
    assert "max_events=5000 (OUTBOX_MAX_EVENTS)" in settings
    assert "policy=drop_oldest" in settings


def test_a_refused_url_fails_naming_it():
    url = f"http://127.0.0.1:{free_port()}"
    status, lines = check({"OPENLINEAGE_URL": url, "OPENLINEAGE_API_KEY": "s3cr3t-key"})
    assert status == 1
    failed = line(lines, "connect")
    assert failed.startswith("FAIL")
    assert f"{url}/api/v1/lineage" in failed
    assert lines[-1].endswith("failed: connect")
    assert "s3cr3t-key" not in "\n".join(lines)  # secrets are redacted
    assert "api_key=***" in "\n".join(lines)


def test_a_wrong_endpoint_and_refused_credentials_fail_with_the_fix():
    with Sink() as sink:
        status, lines = check({"OPENLINEAGE_URL": sink.url + "/nope/"})
        assert status == 1
        assert "check OPENLINEAGE_URL and OPENLINEAGE_ENDPOINT" in line(lines, "answer")
    with Sink(behaviour=SinkBehaviour(api_key="right")) as sink:
        status, lines = check({"OPENLINEAGE_URL": sink.url, "OPENLINEAGE_API_KEY": "wrong"})
        assert status == 1
        assert "OPENLINEAGE_API_KEY" in line(lines, "answer")
        status, lines = check({"OPENLINEAGE_URL": sink.url, "OPENLINEAGE_API_KEY": "right"})
        assert status == 0, lines


def test_an_invalid_setting_fails_the_config_check_naming_the_variable():
    status, lines = check({"OPENLINEAGE_URL": "http://127.0.0.1:1", "OUTBOX_POLICY": "bogus"})
    assert status == 1
    assert line(lines, "config").startswith("FAIL")
    assert "OUTBOX_POLICY" in line(lines, "config")
    assert "drop_oldest" in line(lines, "config")


@pytest.fixture
def tls_sink(tmp_path):
    """The sink behind TLS, with a certificate of a CA of our own (openssl, as operators make one)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    sink = Sink()
    sink._server.socket = context.wrap_socket(sink._server.socket, server_side=True)
    with sink:
        yield f"https://127.0.0.1:{sink.port}", cert


def test_tls_is_checked_as_the_transport_verifies_it(tls_sink):
    url, ca = tls_sink
    status, lines = check({"OPENLINEAGE_URL": url})
    assert status == 1
    assert line(lines, "tls").startswith("FAIL")
    assert "OPENLINEAGE__TRANSPORT__VERIFY" in line(lines, "tls")
    status, lines = check(
        {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": url}
        | {"OPENLINEAGE__TRANSPORT__VERIFY": str(ca)}
    )
    assert status == 0, lines
    assert "certificate verified" in line(lines, "tls")


def kafka_env(bootstrap: str, topic: str) -> dict[str, str]:
    return {
        "OPENLINEAGE__TRANSPORT__TYPE": "kafka",
        "OPENLINEAGE__TRANSPORT__TOPIC": topic,
        "OPENLINEAGE__TRANSPORT__CONFIG": f'{{"bootstrap.servers": "{bootstrap}"}}',
    }


def test_kafka_reads_the_topics_metadata(kafka_bootstrap, topic):
    create_topic(kafka_bootstrap, topic, partitions=3)
    status, lines = check(kafka_env(kafka_bootstrap, topic))
    assert status == 0, lines
    assert line(lines, "brokers").startswith("ok")
    assert "3 partition(s)" in line(lines, "topic")
    # A topic that does not exist fails, named.
    status, lines = check(kafka_env(kafka_bootstrap, topic + "-missing"))
    assert status == 1
    assert f"{topic}-missing" in line(lines, "topic")
    assert line(lines, "topic").startswith("FAIL")


def test_a_broker_that_is_down_fails_naming_the_brokers():
    bootstrap = f"127.0.0.1:{free_port()}"
    status, lines = check(kafka_env(bootstrap, "lineage"))
    assert status == 1
    assert line(lines, "brokers").startswith("FAIL")
    assert bootstrap in line(lines, "brokers")
    assert not [entry for entry in lines if entry.startswith("ERROR")]  # aiokafka's own noise
