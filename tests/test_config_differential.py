"""openlineage-python 1.54's OpenLineageClient and Outbox.from_env, built from the same
environment (and openlineage.yml), must resolve a transport that delivers the same way: kind,
URL and endpoint, compression, timeout, authorization and custom headers, TLS verification
(where the URL uses it), async_http's concurrency, a custom retry status_forcelist, Kafka topic
and message key, composite members and their flags, file path and mode.  Each configuration
says "same", or is deliberately different, with the reason and both sides pinned.  Most
configurations are the ones openlineage-python's own tests use; each runs in a clean
environment, restored afterwards (OpenLineageClient() writes into os.environ)."""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import pytest

from outbox import ConfigError, Outbox
from outbox.transports import (
    CompositeTransport,
    ConsoleTransport,
    FileTransport,
    HttpTransport,
    KafkaTransport,
    OpenLineageTransportAdapter,
)

KAFKA = '{"bootstrap.servers": "127.0.0.1:1", "acks": "all"}'

CASES: dict[str, tuple[dict[str, str], str | None]] = {  # the first 31: all "same"
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
    "a custom module.Class": (
        {"OPENLINEAGE__TRANSPORT__TYPE": "support.ol_transports.RecordingTransport"},
        None,
    ),
    "transform": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "transform",
            "OPENLINEAGE__TRANSPORT__TRANSFORMER_CLASS": "support.ol_transports.RenameJob",
            "OPENLINEAGE__TRANSPORT__TRANSPORT": '{"type": "console"}',
        },
        None,
    ),
}


SAME = "same"


@dataclass(frozen=True)
class Different:
    """A deliberate difference: why, and what each side resolves (or "refused")."""

    reason: str
    theirs: Any
    ours: Any


@dataclass(frozen=True)
class Refused:
    """from_env raises a ConfigError whose message holds ``text``."""

    text: str


HTTP = {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": "http://m:5000"}
HTTPS = {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": "https://127.0.0.1:9"}
ASYNC = {"OPENLINEAGE__TRANSPORT__TYPE": "async_http", "OPENLINEAGE__TRANSPORT__URL": "http://m:5000"}
COMPOSITE = (
    "transport:\n  type: composite\n  continue_on_failure: {failure}\n  continue_on_success: {success}\n"
    "  transports:\n    a: {{type: console}}\n    b: {{type: http, url: 'http://b:5000'}}\n"
)


def http_url(url: str, **more: str) -> dict[str, str]:
    return {**HTTP, "OPENLINEAGE__TRANSPORT__URL": url, **more}


NEW_CASES: dict[str, tuple[dict[str, str], str | None, Any]] = {
    # -- HTTP: what openlineage-python delivers with, ours delivers with ----------------------
    "http empty compression (uncompressed)": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__COMPRESSION": ""},
        None,
        SAME,
    ),
    "yaml http compression null": (
        {},
        "transport:\n  type: http\n  url: http://m:5000\n  compression:\n",
        SAME,
    ),
    "http verify 'False' on an http URL (irrelevant)": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "False"},
        None,
        SAME,
    ),
    "http a CA path that does not exist, on an http URL": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "/nonexistent/ca.pem"},
        None,
        SAME,
    ),
    "http sslContext caCertPath that does not exist, on an http URL": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__SSLCONTEXT": '{"caCertPath": "/nonexistent/ca.pem"}'},
        None,
        SAME,
    ),
    "https verify false": ({**HTTPS, "OPENLINEAGE__TRANSPORT__VERIFY": "false"}, None, SAME),
    "https verify true": ({**HTTPS, "OPENLINEAGE__TRANSPORT__VERIFY": "true"}, None, SAME),
    "http timeout": ({**HTTP, "OPENLINEAGE__TRANSPORT__TIMEOUT": "2.5"}, None, SAME),
    "http custom headers": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__CUSTOM_HEADERS": '{"X-Tenant": "t1", "X-Env": "prod"}'},
        None,
        SAME,
    ),
    "http a custom Authorization header overrides the api key": (
        {
            **HTTP,
            "OPENLINEAGE__TRANSPORT__AUTH": '{"type": "api_key", "apiKey": "k"}',
            "OPENLINEAGE__TRANSPORT__CUSTOM_HEADERS": '{"Authorization": "Token t"}',
        },
        None,
        SAME,
    ),
    "yaml http api key": (
        {},
        "transport:\n  type: http\n  url: http://m:5000\n  auth:\n    type: api_key\n    apiKey: k\n",
        SAME,
    ),
    "url and api key beside a typed transport (the key is the url rule's)": (
        {**HTTP, "OPENLINEAGE_API_KEY": "k"},
        None,
        SAME,
    ),
    "http retry status_forcelist": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__RETRY": '{"total": 3, "status_forcelist": [502, 503]}'},
        None,
        SAME,
    ),
    "yaml http retry status_forcelist with 429": (
        {},
        "transport:\n  type: http\n  url: http://m:5000\n  retry:\n    status_forcelist: [429, 500]\n",
        SAME,
    ),
    "async_http: its default concurrency": (ASYNC, None, SAME),
    "async_http max_concurrent_requests": (
        {**ASYNC, "OPENLINEAGE__TRANSPORT__MAX_CONCURRENT_REQUESTS": "7"},
        None,
        SAME,
    ),
    "async_http compression and timeout": (
        {**ASYNC, "OPENLINEAGE__TRANSPORT__COMPRESSION": "gzip", "OPENLINEAGE__TRANSPORT__TIMEOUT": "3"},
        None,
        SAME,
    ),
    "async_http retry status_forcelist": (
        {**ASYNC, "OPENLINEAGE__TRANSPORT__RETRY": '{"status_forcelist": [503]}'},
        None,
        SAME,
    ),
    "OPENLINEAGE_URL with spaces around it": ({"OPENLINEAGE_URL": "  http://m:5000  "}, None, SAME),
    "OPENLINEAGE_ENDPOINT empty: the URL itself": (
        {"OPENLINEAGE_URL": "http://m:5000/lineage", "OPENLINEAGE_ENDPOINT": ""},
        None,
        SAME,
    ),
    "OPENLINEAGE_DISABLED 1 is not true": (
        {"OPENLINEAGE_URL": "http://m:5000", "OPENLINEAGE_DISABLED": "1"},
        None,
        SAME,
    ),
    "noop": ({"OPENLINEAGE__TRANSPORT__TYPE": "noop"}, None, SAME),
    "yaml transport null, then url": ({"OPENLINEAGE_URL": "http://m:5000"}, "transport:\n", SAME),
    "OPENLINEAGE_CONFIG names a file": ({"OPENLINEAGE_CONFIG": "{tmp}/custom.yml"}, "@custom.yml", SAME),
    # -- composite ---------------------------------------------------------------------------
    "composite nested in a composite": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "composite",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__OUTER__TYPE": "console",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TYPE": "composite",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__A__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__A__URL": "http://a:5000",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__B__TYPE": "console",
        },
        None,
        SAME,
    ),
    "yaml composite list nested in a composite": (
        {},
        "transport:\n  type: composite\n  transports:\n    - type: console\n      name: c\n"
        "    - type: composite\n      name: inner\n      continue_on_success: false\n"
        "      transports:\n        - {type: http, url: 'http://x:5000', name: x}\n",
        SAME,
    ),
    "yaml composite continue_on_failure 'false' (a string: true)": (
        {},
        COMPOSITE.format(failure="'false'", success="true"),
        SAME,
    ),
    "yaml composite continue_on_failure false": ({}, COMPOSITE.format(failure="false", success="true"), SAME),
    "yaml composite continue_on_success 'no' (a string: true)": (
        {},
        COMPOSITE.format(failure="true", success="'no'"),
        SAME,
    ),
    "yaml composite continue_on_success false": ({}, COMPOSITE.format(failure="true", success="false"), SAME),
    "composite continue_on_failure False from a variable (a string: true)": (
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "composite",
            "OPENLINEAGE__TRANSPORT__CONTINUE_ON_FAILURE": "False",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__A__TYPE": "console",
        },
        None,
        SAME,
    ),
    "yaml composite sort_transports 'false' (a string: true, so sorted)": (
        {},
        "transport:\n  type: composite\n  sort_transports: 'false'\n  transports:\n"
        "    - {type: console, name: low, priority: 1}\n"
        "    - {type: http, url: 'http://high:5000', name: high, priority: 5}\n",
        SAME,
    ),
    "composite with an empty member (skipped)": (
        {},
        "transport:\n  type: composite\n  transports:\n    a: {type: console}\n    b: {}\n",
        SAME,
    ),
    # -- file, kafka ---------------------------------------------------------------------------
    "yaml file append 'false' (a string: true)": (
        {},
        "transport:\n  type: file\n  log_file_path: events.jsonl\n  append: 'false'\n",
        SAME,
    ),
    "yaml file append false": (
        {},
        "transport:\n  type: file\n  log_file_path: e.jsonl\n  append: false\n",
        SAME,
    ),
    "yaml kafka messageKey": (
        {},
        "transport:\n  type: kafka\n  topic: t\n  messageKey: k\n"
        "  config:\n    bootstrap.servers: 127.0.0.1:1\n",
        SAME,
    ),
    "kafka from a whole-object variable": (
        {
            "OPENLINEAGE__TRANSPORT": '{"type": "kafka", "topic": "whole", '
            '"config": {"bootstrap.servers": "127.0.0.1:1"}}'
        },
        None,
        SAME,
    ),
    # -- deliberately different -----------------------------------------------------------------
    "a plain-string OPENLINEAGE__TRANSPORT beside OPENLINEAGE__TRANSPORT__URL": (
        {"OPENLINEAGE__TRANSPORT": "http", "OPENLINEAGE__TRANSPORT__URL": "http://m:5000"},
        None,
        Different(
            "the string replaces the __URL key; openlineage-python 1.54's client then fails with an "
            "AttributeError that names neither setting; the outbox names both, and the fix",
            theirs=("refused", "AttributeError"),
            ours=Refused(
                "OPENLINEAGE__TRANSPORT='http' is not a JSON object, so it would replace "
                "OPENLINEAGE__TRANSPORT__URL: set OPENLINEAGE__TRANSPORT__TYPE=http instead"
            ),
        ),
    ),
    "retry without status_forcelist": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__RETRY": '{"total": 2}'},
        None,
        Different(
            "openlineage-python retries 500, 502, 503 and 504 a few times on the caller's thread, then "
            "loses the event; the outbox keeps every 5xx, 408 and 429 for another attempt until it is "
            "delivered or dropped by its buffer policy or the close deadline",
            theirs={"status_forcelist": [500, 502, 503, 504]},
            ours={"status_forcelist": None},
        ),
    ),
    "https verify 'False' (a string: a CA bundle path)": (
        {**HTTPS, "OPENLINEAGE__TRANSPORT__VERIFY": "False"},
        None,
        Different(
            "requests reads the string as the path of a CA bundle, so every emit fails; the outbox "
            "refuses it at construction",
            theirs=("fails every emit", "Could not find a suitable TLS CA certificate bundle"),
            ours=Refused("cannot load the TLS files (verify='False'"),
        ),
    ),
    "https a CA path that does not exist": (
        {**HTTPS, "OPENLINEAGE__TRANSPORT__SSLCONTEXT": '{"caCertPath": "/nonexistent/ca.pem"}'},
        None,
        Different(
            "every emit of openlineage-python fails on the missing bundle; the outbox refuses it at "
            "construction",
            theirs=("fails every emit", "Could not find a suitable TLS CA certificate bundle"),
            ours=Refused("cannot load the TLS files (verify='/nonexistent/ca.pem'"),
        ),
    ),
    "yaml http timeout '3' (a string)": (
        {},
        "transport:\n  type: http\n  url: https://127.0.0.1:9\n  timeout: '3'\n",
        Different(
            "requests refuses a string timeout on every emit; the outbox at construction",
            theirs=("fails every emit", "Timeout value connect was 3"),
            ours=Refused("openlineage.yml='3' is not a positive number of seconds"),
        ),
    ),
    "http timeout 0": (
        {**http_url("https://127.0.0.1:9"), "OPENLINEAGE__TRANSPORT__TIMEOUT": "0"},
        None,
        Different(
            "requests refuses a timeout of 0 on every emit; the outbox at construction",
            theirs=("fails every emit", "cannot be set to a value less than or equal to 0"),
            ours=Refused("OPENLINEAGE__TRANSPORT__TIMEOUT=0 is not a positive number of seconds"),
        ),
    ),
    "http compression GZIP (capitals)": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__COMPRESSION": "GZIP"},
        None,
        Different(
            "both refuse it: openlineage-python's client with a ValueError from its enum, the outbox "
            "with a ConfigError naming the variable",
            theirs=("refused", "ValueError"),
            ours=Refused("OPENLINEAGE__TRANSPORT__COMPRESSION: compression='GZIP' is not supported"),
        ),
    ),
}


ALL_CASES: dict[str, tuple[dict[str, str], str | None, Any]] = {
    **{name: (env, yaml_text, SAME) for name, (env, yaml_text) in CASES.items()},
    **NEW_CASES,
}


def _lower(headers: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def theirs(transport: Any) -> Any:
    """What openlineage-python resolved, as comparable data (what decides delivery)."""
    from openlineage.client.transport.http import HttpCompression
    from openlineage.client.transport.http_common import DEFAULT_RETRY_CONFIG

    kind = transport.kind
    if kind in ("http", "async_http"):
        config = transport.config
        custom = _lower(config.custom_headers or {})
        described: dict[str, Any] = {
            "kind": "http",
            "url": urljoin(transport.url, transport.endpoint),
            "gzip": transport.compression == HttpCompression.GZIP,
            "timeout": float(transport.timeout),
            "authorization": custom.get("authorization") or config.auth.get_bearer(),
            "headers": sorted(set(custom) - {"authorization"}),
        }
        if transport.url.lower().startswith("https://"):
            described["verify"] = "a CA bundle" if isinstance(transport.verify, str) else transport.verify
        forcelist = config.retry.get("status_forcelist")
        described["retry"] = (
            "default" if forcelist == DEFAULT_RETRY_CONFIG["status_forcelist"] else sorted(forcelist)
        )
        if kind == "async_http":
            described["concurrency"] = config.max_concurrent_requests
        return described
    if kind == "kafka":
        return ("kafka", transport.topic, transport.message_key)
    if kind == "composite":
        config = transport.config
        return (
            "composite",
            [(t.name, theirs(t)) for t in transport.transports],
            bool(config.continue_on_failure),
            bool(config.continue_on_success),
        )
    if kind == "file":
        return ("file", transport.config.log_file_path, bool(transport.config.append))
    if kind in ("console", "noop"):
        return (kind,)
    return ("other", type(transport).__name__)


def ours(transport: Any, outbox: Outbox) -> Any:
    if outbox._buffer.refusal == "disabled":
        return ("noop",)
    if isinstance(transport, HttpTransport):
        headers = _lower(transport._headers)
        described: dict[str, Any] = {
            "kind": "http",
            "url": transport.single_url,
            "gzip": transport.compression == "gzip",
            "timeout": transport.timeout,
            "authorization": headers.get("authorization"),
            "headers": sorted(
                set(headers) - {"authorization", "content-type", "user-agent", "content-encoding"}
            ),
        }
        if transport.url.lower().startswith("https://"):
            verify = transport._verify
            described["verify"] = "a CA bundle" if isinstance(verify, ssl.SSLContext) else verify
        forcelist = transport._forcelist
        described["retry"] = "default" if forcelist is None else sorted(forcelist)
        described["concurrency"] = transport.max_concurrent_requests
        return described
    if isinstance(transport, KafkaTransport):
        key = transport.message_key.decode() if transport.message_key else None
        return ("kafka", transport.topic, key)
    if isinstance(transport, CompositeTransport):
        return (
            "composite",
            [(name, ours(member, outbox)) for name, member in transport.members.items()],
            transport.continue_on_failure,
            transport.continue_on_success,
        )
    if isinstance(transport, FileTransport):
        return ("file", transport.log_file_path, transport.append)
    if isinstance(transport, ConsoleTransport):
        return ("console",)
    if isinstance(transport, OpenLineageTransportAdapter):
        return ("other", type(transport.transport).__name__)
    return ("unknown", type(transport).__name__)


def comparable(mine: Any, reference: Any) -> Any:
    """``mine`` with what openlineage-python has no equivalent of left out: the concurrency of
    its synchronous http transport (one request at a time, on the caller's thread)."""
    if isinstance(mine, dict) and isinstance(reference, dict):
        mine = dict(mine)
        if "concurrency" not in reference:
            mine.pop("concurrency", None)
        return mine
    if (
        isinstance(mine, tuple)
        and isinstance(reference, tuple)
        and mine[:1] == reference[:1] == ("composite",)
    ):
        members = [(name, comparable(member, dict(reference[1]).get(name))) for name, member in mine[1]]
        return (mine[0], members, *mine[2:])
    return mine


def emit_error(transport: Any) -> str | None:
    """The error openlineage-python's transport raises when it emits one event (None if none:
    every case that uses this points at a closed port, so a delivered event is impossible)."""
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

    event = RunEvent(
        eventType=RunState.START,
        eventTime="2026-12-02T10:00:00+00:00",
        run=Run(runId="00005015-0000-0016-2e04-8a6dbdde4eb9"),
        job=Job(namespace="n", name="j"),
    )
    try:
        transport.emit(event)
    except Exception as exc:  # what every emit of theirs raises
        return f"{type(exc).__name__}: {exc}"
    return None


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


def refused(described: Any) -> bool:
    return isinstance(described, tuple) and described[:1] == ("refused",)


def resolve_theirs() -> tuple[Any, Any]:
    from openlineage.client import OpenLineageClient

    try:
        client = OpenLineageClient()
    except Exception as exc:  # its client refuses this configuration
        return ("refused", type(exc).__name__), None
    return theirs(client.transport), client.transport


def resolve_ours() -> tuple[Any, Outbox | None]:
    try:
        outbox = Outbox.from_env(close_at_exit=False)
    except ConfigError as exc:
        return ("refused", str(exc)), None
    return ours(outbox.transport, outbox), outbox


@pytest.mark.parametrize("case", list(ALL_CASES))
def test_openlineage_python_and_from_env_resolve_transports_that_deliver_alike(clean, case, caplog):
    env, yaml_text, expectation = ALL_CASES[case]
    if yaml_text is not None and yaml_text.startswith("@"):
        (clean / yaml_text[1:]).write_text("transport:\n  type: http\n  url: http://custom:5000\n")
    elif yaml_text is not None:
        (clean / "openlineage.yml").write_text(yaml_text)
    os.environ.update({name: value.replace("{tmp}", str(clean)) for name, value in env.items()})
    with caplog.at_level(logging.WARNING):
        expected, their_transport = resolve_theirs()
        mine, outbox = resolve_ours()  # after the client wrote into os.environ
    try:
        if expectation == SAME:
            assert not refused(expected), f"openlineage-python refused it: {expected}"
            assert comparable(mine, expected) == expected
            return
        assert isinstance(expectation, Different)
        assert expectation.reason
        if isinstance(expectation.theirs, dict):  # the retry rule: the list each side retries
            assert their_transport.config.retry["status_forcelist"] == expectation.theirs["status_forcelist"]
            assert outbox is not None
            assert outbox.transport._forcelist == expectation.ours["status_forcelist"]  # None: every 5xx
            return
        if expectation.theirs[0] == "fails every emit":
            assert not refused(expected), expected  # it builds a client...
            error = emit_error(their_transport)
            assert error is not None  # ...that cannot emit
            assert expectation.theirs[1] in error, error
        else:
            assert expected == expectation.theirs
        if isinstance(expectation.ours, Refused):
            assert refused(mine), mine
            assert expectation.ours.text in mine[1], mine[1]
        else:
            assert comparable(mine, expected) == expectation.ours
    finally:
        if outbox is not None:
            outbox.close(0)


def test_an_irrelevant_tls_setting_on_an_http_url_is_named_in_a_warning(clean, caplog):
    os.environ.update({**HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "/nowhere/ca.pem"})
    with caplog.at_level(logging.WARNING, logger="outbox"):
        outbox = Outbox.from_env(close_at_exit=False)
    outbox.close(0)
    assert "OPENLINEAGE__TRANSPORT__VERIFY='/nowhere/ca.pem' has no effect on the http:// URL" in caplog.text


def test_a_string_boolean_is_named_in_a_warning_with_what_it_means(clean, caplog):
    (clean / "openlineage.yml").write_text(COMPOSITE.format(failure="'nope'", success="true"))
    with caplog.at_level(logging.WARNING, logger="outbox"):
        outbox = Outbox.from_env(close_at_exit=False)
    outbox.close(0)
    assert "continue_on_failure in" in caplog.text
    assert "='nope' is a string, which openlineage-python reads as true" in caplog.text


def test_there_are_at_least_60_configurations():
    assert len(ALL_CASES) >= 60
    different = [name for name, (_, _, e) in ALL_CASES.items() if e != SAME]
    assert all(ALL_CASES[name][2].reason for name in different)
