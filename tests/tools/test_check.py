"""``outbox check``, run as operators run it (a process, its environment), against a running sink,
a refused URL, a TLS backend, a Kafka-protocol broker and a broker that is down."""

import asyncio
import inspect
import json
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from outbox import Outbox
from outbox._config._config import OUTBOX_VARIABLES
from outbox.tools.check import datahub_refusal, openmetadata_verdict
from outbox.tools.faultproxy import FaultProxy
from outbox.tools.sink import Sink, SinkBehaviour

from support.helpers import refused_port
from support.kafka_helpers import create_topic


def check(env: dict[str, str], *args: str, cwd: Path | None = None) -> tuple[int, list[str]]:
    """Run ``outbox check`` with only ``env`` (and PATH) set; (exit status, its lines)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    done = subprocess.run(
        # Probes that are answered end at once; 3 s was not enough for the sink's answer in four
        # workers beside two busy processes.  A test of a probe that waits gives its own.
        [sys.executable, "-m", "outbox.tools.cli", "check", "--timeout", "20", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
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
    url = f"http://127.0.0.1:{refused_port()}"
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


def test_batch_mode_against_a_backend_without_a_batch_endpoint_fails_with_the_fix():
    # Marquez has no batch endpoint: mode=batch loses every event there, while the single
    # endpoint answers as it should (check passed all three checks).
    with Sink(behaviour=SinkBehaviour(single_only=True)) as sink:
        env = {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": sink.url}
        status, lines = check({**env, "OPENLINEAGE__TRANSPORT__MODE": "batch"})
        assert status == 1, lines
        assert "no batch endpoint there" in line(lines, "batch")
        assert "OPENLINEAGE__TRANSPORT__MODE=auto" in line(lines, "batch")
        status, lines = check({**env, "OPENLINEAGE__TRANSPORT__MODE": "auto"})  # (auto falls back)
        assert status == 0, lines
        assert not [entry for entry in lines if entry.split()[1:2] == ["batch"]]
        assert sink.events == []
    with Sink() as sink:
        status, lines = check(
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": sink.url,
                "OPENLINEAGE__TRANSPORT__MODE": "batch",
            }
        )
        assert status == 0, lines
        assert line(lines, "batch").startswith("ok")
        assert sink.events == []


def test_a_spill_directory_that_cannot_be_made_fails_as_the_outbox_would(tmp_path):
    # os.access says yes to root under /sys; Outbox.from_env() fails there ("Operation not
    # permitted"), and check said "does not exist yet (made at start)".
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for spill in ("/sys/outbox-spill", str(blocker / "spill")):
        status, lines = check(
            {"OPENLINEAGE_URL": f"http://127.0.0.1:{refused_port()}", "OUTBOX_SPILL_DIR": spill}
        )
        assert status == 1
        assert line(lines, "spill").startswith("FAIL"), lines


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
    with Sink(tls=context) as sink:
        yield sink.url, cert


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


def test_a_client_for_an_http_url_loads_no_ca_bundle_and_refuses_tls_if_ever_asked(tls_sink, monkeypatch):
    """An http:// transport's client speaks no TLS: without a proxy it is the transport's own
    HTTP/1.1 client; through an http:// proxy, httpx's with a context that loads no CA bundle
    (the default one costs 30-50 ms per outbox at a cold start, for TLS that never happens), and
    that context still verifies: TLS tried with it fails, it is never an unverified one.  An
    https:// URL keeps httpx's default verification (the sink's own CA is not trusted)."""
    from outbox.transports._http import _settings as _http_settings
    from outbox.transports._http._wire import WireClient

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    direct = _http_settings.new_client("http://127.0.0.1:1", httpx.Timeout(1.0), {}, True, 1)
    assert isinstance(direct, WireClient)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:2")
    monkeypatch.setenv("NO_PROXY", "")
    plain = _http_settings.new_client("http://127.0.0.1:1", httpx.Timeout(1.0), {}, True, 1)
    assert plain._transport._pool._ssl_context is _http_settings._NO_TLS
    context = _http_settings._NO_TLS
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.cert_store_stats()["x509_ca"] == 0
    url, _ = tls_sink
    port = int(url.rsplit(":", 1)[1])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        context.wrap_socket(raw, server_hostname="127.0.0.1")
    secure = _http_settings.new_client(url, httpx.Timeout(1.0), {}, True, 1)
    assert secure._transport._pool._ssl_context is not context

    async def post() -> None:
        async with secure:
            await secure.post(url, json={})

    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(post())


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
    bootstrap = f"127.0.0.1:{refused_port()}"
    status, lines = check(kafka_env(bootstrap, "lineage"), "--timeout", "3")
    assert status == 1
    assert line(lines, "brokers").startswith("FAIL")
    assert bootstrap in line(lines, "brokers")
    assert not [entry for entry in lines if entry.startswith("ERROR")]  # aiokafka's own noise


def test_nothing_configured_fails_and_says_what_to_set(tmp_path):
    # No OPENLINEAGE_* variable, no openlineage.yml here or in the home folder: the console.
    status, lines = check({"HOME": str(tmp_path)}, cwd=tmp_path)
    assert status == 1, lines
    failed = line(lines, "config")
    assert failed.startswith("FAIL")
    assert "no lineage backend is configured" in failed
    for setting in ("OPENLINEAGE_URL", "OPENLINEAGE__TRANSPORT__TYPE", "openlineage.yml"):
        assert setting in failed
    assert lines[-1].endswith("failed: config")
    # The console chosen on purpose is a configuration, and passes.
    status, lines = check({"HOME": str(tmp_path), "OPENLINEAGE__TRANSPORT__TYPE": "console"}, cwd=tmp_path)
    assert status == 0, lines
    assert "printed to standard output" in line(lines, "reach")


def settings_in(lines: list[str]) -> dict[str, str]:
    """The settings lines of check's output, by keyword: ``value`` or ``value (VARIABLE)``."""
    start = next(i for i, entry in enumerate(lines) if entry.startswith("settings "))
    text = lines[start][len("settings") :]
    for entry in lines[start + 1 :]:
        if not entry.startswith(" " * 12):
            break
        text += " " + entry.strip()
    pairs = [part.strip().split("=", 1) for part in text.split(", ")]
    return {key: value for key, value in pairs}


# A value other than the default for every OUTBOX_* variable, and how check prints it.
NOT_DEFAULT = {
    "OUTBOX_MAX_EVENTS": ("5000", "5000"),
    "OUTBOX_MAX_BYTES": ("32MiB", "33554432"),
    "OUTBOX_POLICY": ("block", "block"),
    "OUTBOX_BLOCK_TIMEOUT": ("0.25", "0.25"),
    "OUTBOX_MAX_BATCH_EVENTS": ("250", "250"),
    "OUTBOX_MAX_BATCH_BYTES": ("512KiB", "524288"),
    "OUTBOX_LINGER": ("0.05", "0.05"),
    "OUTBOX_SHUTDOWN_TIMEOUT": ("7", "7.0"),
    "OUTBOX_SEND_TIMEOUT": ("12", "12.0"),
    "OUTBOX_BACKOFF_BASE": ("0.2", "0.2"),
    "OUTBOX_BACKOFF_CAP": ("11", "11.0"),
    "OUTBOX_MAX_RETRY_AFTER": ("120", "120.0"),
    "OUTBOX_POISON_ATTEMPTS": ("3", "3"),
    "OUTBOX_MAX_CONCURRENCY": ("2", "2"),
    "OUTBOX_DEAD_LETTER": ("{tmp}/dead.jsonl", "{tmp}/dead.jsonl"),
    "OUTBOX_DEAD_LETTER_MAX_BYTES": ("1MiB", "1048576"),
    "OUTBOX_SPILL_DIR": ("{tmp}/spill", "{tmp}/spill"),
    "OUTBOX_MAX_SPILL_BYTES": ("10MiB", "10485760"),
    "OUTBOX_SPILL_INTERVAL": ("0.2", "0.2"),
    "OUTBOX_CIRCUIT_THRESHOLD": ("9", "9"),
    "OUTBOX_LOG_INTERVAL": ("3", "3.0"),
    "OUTBOX_CLOSE_AT_EXIT": ("false", "False"),
    "OUTBOX_NAME": ("checked", "checked"),
}


def test_every_setting_in_force_is_printed_with_the_variable_it_came_from(tmp_path):
    # Every keyword of Outbox() is an OUTBOX_* variable, and this test knows a value for each:
    # a setting added later fails here until check prints it.
    keywords = set(inspect.signature(Outbox).parameters) - {"transport"}
    assert {keyword for keyword, _ in OUTBOX_VARIABLES.values()} == keywords
    assert set(NOT_DEFAULT) == set(OUTBOX_VARIABLES)
    with Sink() as sink:
        env = {var: raw.format(tmp=tmp_path) for var, (raw, _) in NOT_DEFAULT.items()}
        status, lines = check({"OPENLINEAGE_URL": sink.url, **env})
        assert status == 0, lines
        shown = settings_in(lines)
        assert set(shown) == keywords
        for var, (_, printed) in NOT_DEFAULT.items():
            keyword = OUTBOX_VARIABLES[var][0]
            assert shown[keyword] == f"{printed.format(tmp=tmp_path)} ({var})"
        # Nothing set: each keyword with the default Outbox() gives it.
        status, lines = check({"OPENLINEAGE_URL": sink.url})
        assert status == 0, lines
        shown = settings_in(lines)
    assert set(shown) == keywords
    defaults = {k: p.default for k, p in inspect.signature(Outbox).parameters.items() if k in keywords}
    defaults |= {"max_batch_events": 1000, "max_batch_bytes": 1024 * 1024, "policy": "drop_oldest"}
    assert shown == {k: str(v) for k, v in defaults.items()}


def event(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "eventType": "COMPLETE",
        "eventTime": "2026-12-02T10:00:00Z",
        "producer": "https://example.com/pipeline",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": "0190ac5e-0000-7000-8000-000000000001", "facets": {}},
        "job": {"namespace": "vast-dataengine://t", "name": "fn"},
        "inputs": [{"namespace": "s3://b", "name": "k.csv"}],
        "outputs": [],
    }
    return base | changes


ENGINE = {"processing_engine": {"name": "VAST_DATAENGINE", "version": "5.3"}}


@pytest.mark.parametrize(
    ("changes", "refused"),
    [
        ({}, "names no orchestrator"),
        ({"run": {"runId": "r", "facets": ENGINE}}, None),
        ({"producer": "https://github.com/OpenLineage/OpenLineage/tree/1.54.0/client/python"}, None),
        # DataHub's regex wants two more path segments: .../OpenLineage/OpenLineage/client fails.
        ({"producer": "https://github.com/OpenLineage/OpenLineage/client"}, "names no orchestrator"),
        ({"producer": "https://github.com/apache/airflow/tree/2.9/openlineage"}, None),
        ({"eventType": None}, "no eventType"),
        ({"run": None}, "not a RunEvent"),
    ],
)
def test_what_datahub_refuses(changes, refused):
    value = {k: v for k, v in event(**changes).items() if v is not None}
    reason = datahub_refusal(value)
    assert reason is None if refused is None else refused in (reason or "")


def test_what_openmetadata_draws_lineage_from():
    start = event(eventType="START")
    no_outputs = event()
    complete = event(outputs=[{"namespace": "trino://h:443", "name": "c.s.t"}])
    assert openmetadata_verdict([start, complete]) == (True, "1 of 2 events draws lineage")
    ok, detail = openmetadata_verdict([start, no_outputs])
    assert not ok
    assert "no outputs" in detail
    ok, detail = openmetadata_verdict([start])
    assert not ok
    assert "COMPLETE" in detail


def write_events(path: Path, *events: dict[str, object]) -> str:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(path)


DATAHUB = {"OPENLINEAGE_URL": "", "OPENLINEAGE_ENDPOINT": "openapi/openlineage/api/v1/lineage"}
OPENMETADATA = {
    "OPENLINEAGE__TRANSPORT__TYPE": "http",
    "OPENLINEAGE__TRANSPORT__URL": "",
    "OPENLINEAGE__TRANSPORT__ENDPOINT": "api/v1/openlineage/lineage",
    "OPENLINEAGE__TRANSPORT__BATCH_FORMAT": "openmetadata",
}
OUTPUT = {"namespace": "trino://h:443", "name": "c.s.t"}


# One `outbox check` per case, each a process of its own (three in one test took 31 s on 3.12
# beside the end-to-end suite's JVMs).  The endpoint answers in every case, but whether events
# arrive depends on them: without a sample the verdict is a failure that says what to pass, a
# sample the backend would drop fails naming why, one it takes passes; nothing is ever sent.
@pytest.mark.parametrize(
    ("flavor", "env", "sample", "status", "said"),
    [
        ("datahub", DATAHUB, None, 1, ["DataHub", "processing_engine", "--events"]),
        (
            "datahub",
            DATAHUB,
            [event(eventType="START"), event()],
            1,
            ["event 1 of 2 (START of vast-dataengine://t/fn) names no orchestrator"],
        ),
        ("datahub", DATAHUB, [event(run={"runId": "r", "facets": ENGINE})], 0, []),
        ("openmetadata", OPENMETADATA, None, 1, ["OpenMetadata", "outputs", "--events"]),
        ("openmetadata", OPENMETADATA, [event(eventType="START"), event()], 1, ["no outputs"]),
        (
            "openmetadata",
            OPENMETADATA,
            [event(eventType="START"), event(outputs=[OUTPUT])],
            0,
            ["1 of 2 events draws lineage"],
        ),
    ],
    ids=[
        "datahub-unjudged",
        "datahub-no-orchestrator",
        "datahub-ok",
        "om-unjudged",
        "om-no-outputs",
        "om-ok",
    ],
)
def test_a_backend_with_needs_of_its_own_is_judged_by_them(tmp_path, flavor, env, sample, status, said):
    with Sink(behaviour=SinkBehaviour(flavor=flavor)) as sink:
        env = {key: value or sink.url for key, value in env.items()}
        args = [] if sample is None else ["--events", write_events(tmp_path / "sample.jsonl", *sample)]
        got, lines = check(env, *args)
        assert sink.events == []  # judged here, never sent
    assert got == status, lines
    verdict = line(lines, "events")
    assert verdict.startswith("ok" if status == 0 else "FAIL"), verdict
    for words in said:
        assert words in verdict, verdict


def _events_file(tmp_path: Path, case: str) -> str:
    if case == "missing":
        return str(tmp_path / "missing.jsonl")
    if case == "not json":
        (tmp_path / "bad.jsonl").write_text("{not json\n")
        return str(tmp_path / "bad.jsonl")
    if case == "dead letters":
        # A dead-letter file is a sample too: its lines' events, also a text event kept as its
        # text (one never serialized, or text that is not an event, is skipped).
        dead = [{"time": "t", "reason": "poison", "answer": "500", "event": event()}]
        dead.append({"time": "t", "reason": "too_large", "event_text": json.dumps(event(), indent=1)})
        dead.append({"time": "t", "reason": "invalid_event", "event_text": "not json"})
        dead.append({"time": "t", "reason": "invalid_event", "event_repr": "<object>"})
        return write_events(tmp_path / "d", *dead)
    # Against a backend with no needs of its own, the spec's required fields are judged.
    return write_events(tmp_path / "s.jsonl", event(), {"eventType": "START"})


# One `outbox check` per case (each a process of its own: four in one test took 41 s in CI
# beside the end-to-end suite's JVMs).
@pytest.mark.parametrize(
    ("case", "status", "said"),
    [
        ("missing", 1, "missing.jsonl"),
        ("not json", 1, "line 1"),
        ("dead letters", 0, "2 events, each with what the OpenLineage spec requires"),
        ("spec fields", 1, "event 2 of 2"),
    ],
)
def test_an_events_file_is_judged_and_one_that_cannot_be_read_fails_naming_it(tmp_path, case, status, said):
    with Sink() as sink:
        got, lines = check({"OPENLINEAGE_URL": sink.url}, "--events", _events_file(tmp_path, case))
    assert got == status, lines
    assert said in line(lines, "events")


def test_a_probe_that_waits_says_what_it_waits_for():
    """Each check's line comes as it is decided: the connection's before the answer's
    "waiting" (#39: ``check --timeout 2`` printed "waiting" before "ok connect")."""
    with Sink() as sink, FaultProxy("127.0.0.1", sink.port, mode="blackhole") as proxy:
        url = proxy.url
        status, lines = check({"OPENLINEAGE_URL": url}, "--timeout", "1.5")
    assert status == 1
    answer = line(lines, "answer")
    assert answer.startswith("FAIL")
    waiting = [entry for entry in lines if "waiting" in entry]
    assert waiting == [f"...   waiting up to 1.5 s for the answer of POST {url}/api/v1/lineage"]
    connect = line(lines, "connect")
    assert connect.startswith("ok")
    assert lines.index(connect) < lines.index(waiting[0]) < lines.index(answer), lines


def test_an_api_key_a_header_cannot_carry_fails_the_config_check_naming_the_variable_only():
    status, lines = check({"OPENLINEAGE_URL": "http://127.0.0.1:1", "OPENLINEAGE_API_KEY": "sécret-ключ-42"})
    assert status == 1, lines
    failed = line(lines, "config")
    assert failed.startswith("FAIL")
    assert "OPENLINEAGE_API_KEY contains a character an HTTP header cannot carry" in failed
    output = "\n".join(lines)
    for part in ("sécret", "ключ", "-42"):
        assert part not in output


# Variants of one event, each against DataHub's and OpenMetadata's needs.
VARIANTS = [
    {},
    {"eventType": None},
    {"eventType": "START"},
    {"run": {"runId": "r", "facets": ENGINE}},
    {"run": {"runId": "r", "facets": ENGINE}, "eventType": None},
    {"producer": "https://github.com/OpenLineage/OpenLineage/tree/1.54.0/client/python"},
    {"producer": "https://github.com/OpenLineage/OpenLineage/client"},
    {"producer": "https://github.com/apache/airflow/tree/2.9/openlineage"},
    {"outputs": [{"namespace": "trino://h:443", "name": "c.s.t"}]},
    {"outputs": [{"namespace": "trino://h:443", "name": "c.s.t"}], "eventType": None},
    {"outputs": [{"namespace": "trino://h:443", "name": "c.s.t"}], "eventType": "FAIL"},
    {"run": None},
]


@pytest.mark.parametrize("changes", VARIANTS)
def test_check_judges_each_event_as_the_sinks_flavours_answer_it(changes):
    from outbox.tools._sink_rules import datahub_failure, openmetadata_single_answer

    value = event(**changes)
    value = {k: v for k, v in value.items() if v is not None or k == "eventType"}
    # DataHub: check refuses exactly what the datahub flavour answers 500 to.
    assert (datahub_refusal(value) is None) == (datahub_failure(value) is None), value
    # OpenMetadata: check's verdict on the event alone is "draws lineage" exactly where the
    # openmetadata flavour processes it (with its tables known).
    if isinstance(value.get("run"), dict):
        processed = openmetadata_single_answer(value, ["svc.c.s.t", "svc.b.k.csv"])["message"]
        assert openmetadata_verdict([value])[0] == (processed == "Event processed"), (value, processed)


def test_a_transport_check_cannot_reach_says_so_rather_than_passing_quietly():
    # openlineage-python's datadog transport, its site down: before, "nothing to reach", passed.
    env = {
        "OPENLINEAGE__TRANSPORT__TYPE": "datadog",
        "OPENLINEAGE__TRANSPORT__APIKEY": "dd-key-0001",
        "OPENLINEAGE__TRANSPORT__SITE": f"http://127.0.0.1:{refused_port()}",
    }
    status, lines = check(env)
    assert status == 0, lines  # the configuration is valid; its backend was not judged
    reach = line(lines, "reach")
    assert "its backend is NOT reached by check" in reach
    assert "send one event" in reach
    assert "dd-key-0001" not in "\n".join(lines)
