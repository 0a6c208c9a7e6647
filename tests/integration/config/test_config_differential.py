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
import subprocess
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import pytest

from outbox import ConfigError, Outbox
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import (
    CompositeTransport,
    ConsoleTransport,
    FileTransport,
    HttpTransport,
    KafkaTransport,
    OpenLineageTransportAdapter,
)

from support import parts

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
    # -- the five of issue 39 that were left, as each side resolves them (their delivery is
    # -- compared against a real backend below) -------------------------------------------------
    "yaml http verify 'false' (text) on an http URL (irrelevant)": (
        {},
        "transport:\n  type: http\n  url: http://m:5000\n  verify: 'false'\n",
        SAME,
    ),
    "https verify 0 (JSON: read by its truth)": (
        {**HTTPS, "OPENLINEAGE__TRANSPORT__VERIFY": "0"},
        None,
        SAME,
    ),
    "yaml http a CA path that does not exist, on an http URL": (
        {},
        "transport:\n  type: http\n  url: http://m:5000\n  verify: /nonexistent/ca.pem\n",
        SAME,
    ),
    "async_http mTLS files that do not exist, on an http URL (never read)": (
        {**ASYNC, "OPENLINEAGE__TRANSPORT__SSLCONTEXT": '{"clientCertPath": "/nonexistent/c.pem"}'},
        None,
        SAME,
    ),
    "async_http mTLS files that do not exist, on an https URL (never read)": (
        {
            **ASYNC,
            "OPENLINEAGE__TRANSPORT__URL": "https://127.0.0.1:9",
            "OPENLINEAGE__TRANSPORT__SSLCONTEXT": '{"clientCertPath": "/nonexistent/c.pem"}',
        },
        None,
        SAME,
    ),
    "http retry status_forcelist null (no status)": (
        {},
        "transport:\n  type: http\n  url: http://m:5000\n  retry:\n    status_forcelist:\n",
        SAME,
    ),
    "http retry status_forcelist empty": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__RETRY": '{"status_forcelist": []}'},
        None,
        SAME,
    ),
    "http retry status_forcelist with text items (they match no status)": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__RETRY": '{"status_forcelist": ["502", 503]}'},
        None,
        SAME,
    ),
    "http retry status_forcelist 502.0 (a float: matches 502)": (
        {**HTTP, "OPENLINEAGE__TRANSPORT__RETRY__STATUS_FORCELIST": "[502.0, 504]"},
        None,
        SAME,
    ),
    "async_http retry status_forcelist null": (
        {**ASYNC, "OPENLINEAGE__TRANSPORT__RETRY": '{"status_forcelist": null}'},
        None,
        SAME,
    ),
    "yaml composite continue_on_failure 'false' with continue_on_success false (a string: true)": (
        {},
        COMPOSITE.format(failure="'false'", success="false"),
        SAME,
    ),
    "http mTLS files that do not exist, on an http URL": (
        {
            **HTTP,
            "OPENLINEAGE__TRANSPORT__SSLCONTEXT": '{"clientCertPath": "/nonexistent/c.pem", '
            '"clientKeyPath": "/nonexistent/k.pem"}',
        },
        None,
        Different(
            "requests checks a client certificate's files before every request, http:// included, "
            "so every emit of openlineage-python fails; the outbox refuses it at construction",
            theirs=("fails every emit", "Could not find the TLS certificate file"),
            ours=Refused(
                "OPENLINEAGE__TRANSPORT__SSLCONTEXT: clientCertPath='/nonexistent/c.pem' does not exist"
            ),
        ),
    ),
    "https mTLS key that does not exist": (
        {
            **HTTPS,
            "OPENLINEAGE__TRANSPORT__SSLCONTEXT__CLIENTCERTPATH": "{this}",  # a file that exists
            "OPENLINEAGE__TRANSPORT__SSLCONTEXT__CLIENTKEYPATH": "/nonexistent/k.pem",
        },
        None,
        Different(
            "requests checks the key's file before every request, so every emit of openlineage-python "
            "fails; the outbox refuses it at construction",
            theirs=("fails every emit", "Could not find the TLS key file"),
            ours=Refused("clientKeyPath='/nonexistent/k.pem' does not exist"),
        ),
    ),
    "yaml https verify 'false' (text: a CA bundle path)": (
        {},
        "transport:\n  type: http\n  url: https://127.0.0.1:9\n  verify: 'false'\n",
        Different(
            "requests reads the text as the path of a CA bundle, so every emit fails; the outbox "
            "refuses it at construction, saying to write false without quotes",
            theirs=("fails every emit", "Could not find a suitable TLS CA certificate bundle"),
            ours=Refused("='false' is text, not the boolean false"),
        ),
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
            ours=Refused(
                "OPENLINEAGE__TRANSPORT__VERIFY='False' is text, not the boolean false: "
                "openlineage-python (requests) reads text as the path of a CA bundle"
            ),
        ),
    ),
    "https a CA path that does not exist": (
        {**HTTPS, "OPENLINEAGE__TRANSPORT__SSLCONTEXT": '{"caCertPath": "/nonexistent/ca.pem"}'},
        None,
        Different(
            "every emit of openlineage-python fails on the missing bundle; the outbox refuses it at "
            "construction",
            theirs=("fails every emit", "Could not find a suitable TLS CA certificate bundle"),
            ours=Refused(
                "OPENLINEAGE__TRANSPORT__SSLCONTEXT: caCertPath='/nonexistent/ca.pem': there is no "
                "such CA bundle"
            ),
        ),
    ),
    "yaml http timeout '3' (a string)": (
        {},
        "transport:\n  type: http\n  url: https://127.0.0.1:9\n  timeout: '3'\n",
        Different(
            "requests refuses a string timeout on every emit; the outbox at construction",
            theirs=("fails every emit", "Timeout value connect was 3"),
            ours=Refused("openlineage.yml: transport.timeout='3' is not a positive number of seconds"),
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


def matched(forcelist: Any) -> list[int]:
    """The statuses urllib3's Retry retries by ``status_forcelist`` (its own test: ``if
    self.status_forcelist and status in self.status_forcelist``), not the list as written."""
    return [status for status in range(100, 600) if forcelist and status in forcelist]


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
            "default" if forcelist == DEFAULT_RETRY_CONFIG["status_forcelist"] else matched(forcelist)
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
    if parts.buffer(outbox).refusal == "disabled":
        return ("noop",)
    if isinstance(transport, HttpTransport):
        headers = _lower(parts.http_headers(transport))
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
            verify = parts.http_verify(transport)
            described["verify"] = "a CA bundle" if isinstance(verify, ssl.SSLContext) else verify
        forcelist = parts.http_forcelist(transport)
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
    os.environ.update(
        {name: value.replace("{tmp}", str(clean)).replace("{this}", __file__) for name, value in env.items()}
    )
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
            # None: every 5xx
            assert parts.http_forcelist(outbox.transport) == expectation.ours["status_forcelist"]
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
    said = "openlineage.yml: transport.continue_on_failure='nope' is a string, which openlineage-python reads"
    assert said in caplog.text


def test_there_are_at_least_60_configurations():
    assert len(ALL_CASES) + len(DELIVERY) >= 60
    different = [name for name, (_, _, e) in ALL_CASES.items() if e != SAME]
    assert all(ALL_CASES[name][2].reason for name in different)


# -- delivery, against a real backend -------------------------------------------------------
#
# The five configurations issue 39 found left (verify false given as text, a CA file that does
# not exist with an http URL, mTLS files that are missing, retry.status_forcelist, a composite's
# continue_on_failure 'false' as a YAML string), with their variants: each side is built from the
# same environment and emits one event to a real backend on loopback (over TLS, with a CA of the
# test's own, for https).  "Delivers": both deliver.  Refused(text): openlineage-python builds a
# client whose every emit fails, and from_env refuses at construction, saying ``text``.

DELIVERS = "delivers"
URL_HTTP = {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": "{url}"}
URL_ASYNC = {**URL_HTTP, "OPENLINEAGE__TRANSPORT__TYPE": "async_http"}
MTLS_MISSING = '{"clientCertPath": "/nonexistent/c.pem", "clientKeyPath": "/nonexistent/k.pem"}'
FAILING_FIRST = (
    "transport:\n  type: composite\n  continue_on_failure: {failure}\n  transports:\n"
    "    - {{type: http, url: '{{bad}}', name: refusing}}\n"
    "    - {{type: http, url: '{{url}}', name: taking}}\n"
)

DELIVERY: dict[str, tuple[dict[str, str], str | None, bool, Any]] = {
    "verify 'False' (text) on an http URL": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "False"},
        None,
        False,
        DELIVERS,
    ),
    "yaml verify 'false' (text) on an http URL": (
        {},
        "transport:\n  type: http\n  url: '{url}'\n  verify: 'false'\n",
        False,
        DELIVERS,
    ),
    "yaml verify 'false' (text) on an https URL": (
        {},
        "transport:\n  type: http\n  url: '{url}'\n  verify: 'false'\n",
        True,
        Refused("='false' is text, not the boolean false: openlineage-python (requests) reads text as"),
    ),
    "verify 'False' (text) on an https URL": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "False"},
        None,
        True,
        Refused("OPENLINEAGE__TRANSPORT__VERIFY='False' is text, not the boolean false"),
    ),
    "verify false (JSON) on an https URL": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "false"},
        None,
        True,
        DELIVERS,
    ),
    "verify 0 (JSON) on an https URL": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "0"},
        None,
        True,
        DELIVERS,
    ),
    "verify the CA's file on an https URL": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "{ca}"},
        None,
        True,
        DELIVERS,
    ),
    "verify the CA's folder on an https URL": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "{cas}"},
        None,
        True,
        DELIVERS,
    ),
    "verify a CA file that does not exist, on an http URL": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "/nonexistent/ca.pem"},
        None,
        False,
        DELIVERS,
    ),
    "yaml sslContext caCertPath that does not exist, on an http URL": (
        {},
        "transport:\n  type: http\n  url: '{url}'\n  sslContext:\n    caCertPath: /nonexistent/ca.pem\n",
        False,
        DELIVERS,
    ),
    "verify a CA file that does not exist, on an https URL": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__VERIFY": "/nonexistent/ca.pem"},
        None,
        True,
        Refused("OPENLINEAGE__TRANSPORT__VERIFY='/nonexistent/ca.pem': there is no such CA bundle"),
    ),
    "mTLS files that do not exist, on an http URL": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__SSLCONTEXT": MTLS_MISSING},
        None,
        False,
        Refused("OPENLINEAGE__TRANSPORT__SSLCONTEXT: clientCertPath='/nonexistent/c.pem' does not exist"),
    ),
    "mTLS files that do not exist, on an https URL": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__SSLCONTEXT": MTLS_MISSING},
        None,
        True,
        Refused("clientCertPath='/nonexistent/c.pem' does not exist"),
    ),
    "async_http mTLS files that do not exist, on an http URL (it reads no sslContext)": (
        {**URL_ASYNC, "OPENLINEAGE__TRANSPORT__SSLCONTEXT": MTLS_MISSING},
        None,
        False,
        DELIVERS,
    ),
    "retry.status_forcelist [502, 503]": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__RETRY": '{"status_forcelist": [502, 503]}'},
        None,
        False,
        DELIVERS,
    ),
    "yaml retry.status_forcelist null": (
        {},
        "transport:\n  type: http\n  url: '{url}'\n  retry:\n    status_forcelist:\n",
        False,
        DELIVERS,
    ),
    "retry.status_forcelist ['502', 503] (text items)": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__RETRY": '{"status_forcelist": ["502", 503]}'},
        None,
        False,
        DELIVERS,
    ),
    "retry.status_forcelist '502,503' (text, not a list)": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__RETRY__STATUS_FORCELIST": "502,503"},
        None,
        False,
        Refused("status_forcelist='502,503' is not a list: openlineage-python (urllib3) looks each"),
    ),
    "retry.status_forcelist 503 (a number, not a list)": (
        {**URL_HTTP, "OPENLINEAGE__TRANSPORT__RETRY": '{"status_forcelist": 503}'},
        None,
        False,
        Refused("status_forcelist=503 is not a list"),
    ),
    "yaml composite continue_on_failure 'false' (a string: true), its first member refusing": (
        {},
        FAILING_FIRST.format(failure="'false'"),
        False,
        DELIVERS,
    ),
    "yaml composite continue_on_failure false, its first member refusing": (
        {},
        FAILING_FIRST.format(failure="false"),
        False,
        Different(
            "openlineage-python stops at the first member that fails, so the second gets nothing; "
            "the outbox's members are independent, each with its own buffer and worker (backends.md)",
            theirs="fails",
            ours=DELIVERS,
        ),
    ),
}


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A certificate for 127.0.0.1, its own CA (openssl, as operators make one), and its key."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    # The CA as a folder too, named by its subject's hash, as OpenSSL (and requests) read one.
    named = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(cert)], check=True, capture_output=True, text=True
    )
    (folder / "cas").mkdir()
    (folder / "cas" / f"{named.stdout.strip()}.0").write_bytes(cert.read_bytes())
    return cert, key


def backend(tls: tuple[Any, Any] | None, **behaviour: Any) -> Sink:
    context = None
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
    return Sink(behaviour=SinkBehaviour(single_only=True, **behaviour), tls=context)


def emit_theirs(taking: Sink) -> str:
    """openlineage-python's client, built from the environment, emits one event: "delivered",
    or what failed."""
    from openlineage.client import OpenLineageClient

    client = OpenLineageClient()
    try:
        client.emit(ol_event())
    except Exception as exc:  # what its emit raises
        return f"fails: {type(exc).__name__}: {exc}"
    finally:
        client.close(5)  # async_http sends on its own thread: wait for it
    return "delivered" if len(taking.events) == 1 else f"fails: the backend got {len(taking.events)}"


def emit_ours(taking: Sink) -> str:
    try:
        outbox = Outbox.from_env(close_at_exit=False, linger=0)
    except ConfigError as exc:
        return f"refused: {exc}"
    outbox.emit(ol_event())
    report = outbox.close(10)
    return "delivered" if len(taking.events) == 1 else f"not delivered: {report}"


def ol_event() -> Any:
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

    return RunEvent(
        eventType=RunState.START,
        eventTime="2026-12-02T10:00:00+00:00",
        run=Run(runId="00005015-0000-0016-2e04-8a6dbdde4eb9"),
        job=Job(namespace="n", name="j"),
    )


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # verify false
@pytest.mark.parametrize("case", list(DELIVERY))
def test_openlineage_python_and_from_env_deliver_alike_to_a_real_backend(clean, tls_files, case):
    env, yaml_text, https, expectation = DELIVERY[case]
    results = []
    for emit in (emit_theirs, emit_ours):  # each side against a backend of its own
        with backend(tls_files if https else None) as taking, backend(None, fail_status=400) as bad:
            places = {"{url}": taking.url.replace("http://", "https://" if https else "http://")}
            places.update({"{ca}": str(tls_files[0]), "{cas}": str(tls_files[0].parent / "cas")})
            places["{bad}"] = bad.url

            def fill(text: str, places: dict[str, str] = places) -> str:
                for name, value in places.items():
                    text = text.replace(name, value)
                return text

            saved = dict(os.environ)
            os.environ.update({name: fill(value) for name, value in env.items()})
            if yaml_text is not None:
                (clean / "openlineage.yml").write_text(fill(yaml_text))
            try:
                results.append(emit(taking))
            finally:
                os.environ.clear()
                os.environ.update(saved)
    theirs_did, ours_did = results
    if expectation == DELIVERS:
        assert (theirs_did, ours_did) == ("delivered", "delivered")
    elif isinstance(expectation, Refused):
        assert theirs_did.startswith("fails: "), theirs_did  # it builds a client that cannot emit
        assert ours_did.startswith("refused: "), ours_did  # refused at construction, in words
        assert expectation.text in ours_did, ours_did
    else:
        assert isinstance(expectation, Different)
        assert expectation.reason
        assert theirs_did.startswith(expectation.theirs), theirs_did
        assert expectation.ours == DELIVERS
        assert ours_did == "delivered", ours_did


def test_the_http_transport_built_directly_reads_tls_files_as_openlineage_python_does(tls_files):
    """HttpTransport(...) as openlineage-python's HttpTransport(HttpConfig(...)): a CA bundle that
    does not exist is no matter on an http:// URL (both deliver); client certificate files that
    do not exist are (every emit of theirs fails; ours is refused at construction)."""
    from openlineage.client.transport.http import HttpConfig
    from openlineage.client.transport.http import HttpTransport as TheirHttp

    with backend(None) as sink:
        TheirHttp(HttpConfig(url=sink.url, verify="/nonexistent/ca.pem")).emit(ol_event())
        with Outbox(HttpTransport(sink.url, verify="/nonexistent/ca.pem"), close_at_exit=False) as outbox:
            outbox.emit(ol_event())
        assert len(sink.events) == 2
        theirs_config = HttpConfig.from_dict(
            {"url": sink.url, "sslContext": {"clientCertPath": "/nonexistent/c.pem"}}
        )
        with pytest.raises(OSError, match="Could not find the TLS certificate file"):
            TheirHttp(theirs_config).emit(ol_event())
        with pytest.raises(ConfigError, match=r"client_cert='/nonexistent/c.pem' does not exist"):
            HttpTransport(sink.url, client_cert="/nonexistent/c.pem")
        with pytest.raises(ConfigError, match=r"verify='False' is text, not the boolean false"):
            HttpTransport(sink.url.replace("http:", "https:"), verify="False")
