"""``outbox check``: is this environment's lineage configuration right, and is its backend there?

Resolves the configuration exactly as ``Outbox.from_env()`` does, prints the transport and the
outbox's settings (secrets redacted), then reaches the backend once without writing lineage:

- HTTP: a TCP connection, the TLS handshake (for ``https``), and the answer of the configured
  single-event endpoint to an empty event ``{}``, which every lineage backend refuses (Marquez
  answers 422), so nothing is written;
- Kafka: the brokers' metadata, and the topic's partitions in it (no record is produced).

Nothing configured (the console fallback) fails, naming what to set.  A backend with needs of its
own (DataHub: an orchestrator in every event; OpenMetadata: COMPLETE events with inputs and
outputs) is judged by them on a sample of the pipeline's events (``--events FILE``), which is read
here and never sent; without a sample that check fails, saying what the backend needs.

One line per check; a probe still waiting after half a second says what it waits for; the exit
status is 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar
from urllib.parse import urlsplit

from .. import ConfigError, Outbox
from .. import _toolkit as toolkit
from .._toolkit import ResolvedTransport, environment_proxy, redact_url, resolve_transport_config
from ..transports import (
    CompositeTransport,
    ConsoleTransport,
    FileTransport,
    HttpTransport,
    KafkaTransport,
    OpenLineageTransportAdapter,
    Outcome,
)
from ._needs import datahub_refusal, judged, openmetadata_verdict, read_sample

__all__ = ["Check", "check_transport", "datahub_refusal", "openmetadata_verdict", "run"]

T = TypeVar("T")
Say = Callable[[str], None]
#: A probe still waiting after this many seconds says what it waits for.
QUIET = 0.5

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


async def check_transport(
    transport: Any,
    timeout: float,
    prefix: str = "",
    say: Say | None = None,
    events: Sequence[Any] | str | None = None,
) -> list[Check]:
    """The checks of one transport (each member of a composite in turn).

    ``say`` gets each check's line as soon as it is decided, and a line when a probe is still
    waiting after :data:`QUIET` seconds, in the order they happen (a probe's "waiting" line
    after the lines of the checks before it); ``events`` is a sample of the pipeline's events
    (or why it could not be read), judged against what the backend needs."""
    say = say or (lambda line: None)
    if isinstance(transport, HttpTransport):
        return await _check_http(transport, timeout, prefix, say, events)
    if isinstance(transport, KafkaTransport):
        return [_said(check, say) for check in await _check_kafka(transport, timeout, prefix, say)]
    if isinstance(transport, CompositeTransport):
        checks: list[Check] = []
        for name, member in transport.members.items():
            checks += await check_transport(member, timeout, f"{prefix}{name}/", say, events)
        return checks
    return [_said(_check_local(transport, prefix), say)]


def _check_local(transport: Any, prefix: str) -> Check:
    """The one check of a transport with nothing to probe over the network."""
    if isinstance(transport, FileTransport):
        return _check_file(transport, prefix)
    if isinstance(transport, ConsoleTransport):
        return Check(f"{prefix}reach", True, f"{transport!r}: events are printed to standard output")
    if isinstance(transport, OpenLineageTransportAdapter):
        # openlineage-python's own transport (datadog, a custom class, ...): it was built, and
        # check has no way to reach its backend without sending an event through it.
        return Check(
            f"{prefix}reach",
            True,
            f"{transport!r} was built; its backend is NOT reached by check (openlineage-python's "
            "transport has no probe that writes nothing): send one event and look for it there",
        )
    return Check(f"{prefix}reach", True, f"{transport!r}: nothing to reach")


def _said(check: Check, say: Say) -> Check:
    """``check``, its line said."""
    say(check.line())
    return check


async def _waiting(probe: Awaitable[T], what: str, timeout: float, say: Say) -> T:
    """``probe``'s result; if it has not answered within :data:`QUIET` seconds, one line says
    what it waits for and for how long at most (``timeout`` bounds the probe itself)."""
    task = asyncio.ensure_future(probe)
    done, _ = await asyncio.wait({task}, timeout=QUIET)
    if not done:
        say(f"...   waiting up to {timeout:g} s for {what}")
    return await task


def _failure(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


async def _check_http(
    transport: HttpTransport, timeout: float, prefix: str, say: Say, events: Sequence[Any] | str | None
) -> list[Check]:
    url = urlsplit(transport.single_url)
    secure = url.scheme == "https"
    host, port = url.hostname or "", url.port or (443 if secure else 80)
    proxy = environment_proxy(transport.url)
    # 1. A TCP connection (to the proxy, when the environment names one for this URL).
    connect = _said(await _check_connect(transport, proxy, host, port, timeout, prefix, say), say)
    checks = [connect]
    if not connect.ok:
        return checks
    # 2. TLS, as the transport verifies it (its CA bundle, client certificate, verify=false).
    if secure and not proxy:
        tls = _said(await _check_tls(transport, host, port, timeout, prefix, say), say)
        checks.append(tls)
        if not tls.ok:
            return checks
    # 3. An answer from the endpoint the events go to, to an event it must refuse.
    answer = _said(await _check_answer(transport, timeout, prefix, say), say)
    checks.append(answer)
    if answer.ok and transport.mode == "batch":  # (auto falls back to one event per request)
        checks.append(_said(await _check_batch(transport, timeout, prefix, say), say))
    # 4. The events, judged by what this backend needs (when it has needs of its own).
    if answer.ok:
        judged = _check_events(transport, prefix, events)
        if judged is not None:
            checks.append(_said(judged, say))
    return checks


async def _check_connect(
    transport: HttpTransport, proxy: str | None, host: str, port: int, timeout: float, prefix: str, say: Say
) -> Check:
    target = urlsplit(proxy) if proxy else None
    connect_host = (target.hostname or "") if target else host
    connect_port = (target.port or 80) if target else port
    where = f"{connect_host}:{connect_port}" + (f" (the proxy {redact_url(proxy)})" if proxy else "")
    started = time.monotonic()
    try:
        _, writer = await _waiting(
            asyncio.wait_for(asyncio.open_connection(connect_host, connect_port), timeout),
            f"{where} to accept a connection",
            timeout,
            say,
        )
    except (OSError, TimeoutError) as exc:
        detail = f"cannot connect to {where} for {redact_url(transport.single_url)}: {_failure(exc)}"
        return Check(f"{prefix}connect", False, detail)
    writer.close()
    return Check(f"{prefix}connect", True, f"{where} in {(time.monotonic() - started) * 1000:.1f} ms")


async def _check_tls(
    transport: HttpTransport, host: str, port: int, timeout: float, prefix: str, say: Say
) -> Check:
    verify = transport._verify
    context = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
    if verify is False:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await _waiting(
            asyncio.wait_for(asyncio.open_connection(host, port, ssl=context, server_hostname=host), timeout),
            f"the TLS handshake with {host}:{port}",
            timeout,
            say,
        )
    except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
        hint = "; give the CA bundle in OPENLINEAGE__TRANSPORT__VERIFY" if "CERTIFICATE" in str(exc) else ""
        return Check(f"{prefix}tls", False, f"{host}:{port}: {_failure(exc)}{hint}")
    tls_object = writer.get_extra_info("ssl_object")
    version = tls_object.version() if tls_object is not None else "TLS"
    writer.close()
    verified = "certificate verified" if verify is not False else "certificate NOT verified (verify=false)"
    return Check(f"{prefix}tls", True, f"{version}, {verified} for {host}")


async def _post_once(
    transport: HttpTransport, url: str, body: bytes, timeout: float, say: Say
) -> tuple[str, Any]:
    """POST ``body`` to ``url`` once (saying what it waits for, if it waits): the URL as it may
    be shown, and the answer, or the Outcome of a request that failed."""
    endpoint = redact_url(url)
    post = transport._post(url, body, time.monotonic() + timeout + 0.1)
    return endpoint, await _waiting(post, f"the answer of POST {endpoint}", timeout, say)


async def _check_answer(transport: HttpTransport, timeout: float, prefix: str, say: Say) -> Check:
    name = f"{prefix}answer"
    endpoint, answer = await _post_once(transport, transport.single_url, b"{}", timeout, say)
    if isinstance(answer, Outcome):  # the request failed
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


async def _check_batch(transport: HttpTransport, timeout: float, prefix: str, say: Say) -> Check:
    """``mode=batch`` sends every event to the batch endpoint: one that is not there (Marquez
    has none) loses them all, however well the single endpoint answers."""
    name = f"{prefix}batch"
    endpoint, answer = await _post_once(transport, transport.batch_url, b"[]", timeout, say)
    if isinstance(answer, Outcome):
        return Check(name, False, f"POST {endpoint}: {answer.detail or answer.reason}")
    said = f"POST {endpoint} []: {answer.status_code}"
    if answer.status_code in (404, 405):
        fix = "set OPENLINEAGE__TRANSPORT__MODE=auto (or single), or OPENLINEAGE__TRANSPORT__BATCH_ENDPOINT"
        return Check(
            name, False, f"{said}: no batch endpoint there, and mode=batch sends every event to it; {fix}"
        )
    return Check(name, True, f"{said}, a batch endpoint is there")


# -- what a backend needs of the events (``_needs``) -------------------------------------------


def _check_events(transport: HttpTransport, prefix: str, events: Sequence[Any] | str | None) -> Check | None:
    verdict = judged(transport, events)
    return None if verdict is None else Check(f"{prefix}events", *verdict)


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


async def _check_kafka(transport: KafkaTransport, timeout: float, prefix: str, say: Say) -> list[Check]:
    from aiokafka.client import AIOKafkaClient
    from aiokafka.errors import KafkaError

    # aiokafka logs an ERROR per failed connection; the check's own line says it once.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    settings = {k: v for k, v in transport._settings.items() if k in _CLIENT_KEYS}
    servers = transport._servers
    client = AIOKafkaClient(**settings)
    try:
        try:
            bootstrap = asyncio.wait_for(client.bootstrap(), timeout)
            await _waiting(bootstrap, f"the brokers {servers} to answer", timeout, say)
            metadata = await _waiting(
                asyncio.wait_for(client.fetch_all_metadata(), timeout),
                f"the metadata of {servers}",
                timeout,
                say,
            )
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


def settings_in_force(outbox: Outbox, configured: Mapping[str, Any]) -> dict[str, Any]:
    """Every ``Outbox`` keyword with the value in force: what the built outbox holds, and for a
    keyword it keeps nowhere readable (``close_at_exit``, which check overrides for itself) what
    the environment set (``configured``), else the default."""
    held = toolkit.settings_in_force(outbox)
    values: dict[str, Any] = {}
    for keyword, parameter in inspect.signature(Outbox).parameters.items():
        if keyword == "transport":
            continue
        if keyword in held:
            values[keyword] = held[keyword]
        else:
            values[keyword] = configured.get(keyword, parameter.default)
    return values


def _settings_lines(settings: Mapping[str, Any], origins: Mapping[str, str]) -> list[str]:
    import textwrap

    parts = []
    for key, value in settings.items():
        origin = f" ({origins[key]})" if key in origins else ""
        parts.append(f"{key}={value}{origin}")
    return textwrap.wrap(
        ", ".join(parts),
        88,
        initial_indent="settings    ",
        subsequent_indent=" " * 12,
        break_long_words=False,
        break_on_hyphens=False,
    )


_NOTHING_CONFIGURED = (
    "no lineage backend is configured (events would go to the console): set OPENLINEAGE_URL (e.g. "
    "http://marquez:5000), or OPENLINEAGE__TRANSPORT__TYPE and its settings, or an openlineage.yml; "
    "OPENLINEAGE__TRANSPORT__TYPE=console prints them on purpose"
)


class _QuietConsoleFallback(logging.Filter):
    """Drops the library's "no transport is configured" warning: check says it, as a failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("no OpenLineage transport is configured")


def run(
    environ: Mapping[str, str],
    timeout: float = 5.0,
    out: TextIO | None = None,
    events_file: str | None = None,
) -> int:
    """Check the configuration ``environ`` gives; print to ``out``; 0 when all checks pass.
    ``events_file``: a sample of the pipeline's events, judged by what the backend needs."""
    from ..transports import transport_from_config

    stream = out or sys.stdout

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    opened = _open(environ, say)
    if opened is None:
        return 1
    outbox, resolved = opened
    try:
        if resolved.disabled:
            say(
                Check(
                    "config", True, "OPENLINEAGE_DISABLED=true: events are refused, counted as disabled"
                ).line()
            )
            return 0
        config = _config_check(outbox, resolved, environ, say)
    finally:
        outbox.close(0)
    if not config.ok:
        say(f"0 of 1 checks passed; failed: {config.name}")
        return 1
    spill = _check_spill(environ)
    if spill is not None:
        say(spill.line())
    events = read_sample(events_file) if events_file is not None else None
    # A transport of our own for the probe: the outbox's belongs to its sidecar's loop.
    transport = transport_from_config(resolved)

    async def probe() -> list[Check]:
        try:
            return await check_transport(transport, timeout, say=say, events=events)
        finally:
            await transport.aclose()

    probed = asyncio.run(probe())  # (each check said as it was decided)
    checks = [config, *([spill] if spill is not None else []), *probed]
    failed = [c for c in checks if not c.ok]
    summary = f"{len(checks) - len(failed)} of {len(checks)} checks passed"
    say(summary + (f"; failed: {', '.join(c.name for c in failed)}" if failed else ""))
    return 1 if failed else 0


def _open(environ: Mapping[str, str], say: Callable[[str], None]) -> tuple[Outbox, ResolvedTransport] | None:
    """The outbox ``environ`` configures and its resolved transport config; None (said) when
    the configuration is invalid.  The console fallback's own warning is kept quiet: the
    config check says it."""
    from .._toolkit import logger

    quiet = _QuietConsoleFallback()
    logger.addFilter(quiet)
    try:
        try:
            # Without the spill: check must not adopt (and then hold) a dead process's events.
            outbox = Outbox.from_env(environ, close_at_exit=False, spill_dir=None)
        except ConfigError as exc:
            say(Check("config", False, str(exc)).line())
            return None
        try:
            resolved = resolve_transport_config(environ)
        except ConfigError as exc:  # pragma: no cover - from_env resolved the same a moment ago
            outbox.close(0)
            say(Check("config", False, str(exc)).line())
            return None
    finally:
        logger.removeFilter(quiet)
    return outbox, resolved


def _check_spill(environ: Mapping[str, str]) -> Check | None:
    """The spill directory's state (writable, size, owners, oldest event), when one is set."""
    from .._toolkit import inspect_dir, outbox_settings

    configured, _ = outbox_settings(environ)
    directory = configured.get("spill_dir")
    if not directory:
        return None
    try:
        state = inspect_dir(directory)
    except OSError as exc:
        return Check(
            "spill", False, f"{directory}: cannot be read ({exc}); pass a readable, writable directory"
        )
    if what := state.get("not_a_directory"):
        return Check(
            "spill", False, f"{directory}: it is {what}, not a directory; pass a directory (made if missing)"
        )
    if (problem := _unwritable(directory)) is not None:
        return Check("spill", False, f"{directory}: {problem}; pass a writable directory on local disk")
    if not state["exists"]:
        return Check("spill", True, f"{directory}: does not exist yet (made at start)")
    age = state["oldest_event_age"]
    oldest = "none" if age is None else f"{age:.0f} s old"
    unknown = state.get("owners_unknown", 0)  # (this process out of file descriptors)
    return Check(
        "spill",
        True,
        f"{directory}: writable, {state['bytes']} bytes in {state['segments']} segment(s), "
        f"{state['owners_alive']} live and {state['owners_gone']} gone process(es)"
        + (f" and {unknown} this process could not look at" if unknown else "")
        + f", oldest event {oldest}",
    )


def _unwritable(directory: str) -> str | None:
    """Why an outbox could not write in ``directory`` (or make it), tried as it would be: a file
    made there and removed (or, if it is missing, its first missing folder made and removed).
    ``os.access`` says yes to root on a read-only filesystem, or under ``/proc``."""
    import os
    import tempfile

    path = os.path.abspath(directory)
    while not os.path.exists(os.path.dirname(path)) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        if os.path.isdir(path):
            os.close((made := tempfile.mkstemp(prefix=".outbox-check-", dir=path))[0])
            os.unlink(made[1])
        else:
            os.mkdir(path)
            os.rmdir(path)
    except OSError as exc:
        return f"cannot be {'written' if os.path.isdir(path) else 'made'} ({exc.strerror or exc})"
    return None


def _config_check(
    outbox: Outbox, resolved: ResolvedTransport, environ: Mapping[str, str], say: Callable[[str], None]
) -> Check:
    """Say the transport and every setting in force; the config check (failed when nothing
    is configured)."""
    from .._toolkit import outbox_settings

    origin = resolved.origins.get("type") or resolved.origins.get("url") or "the configuration"
    say(f"transport   {outbox.transport!r} (from {origin})")
    configured, origins = outbox_settings(environ)
    for line in _settings_lines(settings_in_force(outbox, configured), origins):
        say(line)
    if resolved.origins.get("type") == "the default":
        config = Check("config", False, _NOTHING_CONFIGURED)
    else:
        config = Check("config", True, "resolved as Outbox.from_env() resolves it")
    say(config.line())
    return config
