"""``outbox check``: is this environment's lineage configuration right, and is its backend there?

Resolves the configuration exactly as ``Outbox.from_env()`` does, prints the transport and the
outbox's settings (secrets redacted), then reaches the backend once without writing lineage:

- HTTP: a TCP connection, the TLS handshake (for ``https``), and the answer of the configured
  single-event endpoint to an empty event ``{}``, which every lineage backend refuses (Marquez
  answers 422), so nothing is written;
- Kafka: the brokers' metadata, and the topic's partitions in it (no record is produced).

One line per check; the exit status is 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

import httpx

from .. import ConfigError, Outbox
from .._config import resolve_transport_config
from ..transports import CompositeTransport, FileTransport, HttpTransport, KafkaTransport
from ..transports.http import _environment_proxy, redact_url

__all__ = ["Check", "check_transport", "run"]

# Answers of a lineage endpoint to an event it cannot take: it is there, and it read the body.
_REFUSES_EVENT = frozenset({400, 415, 422})
# Answers that say the credentials are wrong or missing.
_AUTH = frozenset({401, 403, 407})


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.name:<10} {self.detail}"


async def check_transport(transport: Any, timeout: float, prefix: str = "") -> list[Check]:
    """The checks of one transport (each member of a composite in turn)."""
    if isinstance(transport, HttpTransport):
        return await _check_http(transport, timeout, prefix)
    if isinstance(transport, KafkaTransport):
        return await _check_kafka(transport, timeout, prefix)
    if isinstance(transport, CompositeTransport):
        checks: list[Check] = []
        for name, member in transport.members.items():
            checks += await check_transport(member, timeout, f"{prefix}{name}/")
        return checks
    if isinstance(transport, FileTransport):
        return [_check_file(transport, prefix)]
    return [Check(f"{prefix}reach", True, f"{transport!r}: nothing to reach")]


def _failure(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


async def _check_http(transport: HttpTransport, timeout: float, prefix: str) -> list[Check]:
    url = urlsplit(transport.single_url)
    secure = url.scheme == "https"
    host, port = url.hostname or "", url.port or (443 if secure else 80)
    proxy = _environment_proxy(transport.url)
    checks: list[Check] = []
    # 1. A TCP connection (to the proxy, when the environment names one for this URL).
    target = urlsplit(proxy) if proxy else None
    connect_host = (target.hostname or "") if target else host
    connect_port = (target.port or 80) if target else port
    where = f"{connect_host}:{connect_port}" + (f" (the proxy {redact_url(proxy)})" if proxy else "")
    started = time.monotonic()
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(connect_host, connect_port), timeout)
    except (OSError, TimeoutError) as exc:
        detail = f"cannot connect to {where} for {redact_url(transport.single_url)}: {_failure(exc)}"
        return [Check(f"{prefix}connect", False, detail)]
    writer.close()
    checks.append(Check(f"{prefix}connect", True, f"{where} in {(time.monotonic() - started) * 1000:.1f} ms"))
    # 2. TLS, as the transport verifies it (its CA bundle, client certificate, verify=false).
    if secure and not proxy:
        verify = transport._verify
        context = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
        if verify is False:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=context, server_hostname=host), timeout
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            hint = (
                "; give the CA bundle in OPENLINEAGE__TRANSPORT__VERIFY" if "CERTIFICATE" in str(exc) else ""
            )
            checks.append(Check(f"{prefix}tls", False, f"{host}:{port}: {_failure(exc)}{hint}"))
            return checks
        tls_object = writer.get_extra_info("ssl_object")
        version = tls_object.version() if tls_object is not None else "TLS"
        writer.close()
        verified = (
            "certificate verified" if verify is not False else "certificate NOT verified (verify=false)"
        )
        checks.append(Check(f"{prefix}tls", True, f"{version}, {verified} for {host}"))
    # 3. An answer from the endpoint the events go to, to an event it must refuse.
    checks.append(await _check_answer(transport, timeout, prefix))
    return checks


async def _check_answer(transport: HttpTransport, timeout: float, prefix: str) -> Check:
    name, endpoint = f"{prefix}answer", redact_url(transport.single_url)
    answer = await transport._post(transport.single_url, b"{}", time.monotonic() + timeout + 0.1)
    if not isinstance(answer, httpx.Response):  # an Outcome: the request failed
        return Check(name, False, f"POST {endpoint}: {answer.detail or answer.reason}")
    status = answer.status_code
    said = f"POST {endpoint} {{}}: {status}"
    if status in _REFUSES_EVENT:
        return Check(name, True, f"{said}, the empty event refused (nothing written)")
    if 200 <= status < 300:
        return Check(name, True, f"{said}: it took an empty event (a collector that does not validate)")
    if status in _AUTH:
        return Check(
            name, False, f"{said}: the credentials were refused; check OPENLINEAGE_API_KEY or transport.auth"
        )
    if status in (404, 405):
        return Check(
            name, False, f"{said}: no lineage endpoint there; check OPENLINEAGE_URL and OPENLINEAGE_ENDPOINT"
        )
    if 300 <= status < 400:
        location = redact_url(answer.headers.get("location", "?"))
        return Check(name, False, f"{said}: redirected to {location}; configure the URL it names")
    if status == 500:
        # Marquez and DataHub answer 500 to an event they cannot map: the endpoint is there.
        return Check(name, True, f"{said}, the empty event refused as unmappable (nothing written)")
    return Check(name, False, f"{said}: the backend is not taking events ({transport._snippet(answer)})")


def _check_file(transport: FileTransport, prefix: str) -> Check:
    import os

    folder = os.path.dirname(os.path.abspath(transport.log_file_path))
    if os.access(folder, os.W_OK):
        return Check(f"{prefix}file", True, f"{transport.log_file_path}: its folder is writable")
    return Check(f"{prefix}file", False, f"{transport.log_file_path}: cannot write in {folder}")


# AIOKafkaClient's keywords among the producer's settings (security, timeouts, identity).
_CLIENT_KEYS = (
    "bootstrap_servers",
    "client_id",
    "request_timeout_ms",
    "retry_backoff_ms",
    "metadata_max_age_ms",
    "security_protocol",
    "ssl_context",
    "connections_max_idle_ms",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "sasl_kerberos_service_name",
    "sasl_kerberos_domain_name",
    "sasl_oauth_token_provider",
)


async def _check_kafka(transport: KafkaTransport, timeout: float, prefix: str) -> list[Check]:
    import logging

    from aiokafka.client import AIOKafkaClient
    from aiokafka.errors import KafkaError

    # aiokafka logs an ERROR per failed connection; the check's own line says it once.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    settings = {k: v for k, v in transport._settings.items() if k in _CLIENT_KEYS}
    servers = transport._servers
    client = AIOKafkaClient(**settings)
    try:
        try:
            await asyncio.wait_for(client.bootstrap(), timeout)
            metadata = await asyncio.wait_for(client.fetch_all_metadata(), timeout)
        except (KafkaError, OSError, TimeoutError) as exc:
            return [Check(f"{prefix}brokers", False, f"cannot reach the brokers {servers}: {_failure(exc)}")]
        brokers = sorted(f"{b.host}:{b.port}" for b in metadata.brokers())
        checks = [Check(f"{prefix}brokers", True, f"{servers} answered: {len(brokers)} broker(s) {brokers}")]
        partitions = metadata.partitions_for_topic(transport.topic)
        if not partitions:
            checks.append(
                Check(
                    f"{prefix}topic",
                    False,
                    f"the topic {transport.topic!r} does not exist on {servers}; create it (or let the "
                    "brokers create topics: auto.create.topics.enable)",
                )
            )
        else:
            checks.append(
                Check(f"{prefix}topic", True, f"{transport.topic!r}: {len(partitions)} partition(s)")
            )
        return checks
    finally:
        await client.close()


def _settings_lines(outbox: Outbox, origins: Mapping[str, str]) -> list[str]:
    import textwrap

    parts = []
    for key, value in outbox._effective_settings().items():
        origin = f" ({origins[key]})" if key in origins else ""
        parts.append(f"{key}={value}{origin}")
    return textwrap.wrap(", ".join(parts), 88, initial_indent="settings    ", subsequent_indent=" " * 12)


def run(environ: Mapping[str, str], timeout: float = 5.0, out: TextIO | None = None) -> int:
    """Check the configuration ``environ`` gives; print to ``out``; 0 when all checks pass."""
    from .._config import outbox_settings
    from ..transports import transport_from_config

    stream = out or sys.stdout

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    try:
        outbox = Outbox.from_env(environ, close_at_exit=False)
    except ConfigError as exc:
        say(Check("config", False, str(exc)).line())
        return 1
    try:
        resolved = resolve_transport_config(environ)
        if resolved.disabled:
            say(
                Check(
                    "config", True, "OPENLINEAGE_DISABLED=true: events are refused, counted as disabled"
                ).line()
            )
            return 0
        origin = resolved.origins.get("type") or resolved.origins.get("url") or "the configuration"
        say(f"transport   {outbox._transport!r} (from {origin})")
        for line in _settings_lines(outbox, outbox_settings(environ)[1]):
            say(line)
        config = Check("config", True, "resolved as Outbox.from_env() resolves it")
        say(config.line())
    finally:
        outbox.close(0)
    # A transport of our own for the probe: the outbox's belongs to its sidecar's loop.
    transport = transport_from_config(resolved)

    async def probe() -> list[Check]:
        try:
            return await check_transport(transport, timeout)
        finally:
            await transport.aclose()

    probed = asyncio.run(probe())
    for check in probed:
        say(check.line())
    checks = [config, *probed]
    failed = [c for c in checks if not c.ok]
    summary = f"{len(checks) - len(failed)} of {len(checks)} checks passed"
    say(summary + (f"; failed: {', '.join(c.name for c in failed)}" if failed else ""))
    return 1 if failed else 0
