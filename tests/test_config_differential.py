"""openlineage-python 1.54's OpenLineageClient and Outbox.from_env, built from the same
environment (and openlineage.yml), must resolve the same transport: kind, URL and endpoint,
topic and message key, members.  Most configurations are the ones openlineage-python's own
tests use; each runs in a clean environment, restored afterwards (OpenLineageClient() writes
into os.environ)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urljoin

import pytest

from outbox import Outbox
from outbox.transports import (
    CompositeTransport,
    ConsoleTransport,
    FileTransport,
    HttpTransport,
    KafkaTransport,
    OpenLineageTransportAdapter,
)

KAFKA = '{"bootstrap.servers": "127.0.0.1:1", "acks": "all"}'

CASES: dict[str, tuple[dict[str, str], str | None]] = {
    "url": ({"OPENLINEAGE_URL": "http://marquez:5000"}, None),
    "url and endpoint": (
        {"OPENLINEAGE_URL": "http://m:5000", "OPENLINEAGE_ENDPOINT": "api/v2/lineage"},
        None,
    ),
    "url and api key": ({"OPENLINEAGE_URL": "http://m:5000", "OPENLINEAGE_API_KEY": "k"}, None),
    "url with a path": ({"OPENLINEAGE_URL": "http://dh:8080/openapi/openlineage/"}, None),
    "disabled": ({"OPENLINEAGE_URL": "http://m:5000", "OPENLINEAGE_DISABLED": " TRUE "}, None),
    "disabled false": ({"OPENLINEAGE_URL": "http://m:5000", "OPENLINEAGE_DISABLED": "false"}, None),
    "http type": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": "http://m:5000",
            "OPENLINEAGE__TRANSPORT__ENDPOINT": "api/v1/lineage",
        },
        None,
    ),
    "http with a path, no slash": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": "http://om:8585/api",
            "OPENLINEAGE__TRANSPORT__ENDPOINT": "v1/openlineage/lineage",
        },
        None,
    ),
    "http auth and compression": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": "http://m:5000",
            "OPENLINEAGE__TRANSPORT__AUTH": '{"type": "api_key", "apiKey": "k"}',
            "OPENLINEAGE__TRANSPORT__COMPRESSION": "gzip",
        },
        None,
    ),
    "http name, priority and an unknown key": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": "http://m:5000",
            "OPENLINEAGE__TRANSPORT__NAME": "main",
            "OPENLINEAGE__TRANSPORT__PRIORITY": "2",
            "OPENLINEAGE__TRANSPORT__SOMETHING": "1",
        },
        None,
    ),
    "http retry keywords": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": "http://m:5000",
            "OPENLINEAGE__TRANSPORT__RETRY": '{"total": 7, "backoff_factor": 0.5, "raise_on_status": false}',
        },
        None,
    ),
    "whole-object variable": (
        {"OPENLINEAGE__TRANSPORT": '{"type": "http", "url": "http://whole:5000", "endpoint": "x/y"}'},
        None,
    ),
    "async_http with OPENLINEAGE_URL": (
        {"OPENLINEAGE__TRANSPORT__TYPE": "async_http", "OPENLINEAGE_URL": "http://m:5000"},
        None,
    ),
    "console": ({"OPENLINEAGE__TRANSPORT__TYPE": "console"}, None),
    "nothing: console": ({}, None),
    "file": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "file",
            "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": "events.jsonl",
            "OPENLINEAGE__TRANSPORT__APPEND": "true",
        },
        None,
    ),
    "kafka": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "kafka",
            "OPENLINEAGE__TRANSPORT__TOPIC": "lineage",
            "OPENLINEAGE__TRANSPORT__CONFIG": KAFKA,
        },
        None,
    ),
    "kafka MESSAGEKEY (ignored by both)": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "kafka",
            "OPENLINEAGE__TRANSPORT__TOPIC": "lineage",
            "OPENLINEAGE__TRANSPORT__CONFIG": KAFKA,
            "OPENLINEAGE__TRANSPORT__MESSAGEKEY": "fixed",
        },
        None,
    ),
    "kafka MESSAGE_KEY": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "kafka",
            "OPENLINEAGE__TRANSPORT__TOPIC": "lineage",
            "OPENLINEAGE__TRANSPORT__CONFIG": KAFKA,
            "OPENLINEAGE__TRANSPORT__MESSAGE_KEY": "fixed",
        },
        None,
    ),
    "kafka flush and librdkafka keys": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "kafka",
            "OPENLINEAGE__TRANSPORT__TOPIC": "lineage",
            "OPENLINEAGE__TRANSPORT__FLUSH": "false",
            "OPENLINEAGE__TRANSPORT__CONFIG": '{"bootstrap.servers": "127.0.0.1:1", "retries": 3}',
        },
        None,
    ),
    "yaml http": ({}, "transport:\n  type: http\n  url: http://yaml:5000\n  endpoint: api/v1/lineage\n"),
    "yaml kafka message_key": (
        {},
        "transport:\n  type: kafka\n  topic: t\n  message_key: k\n"
        "  config:\n    bootstrap.servers: 127.0.0.1:1\n",
    ),
    "yaml over variables": (
        {"OPENLINEAGE__TRANSPORT__URL": "http://env:5000"},
        "transport:\n  type: http\n  url: http://yaml:5000\n",
    ),
    "variables complete yaml": (
        {"OPENLINEAGE__TRANSPORT__ENDPOINT": "from/env"},
        "transport:\n  type: http\n  url: http://yaml:5000\n",
    ),
    "missing OPENLINEAGE_CONFIG, then url": (
        {"OPENLINEAGE_CONFIG": "/nonexistent/openlineage.yml", "OPENLINEAGE_URL": "http://m:5000"},
        None,
    ),
    "bad yaml, then url": ({"OPENLINEAGE_URL": "http://m:5000"}, "transport: [unclosed\n"),
    "composite": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "composite",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__FIRST__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__FIRST__URL": "http://a:5000",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__SECOND__TYPE": "console",
        },
        None,
    ),
    "composite and the OPENLINEAGE_URL alias": (
        {
            "OPENLINEAGE_URL": "http://alias:5000",
            "OPENLINEAGE_API_KEY": "k",
            "OPENLINEAGE__TRANSPORT__TYPE": "composite",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__LOCAL__TYPE": "console",
        },
        None,
    ),
    "composite list, sorted": (
        {},
        "transport:\n  type: composite\n  sort_transports: true\n  transports:\n"
        "    - {type: console, name: low, priority: 1}\n"
        "    - {type: http, url: 'http://high:5000', name: high, priority: 5}\n",
    ),
    "a custom module.Class": ({"OPENLINEAGE__TRANSPORT__TYPE": "ol_transports.RecordingTransport"}, None),
    "transform": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "transform",
            "OPENLINEAGE__TRANSPORT__TRANSFORMER_CLASS": "ol_transports.RenameJob",
            "OPENLINEAGE__TRANSPORT__TRANSPORT": '{"type": "console"}',
        },
        None,
    ),
}


def theirs(transport: Any) -> Any:
    """What openlineage-python resolved, as comparable data."""
    kind = transport.kind
    if kind == "http" or kind == "async_http":
        return ("http", urljoin(transport.url, transport.endpoint))
    if kind == "kafka":
        return ("kafka", transport.topic, transport.message_key)
    if kind == "composite":
        return ("composite", [(t.name, theirs(t)) for t in transport.transports])
    if kind == "file":
        return ("file", transport.config.log_file_path)
    if kind in ("console", "noop"):
        return (kind,)
    return ("other", type(transport).__name__)


def ours(transport: Any, outbox: Outbox) -> Any:
    if outbox._buffer.refusal == "disabled":
        return ("noop",)
    if isinstance(transport, HttpTransport):
        return ("http", transport.single_url)
    if isinstance(transport, KafkaTransport):
        key = transport.message_key.decode() if transport.message_key else None
        return ("kafka", transport.topic, key)
    if isinstance(transport, CompositeTransport):
        return ("composite", [(name, ours(member, outbox)) for name, member in transport.members.items()])
    if isinstance(transport, FileTransport):
        return ("file", transport.log_file_path)
    if isinstance(transport, ConsoleTransport):
        return ("console",)
    if isinstance(transport, OpenLineageTransportAdapter):
        return ("other", type(transport.transport).__name__)
    return ("unknown", type(transport).__name__)


@pytest.fixture
def clean(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("OPENLINEAGE"):
            del os.environ[name]
    yield tmp_path
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("case", list(CASES))
def test_openlineage_python_and_from_env_resolve_the_same_transport(clean, case):
    from openlineage.client import OpenLineageClient

    env, yaml_text = CASES[case]
    if yaml_text is not None:
        (clean / "openlineage.yml").write_text(yaml_text)
    os.environ.update(env)
    expected = theirs(OpenLineageClient().transport)
    outbox = Outbox.from_env(close_at_exit=False)  # after the client wrote into os.environ
    try:
        assert ours(outbox._transport, outbox) == expected
    finally:
        outbox.close(0)


def test_there_are_at_least_25_configurations():
    assert len(CASES) >= 25
