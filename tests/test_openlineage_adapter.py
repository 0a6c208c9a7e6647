"""openlineage-python's other transports (a custom module.Class, file with storage_options,
transform) behind the outbox: built by its own factory from the same configuration, run on the
adapter's threads, with the outbox's retries, order and deadlines."""

import threading
import time
import uuid

import pytest

from outbox import ConfigError, Outbox
from outbox.transports import OpenLineageTransportAdapter

import support.ol_transports as ol_transports
from support.helpers import run_event

FAST = {"backoff_base": 0.02, "backoff_cap": 0.2, "linger": 0.01, "close_at_exit": False}
CUSTOM = "support.ol_transports.RecordingTransport"


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    ol_transports.RECEIVED.clear()


def test_a_custom_transport_class_gains_the_outboxs_buffering_and_retries():
    env = {"OPENLINEAGE__TRANSPORT__TYPE": CUSTOM, "OPENLINEAGE__TRANSPORT__FAIL_FIRST": "3"}
    outbox = Outbox.from_env(env, **FAST)
    assert isinstance(outbox.transport, OpenLineageTransportAdapter)
    runs = [str(uuid.uuid4()) for _ in range(4)]
    for n in range(5):
        for run_id in runs:
            outbox.emit(run_event(run_id=run_id, n=n))
    report = outbox.close(10)
    assert report.delivered == 20, report
    assert outbox.stats().retried >= 3  # emit raised three times: retried, not lost
    for run_id in runs:  # each run's events in order
        assert [e["n"] for e in ol_transports.RECEIVED if e["run"]["runId"] == run_id] == list(range(5))
    threads = outbox.transport.transport.threads
    assert threads  # it ran, and never on the caller's thread:
    assert threading.main_thread().name not in threads


def test_a_slow_transport_never_slows_emit_and_close_keeps_its_deadline():
    outbox = Outbox.from_env(
        {"OPENLINEAGE__TRANSPORT__TYPE": CUSTOM, "OPENLINEAGE__TRANSPORT__DELAY": "5"}, **FAST
    )
    worst = 0.0
    for n in range(50):
        started = time.monotonic()
        assert outbox.emit(run_event(n=n))
        worst = max(worst, time.monotonic() - started)
    started = time.monotonic()
    report = outbox.close(1.0)
    took = time.monotonic() - started
    assert worst < 0.1
    assert took < 1.5
    assert report.timed_out
    assert report.undelivered == {"dropped_shutdown": 50}


def test_file_with_storage_options_is_openlineage_pythons_file_transport(tmp_path):
    env = {
        "OPENLINEAGE__TRANSPORT__TYPE": "file",
        "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": str(tmp_path / "events.jsonl"),
        "OPENLINEAGE__TRANSPORT__APPEND": "true",
        "OPENLINEAGE__TRANSPORT__STORAGE_OPTIONS": "{}",
    }
    outbox = Outbox.from_env(env, **FAST)
    assert isinstance(outbox.transport, OpenLineageTransportAdapter)
    for n in range(3):
        outbox.emit(run_event(n=n))
    assert outbox.close(5).delivered == 3
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 3


def test_transform_runs_its_transformer_then_its_inner_transport():
    env = {
        "OPENLINEAGE__TRANSPORT__TYPE": "transform",
        "OPENLINEAGE__TRANSPORT__TRANSFORMER_CLASS": "support.ol_transports.RenameJob",
        "OPENLINEAGE__TRANSPORT__TRANSPORT": '{"type": "support.ol_transports.RecordingTransport"}',
    }
    outbox = Outbox.from_env(env, **FAST)
    outbox.emit(run_event(n=0))
    assert outbox.close(5).delivered == 1
    assert [e["job"]["name"] for e in ol_transports.RECEIVED] == ["renamed"]


def test_a_transport_openlineage_python_cannot_build_is_a_config_error_naming_it():
    with pytest.raises(
        ConfigError,
        match=r"OPENLINEAGE__TRANSPORT__TYPE='no_such_module\.Transport': openlineage-python could not build",
    ):
        Outbox.from_env({"OPENLINEAGE__TRANSPORT__TYPE": "no_such_module.Transport"}, close_at_exit=False)
