"""The HTTP transport: OpenLineage's ``/lineage`` and ``/lineage/batch`` endpoints over httpx.

Modes:

* ``single``: one event per POST to ``endpoint`` (what Marquez serves), up to
  ``max_concurrent_requests`` at once, each run's events one after another.
* ``batch``: a JSON array per POST to ``batch_endpoint`` (the OpenLineage 2.0.2 spec,
  DataHub), or ``{"events": [...]}`` with ``batch_format="openmetadata"``.
* ``auto`` (default): batch; if the batch endpoint answers 404, 405 or 501, switch to
  single for good, resend that batch's events singly, and say so once in the log.

What each answer means for the events (the worker retries RETRY with backoff):

==========================  ==================================================================
2xx                         delivered (a batch's ``partial_success`` body is read per event)
400, 422                    that event rejected (``rejected_by_backend``); a batch without a
                            per-event body is bisected to find the bad events
413                         a batch is split; a single event still too large: ``too_large``
408, 429, 5xx, network      RETRY, honouring ``Retry-After`` (seconds or an HTTP date)
401, 403, 404, 405, 407,    on the single endpoint: RETRY, and an error naming the URL (and
301, 302, 303, 307, 308     a redirect's Location), since
                            it is a misconfiguration, not a reason to drop lineage
==========================  ==================================================================
"""

from __future__ import annotations

import asyncio
import base64
import copy
import difflib
import email.utils
import gzip
import logging
import re
import socket
import ssl
import time
import urllib.request
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

import httpx
import orjson

from .._config import ResolvedTransport, tls_context, warn_once
from .._errors import ConfigError
from .._log import RateLimitedLog, logger
from ._base import DELIVERED, About, Outcome, OutcomeKind, SerializedEvent

__all__ = ["MAX_ANSWER_BYTES", "HttpTransport", "datahub_unsafe_dataset", "parse_retry_after", "redact_url"]

Mode = Literal["single", "batch", "auto"]
BatchFormat = Literal["array", "openmetadata"]
_MODES = ("single", "batch", "auto")
_FORMATS = ("array", "openmetadata")
_BATCH_UNSUPPORTED = frozenset({404, 405, 501})
# Answers that say the configuration is wrong, not the events: keep them, back off, say so.
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MISCONFIGURED = frozenset({401, 403, 404, 405, 407}) | _REDIRECTS
_USER_AGENT = "lineage-outbox/0.1.0"
_SEND_BUFFER = 4 * 1024 * 1024
_DEADLINE_MARGIN = 0.05
_SINGLE_SLICE = 1.0
#: The most of an answer's body the transport reads (the rest is never read).
MAX_ANSWER_BYTES = 1024 * 1024
# RETRY reasons that mean every request would fail alike (unreachable, misconfigured).
_STOP_REASONS = frozenset({"network", "timeout", "token"} | {f"http_{status}" for status in _MISCONFIGURED})
# RFC 9110's token: what a header name may hold.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Custom headers whose values are credentials (redacted wherever a backend may echo them).
_CREDENTIAL_HEADER = re.compile(r"auth|key|token|secret|passw|cookie|credential|session", re.I)
# The user information of any URL in a text (a token endpoint's, in its provider's error).
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s:@]*):[^/\s@]*@")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date.

    Returns None for a missing or unreadable value, and never less than 0.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = datetime.now(UTC).timestamp() if now is None else now
    return max(0.0, when.timestamp() - current)


def redact_url(url: str) -> str:
    """The URL without a password (``http://user:***@host/``), for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _redact_userinfo(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def _header_problem(value: str, *, tabs: bool = True) -> str | None:
    """What keeps ``value`` out of an HTTP header as httpx sends it (ASCII only, no control
    character), or None.  Never quotes the value."""
    if any((ord(c) < 32 and not (tabs and c == "\t")) or ord(c) == 127 for c in value):
        return "a control character (a line break inside the value?)"
    if not value.isascii():
        return (
            "a character an HTTP header cannot carry (a letter outside ASCII, such as é, or a "
            "non-breaking space)"
        )
    return None


def _secret_text(name: str, value: str | None, *, header: bool = False) -> str | None:
    """A credential as it will be sent: surrounding whitespace stripped (mounted secrets often
    end in a newline), control characters refused, and with ``header`` (sent as it is in a
    header) anything outside ASCII too.  The value itself is never quoted."""
    if value is None:
        return None
    value = value.strip()
    problem = _header_problem(value, tabs=False)
    if problem is not None and (header or problem.startswith("a control")):
        raise ConfigError(
            f"{name} contains {problem}; fix the secret it is read from (the value is not shown)"
        )
    return value or None


def _check_headers(headers: Mapping[str, str], named: str) -> None:
    """Every custom header's name and value as HTTP can carry them; a ConfigError naming the
    setting (``named``) and the header, never the value."""
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise ConfigError(
                f"{named}: {name!r} is not an HTTP header name; use letters, digits and '-' "
                "(such as X-Api-Key)"
            )
        if not isinstance(value, str):
            raise ConfigError(f"{named}: the value of the header {name!r} must be a string")
        problem = _header_problem(value)
        if problem is not None:
            raise ConfigError(
                f"{named}: the value of the header {name!r} contains {problem}; fix it "
                "(the value is not shown)"
            )


def _provider_secrets(provider: Any) -> list[str]:
    """The credentials a token provider holds (openlineage-python's keep them as attributes),
    so that its errors reach the log without them."""
    found = []
    for attribute in ("api_key", "client_secret", "password", "secret", "token"):
        value = getattr(provider, attribute, None)
        if isinstance(value, str) and len(value) >= 4:
            found.append(value)
    endpoint = getattr(provider, "token_endpoint", None)
    if isinstance(endpoint, str):
        password = urlsplit(endpoint).password
        if password:
            found += [password, unquote(password)]
    return found


class _RedactingFilter(logging.Filter):
    """On openlineage-python's HTTP logger, whose token providers log their failures quoting
    the token endpoint's URL as configured: each record's text without URL passwords or the
    credentials of the providers built here."""

    secrets: ClassVar[set[str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        redacted = _redact_userinfo(text)
        for secret in sorted(self.secrets, key=len, reverse=True):
            redacted = redacted.replace(secret, "***")
        if redacted != text:
            record.msg, record.args = redacted, None
        return True


_OPENLINEAGE_FILTER = _RedactingFilter()


class _NoBearer(Exception):
    """The token provider failed, or gave a token no header can carry; the message names the
    provider and holds no credential (safe to log)."""


class HttpTransport:
    """Ships events to an OpenLineage HTTP backend (Marquez, OpenMetadata, DataHub, ...).

    Example (OpenMetadata)::

        HttpTransport(
            "http://openmetadata:8585",
            endpoint="api/v1/openlineage/lineage",
            batch_endpoint="api/v1/openlineage/lineage/batch",
            batch_format="openmetadata",
            api_key=os.environ["OPENMETADATA_JWT"],
        )

    Args:
        url: the backend's base URL; ``endpoint`` and ``batch_endpoint`` are joined to it
            as openlineage-python joins them (``urllib.parse.urljoin``).
        endpoint: the single-event path (default ``api/v1/lineage``).
        batch_endpoint: the batch path (default ``api/v1/lineage/batch``).
        mode: ``auto`` (default), ``batch`` or ``single``.
        batch_format: ``array`` (the spec, DataHub) or ``openmetadata``.
        api_key: sent as ``Authorization: Bearer <api_key>``; never logged.
        custom_headers: added to every request.
        compression: ``"gzip"`` to compress request bodies, or None.
        timeout: seconds one request may take in all.
        connect_timeout: seconds to establish a connection (default: ``timeout``).
        read_timeout: seconds to wait for the answer (default: ``timeout``).
        verify: check TLS certificates (default True), or the path of a CA bundle.
        client_cert: path of a client certificate (PEM) for mutual TLS.
        client_key: path of its key, if not in ``client_cert``.
        max_concurrent_requests: requests in flight at once (and pooled connections).
        retry_statuses: statuses to retry besides 408, 429 and 5xx.
        status_forcelist: retry exactly these statuses instead (and 413, 429 or 503 answered
            with a ``Retry-After``), as urllib3's ``Retry`` does for openlineage-python's
            ``retry.status_forcelist``; another 4xx or 5xx rejects the event.

    Raises:
        ConfigError: an invalid value, named with what is accepted.
    """

    def __init__(
        self,
        url: str,
        *,
        endpoint: str = "api/v1/lineage",
        batch_endpoint: str = "api/v1/lineage/batch",
        mode: Mode = "auto",
        batch_format: BatchFormat = "array",
        api_key: str | None = None,
        custom_headers: Mapping[str, str] | None = None,
        compression: str | None = None,
        timeout: float = 5.0,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
        verify: bool | str = True,
        client_cert: str | None = None,
        client_key: str | None = None,
        max_concurrent_requests: int = 10,
        retry_statuses: Sequence[int] = (),
        status_forcelist: Sequence[int] | None = None,
        token_provider: Any = None,
    ) -> None:
        parts = urlsplit(url.strip()) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"url={redact_url(str(url))!r} is not an HTTP URL; use e.g. http://marquez:5000 "
                "(OPENLINEAGE_URL or OPENLINEAGE__TRANSPORT__URL)"
            )
        try:
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            raise ConfigError(
                f"url={redact_url(url.strip())!r} has a port that is not a number from 0 to 65535; "
                "use e.g. http://marquez:5000 (OPENLINEAGE_URL or OPENLINEAGE__TRANSPORT__URL)"
            ) from None
        api_key = _secret_text("api_key (OPENLINEAGE_API_KEY or auth.apiKey)", api_key, header=True)
        _check_headers(custom_headers or {}, "custom_headers")
        # Credentials in the URL become a Basic authorization header, and httpx gets the URL
        # without them (its own log prints the URL of every request).
        basic: str | None = None
        if parts.username is not None or parts.password is not None:
            user = _secret_text("the url's user name", unquote(parts.username or ""))
            password = _secret_text("the url's password", unquote(parts.password or ""))
            basic = base64.b64encode(f"{user or ''}:{password or ''}".encode()).decode()
            self._secrets = [s for s in (password, basic) if s]
            url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        else:
            self._secrets = []
        if api_key:
            self._secrets.append(api_key)
        for header, text in (custom_headers or {}).items():
            if _CREDENTIAL_HEADER.search(header):  # "Authorization: Basic xyz": the value, and xyz
                self._secrets += [part for part in {text, text.rsplit(" ", 1)[-1]} if len(part) >= 4]
        if token_provider is not None:
            self._secrets += _provider_secrets(token_provider)
        if mode not in _MODES:
            raise ConfigError(f"mode={mode!r} is not a mode; use one of {', '.join(_MODES)}")
        if batch_format not in _FORMATS:
            raise ConfigError(
                f"batch_format={batch_format!r} is not a format; use one of {', '.join(_FORMATS)}"
            )
        if compression not in (None, "gzip"):
            raise ConfigError(f"compression={compression!r} is not supported; use gzip, or leave it unset")
        for name, value in (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
            ("read_timeout", read_timeout),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            ):
                raise ConfigError(f"{name}={value!r} is not a positive number of seconds")
        if (
            isinstance(max_concurrent_requests, bool)
            or not isinstance(max_concurrent_requests, int)
            or (max_concurrent_requests < 1)
        ):
            raise ConfigError(f"max_concurrent_requests={max_concurrent_requests!r} is not an integer >= 1")
        if not isinstance(verify, (bool, str)):
            raise ConfigError(f"verify={verify!r} must be true, false or the path of a CA bundle")
        self.url = url.strip()
        self.single_url = urljoin(self.url, endpoint)
        self.batch_url = urljoin(self.url, batch_endpoint)
        self.mode: Mode = mode
        self.batch_format: BatchFormat = batch_format
        self.compression = compression
        self.timeout = float(timeout)
        self.max_concurrent_requests = max_concurrent_requests
        self._retry_statuses = frozenset(retry_statuses)
        self._forcelist = None if status_forcelist is None else frozenset(status_forcelist)
        self._headers = {"Content-Type": "application/json", "User-Agent": _USER_AGENT}
        if compression == "gzip":
            self._headers["Content-Encoding"] = "gzip"
        self._api_key = api_key
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        elif basic:
            self._headers["Authorization"] = f"Basic {basic}"
        # Custom headers come last and override the auth header, as in openlineage-python.
        overrides = {name.lower() for name in (custom_headers or {})}
        self._headers = {k: v for k, v in self._headers.items() if k.lower() not in overrides}
        self._headers.update(custom_headers or {})
        # openlineage-python's jwt / oauth2 / custom TokenProvider: its blocking get_bearer()
        # runs on the sidecar's executor before each request (the provider caches the token).
        self._token_provider = None if "authorization" in overrides else token_provider
        self._tokens: list[str] = []
        self._timeouts = httpx.Timeout(
            self.timeout,
            connect=float(connect_timeout or timeout),
            read=float(read_timeout or timeout),
        )
        self._verify = _ssl_context(verify, client_cert, client_key)
        self._client: httpx.AsyncClient | None = None
        self._single_for_good = mode == "single"
        # Single mode: the backend may be unreachable (found so by the last request, or not yet
        # reached at all): one request probes it before the others follow.  So a backend that
        # is down when the outbox starts gets one connection attempt per lane, not ten.
        self._unreachable = True
        self._log = RateLimitedLog(30.0)
        # Released DataHub's OpenLineage route: dataset names its URNs cannot hold are named
        # once in a warning (DataHub accepts the event, and the dataset is lost in it).
        self._datahub_check = "/openapi/openlineage/" in urlsplit(self.single_url).path

    @classmethod
    def from_config(cls, resolved: ResolvedTransport) -> HttpTransport:
        """Build from an openlineage-python ``http``/``async_http`` transport config.

        Accepts openlineage-python's keys (``url``, ``endpoint``, ``auth``, ``compression``,
        ``custom_headers``, ``timeout``, ``verify``, ``retry``, ``sslContext``, and
        ``async_http``'s ``max_concurrent_requests`` and ``max_queue_size``) and ours
        (``mode``, ``batch_endpoint``, ``batch_format``, ``connect_timeout``, ``read_timeout``).
        """
        kwargs = http_kwargs(resolved)
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            # The constructor names its keyword ("mode='x' is not..."); name the variable too.
            key = str(exc).split("=", 1)[0]
            if key in kwargs and key != "api_key":
                raise ConfigError(f"{resolved.origin(key)}: {exc}") from None
            raise

    # -- the Transport protocol -------------------------------------------------------------

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        if self._datahub_check:
            self._check_datahub_names(batch)
        if self._single_for_good:
            return await self._send_single(batch, deadline)
        return await self._send_batch(batch, deadline, top=True)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _check_datahub_names(self, batch: Sequence[SerializedEvent]) -> None:
        """Warn once about a dataset DataHub cannot hold (see :func:`datahub_unsafe_dataset`);
        then stop looking (a parse per event, in the sidecar, while none was found)."""
        for event in batch:
            problem = datahub_unsafe_dataset(event.body)
            if problem is not None:
                self._datahub_check = False
                logger.warning(
                    "%s: DataHub accepts such events but cannot use the dataset: rename the object, or "
                    "name the table it belongs to (s3_dataset(..., table=...), the function's "
                    "LINEAGE_INPUT_TABLE), which DataHub then names the dataset by. Said once.",
                    problem,
                )
                return

    def clone(self) -> HttpTransport:
        """The same configuration, with no connections (for a forked child: the parent's
        connection pool and the loop it is bound to are not the child's to use)."""
        twin = copy.copy(self)
        twin._client = None
        twin._unreachable = True
        twin._log = RateLimitedLog(30.0)
        return twin

    @property
    def lane_events(self) -> int | None:
        """For the worker's lanes: the fewest events worth a lane of their own.  One event
        per request (single mode): a lane per ``max_concurrent_requests`` events; batches:
        None (a full batch)."""
        return self.max_concurrent_requests if self._single_for_good else None

    def __repr__(self) -> str:
        auth = ", api_key=***" if self._api_key else ""
        return f"HttpTransport({redact_url(self.url)!r}, mode={self.mode!r}{auth})"

    # -- requests ---------------------------------------------------------------------------

    def _client_now(self) -> httpx.AsyncClient:
        if self._client is None:
            # Requests in flight are bounded upstream: the worker's lanes (max_concurrency)
            # times max_concurrent_requests per batch in single mode, one per batch otherwise.
            # A pool bound here would cap every lane together.
            limits = httpx.Limits(
                max_connections=None, max_keepalive_connections=4 * self.max_concurrent_requests
            )
            self._client = httpx.AsyncClient(
                timeout=self._timeouts,
                headers=self._headers,
                transport=httpx.AsyncHTTPTransport(
                    verify=self._verify,
                    limits=limits,
                    proxy=_environment_proxy(self.url),
                    # A send buffer that holds a whole batch: the request leaves at once, and the
                    # worker can serialize the next batch while the backend reads this one.
                    socket_options=[(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)],
                ),
            )
        return self._client

    async def _post(self, url: str, body: bytes, deadline: float) -> httpx.Response | Outcome:
        """POST; a network failure or timeout comes back as a RETRY outcome."""
        # Answer a little before the deadline: the worker cancels send() at the deadline, and a
        # cancelled send loses the outcomes of the requests that did succeed.
        budget = min(self.timeout, deadline - time.monotonic() - _DEADLINE_MARGIN)
        if budget <= 0:
            return Outcome.deferred()  # no time to try: not a failure of the backend
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=5)
        try:
            return await asyncio.wait_for(self._bounded_post(url, body), budget)
        except TimeoutError:
            # Cut off by the caller's deadline rather than by our own timeout: that says
            # nothing about the backend, so it must not stop the other requests.
            reason = "timeout" if budget >= self.timeout else "deadline"
            return Outcome.retry(reason, f"POST {redact_url(url)} took longer than {budget:.3g} s")
        except httpx.TimeoutException as exc:
            return Outcome.retry("timeout", f"POST {redact_url(url)} timed out ({type(exc).__name__})")
        except _NoBearer as exc:
            self._log.error("token", "%s; the events stay buffered", exc)
            return Outcome.retry("token", str(exc))
        except (httpx.LocalProtocolError, UnicodeError) as exc:
            # A request this side could not write: the text of such an error can quote a
            # header (h11's "Illegal header value ..."), so it is never passed on.
            detail = (
                f"POST {redact_url(url)} could not be sent: {type(exc).__name__} (a header value HTTP "
                "cannot carry?; the value is not shown)"
            )
            self._log.error("unsendable", "%s; the events stay buffered", detail)
            return Outcome.retry("unsendable", detail)
        except httpx.HTTPError as exc:
            # ConnectError, ReadError, RemoteProtocolError, ...: the backend is unreachable.
            # The message names the URL, never the headers (so never the API key).
            detail = self._redact(f"POST {redact_url(url)} failed: {type(exc).__name__}: {exc}")
            return Outcome.retry("network", detail)

    def _redact(self, text: str) -> str:
        """``text`` with every credential this transport sends replaced by ``***`` (a backend
        may echo the header it refused)."""
        for secret in sorted((*self._secrets, *self._tokens), key=len, reverse=True):  # whole first
            text = text.replace(secret, "***")
        return text

    def _redacted(self, outcomes: list[Outcome]) -> list[Outcome]:
        if not self._secrets and not self._tokens:
            return outcomes
        return [
            Outcome(o.kind, o.reason, self._redact(o.detail), o.retry_after) if o.detail else o
            for o in outcomes
        ]

    def _snippet(self, response: httpx.Response) -> str:
        return self._redact(_snippet(response))

    async def _bounded_post(self, url: str, body: bytes) -> httpx.Response:
        """POST, reading at most ``MAX_ANSWER_BYTES`` of the answer (plenty for a batch's
        ``partial_success`` body and an error's text; a backend, or something in front of
        it, can answer gigabytes).  A longer answer is cut there, its connection closed."""
        auth = None
        if self._token_provider is not None:
            bearer = await self._bearer()
            if bearer:
                auth = {"Authorization": bearer}
        async with self._client_now().stream("POST", url, content=body, headers=auth) as response:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size >= MAX_ANSWER_BYTES:
                    break
            content = b"".join(chunks)[:MAX_ANSWER_BYTES]
        # The body is decoded and maybe cut: the framing headers no longer describe it.
        framing = ("content-encoding", "content-length", "transfer-encoding")
        headers = [(k, v) for k, v in response.headers.items() if k.lower() not in framing]
        return httpx.Response(
            response.status_code, headers=headers, content=content, request=response.request
        )

    async def _bearer(self) -> str | None:
        """The token provider's ``Authorization`` value (its blocking ``get_bearer()`` on the
        loop's executor); :class:`_NoBearer`, never the provider's own exception, when it fails
        or gives a token a header cannot carry."""
        assert self._token_provider is not None
        kind = type(self._token_provider).__name__
        try:
            bearer = await asyncio.get_running_loop().run_in_executor(None, self._token_provider.get_bearer)
        except Exception as exc:  # requests' errors, RuntimeError, a custom provider's anything
            text = self._redact(_redact_userinfo(f"{type(exc).__name__}: {exc}"))
            raise _NoBearer(f"the {kind} token provider failed: {text}") from None
        if not bearer:
            return None
        if not isinstance(bearer, str):
            raise _NoBearer(f"the {kind} token provider gave {type(bearer).__name__}, not a str")
        token = bearer.split(" ", 1)[-1]
        if token not in self._tokens:  # redacted from answers and logs like the API key
            self._tokens = [*self._tokens[-3:], token]
        problem = _header_problem(bearer, tabs=False)
        if problem is not None:
            raise _NoBearer(
                f"the token the {kind} token provider gave cannot be sent in an HTTP header: it "
                f"contains {problem}; check its token endpoint (the token is not shown)"
            )
        return bearer

    def _status_outcome(self, response: httpx.Response, url: str, events: int = 1) -> Outcome:
        """What a non-2xx answer means for one event (or each of a batch's ``events``)."""
        status = response.status_code
        answer = self._snippet(response)
        detail = f"POST {redact_url(url)} answered {status} {response.reason_phrase}: {answer}"
        if self._forcelist is None:
            retriable = status in (408, 429) or status >= 500
        else:  # urllib3's Retry.is_retry: the list, or a Retry-After on 413, 429 and 503
            retriable = status in self._forcelist or (
                status in (413, 429, 503) and "Retry-After" in response.headers
            )
        if retriable or status in self._retry_statuses:
            # A 500 (any 5xx but 502, 503 and 504, which say the backend or the way to it is
            # down) may be about the event: Marquez, OpenMetadata and DataHub answer 500 to an
            # event they cannot map.  The rest is about the backend.
            about = About.BACKEND
            if status >= 500 and status not in (502, 503, 504):
                about = About.EVENT if events == 1 else About.REQUEST
            return Outcome.retry(
                f"http_{status}", detail, parse_retry_after(response.headers.get("Retry-After")), about=about
            )
        if status == 413:
            return Outcome.rejected("too_large", detail)
        if status in _MISCONFIGURED:
            if status in (401, 403):
                hint = "check the API key (OPENLINEAGE_API_KEY or auth)"
            elif status == 407:
                hint = "the proxy wants credentials: check HTTPS_PROXY/HTTP_PROXY"
            elif status in _REDIRECTS:
                location = response.headers.get("Location", "(none)")[:200]
                hint = f"it redirects to {redact_url(location)}: set OPENLINEAGE_URL to where it points"
            else:
                hint = "check the URL and endpoint (OPENLINEAGE_URL, OPENLINEAGE_ENDPOINT)"
            self._log.error(f"misconfigured-{status}", "%s; %s. Events stay buffered.", detail, hint)
            return Outcome.retry(f"http_{status}", f"{detail} ({hint})")
        return Outcome.rejected("rejected_by_backend", detail)

    # -- batch mode --------------------------------------------------------------------------

    def _batch_body(self, batch: Sequence[SerializedEvent]) -> bytes:
        joined = b",".join(event.body for event in batch)
        if self.batch_format == "openmetadata":
            return b'{"events":[' + joined + b"]}"
        return b"[" + joined + b"]"

    async def _send_batch(
        self, batch: Sequence[SerializedEvent], deadline: float, top: bool
    ) -> list[Outcome]:
        answer = await self._post(self.batch_url, self._batch_body(batch), deadline)
        if isinstance(answer, Outcome):
            return [answer] * len(batch)
        status = answer.status_code
        if 200 <= status < 300:
            return self._redacted(_read_batch_answer(answer, len(batch)))
        if status in _BATCH_UNSUPPORTED and self.mode == "auto":
            self._single_for_good = True
            logger.warning(
                "%s answered %d: no batch endpoint there; sending one event per request to %s from now on",
                redact_url(self.batch_url),
                status,
                redact_url(self.single_url),
            )
            return await self._send_single(batch, deadline)
        if status == 413 or (status in (400, 422) and not _has_failed_events(answer)):
            if len(batch) == 1:
                # The one event is too large, or it is the bad one.
                return [self._status_outcome(answer, self.batch_url)]
            # Bisect: each half again; good events are resent O(log n) times at most.
            middle = len(batch) // 2
            first = await self._send_batch(batch[:middle], deadline, top=False)
            if any(o.kind in (OutcomeKind.RETRY, OutcomeKind.DEFERRED) for o in first):
                # Events of the first half go again: a later event of their runs must not
                # arrive before them, so the second half waits (sent again, right after).
                second = [Outcome.deferred()] * (len(batch) - middle)
            else:
                second = await self._send_batch(batch[middle:], deadline, top=False)
            outcomes = first + second
            if top and status != 413 and all(o.kind is OutcomeKind.REJECTED for o in outcomes):
                return await self._batch_refused_whole(batch, outcomes, status, deadline)
            return outcomes
        if status in (400, 422):
            return self._redacted(_read_batch_answer(answer, len(batch)))
        outcome = self._status_outcome(answer, self.batch_url, len(batch))
        if status in _BATCH_UNSUPPORTED and self.mode == "batch":
            self._log.error(
                "batch-missing",
                "%s answered %d: is batch_endpoint right, or should mode be single or auto?",
                redact_url(self.batch_url),
                status,
            )
        return [outcome] * len(batch)

    async def _batch_refused_whole(
        self, batch: Sequence[SerializedEvent], outcomes: list[Outcome], status: int, deadline: float
    ) -> list[Outcome]:
        """Every event of a batch was refused, alone too.  Either they are all bad, or the
        batch's shape is wrong for this endpoint (an array on OpenMetadata's {"events": [...]}
        route, or the reverse).  The single endpoint tells which: if it takes one of them, the
        events are fine and the configuration is not."""
        probe = await self._send_one(batch[0], deadline)
        if probe.kind is OutcomeKind.REJECTED:
            return outcomes  # the events themselves are bad
        if probe.kind is not OutcomeKind.DELIVERED:
            return [probe] * len(batch)  # no answer from the single endpoint: keep them all
        detail = (
            f"POST {redact_url(self.batch_url)} answered {status} to every event of a batch, "
            f"while {redact_url(self.single_url)} takes them: check batch_format (now "
            f"{self.batch_format!r}; OpenMetadata takes 'openmetadata') and batch_endpoint"
        )
        if self.mode == "auto":
            self._single_for_good = True
            logger.warning("%s; sending one event per request from now on", detail)
            return [DELIVERED, *await self._send_single(batch[1:], deadline)]
        self._log.error("batch-format", "%s (or use mode auto). Events stay buffered.", detail)
        return [DELIVERED] + [Outcome.retry("batch_format", detail)] * (len(batch) - 1)

    # -- single mode -------------------------------------------------------------------------

    async def _send_single(self, batch: Sequence[SerializedEvent], deadline: float) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(batch)
        # Each run's events in order, one after another; runs side by side.
        lanes: dict[object, list[int]] = {}
        for index, event in enumerate(batch):
            lane: object = event.run_id if event.run_id is not None else index
            lanes.setdefault(lane, []).append(index)
        # After the backend was unreachable, one request probes it before the others follow:
        # a backend that is down costs one connection attempt per retry, not one per lane.
        probing = self._unreachable
        gate = asyncio.Semaphore(1 if probing else self.max_concurrent_requests)
        stop: list[Outcome] = []  # set when the backend is unreachable or misconfigured
        # One call sends for at most _SINGLE_SLICE seconds and defers the rest, so that a close()
        # that begins meanwhile soon gets a call whose deadline is its own.
        slice_end = time.monotonic() + _SINGLE_SLICE

        async def run_lane(indexes: list[int]) -> None:
            nonlocal probing
            for position, index in enumerate(indexes):
                if stop:
                    outcome: Outcome = stop[0]
                elif time.monotonic() >= slice_end:
                    for later in indexes[position:]:
                        outcomes[later] = Outcome.deferred()
                    return
                else:
                    async with gate:
                        if time.monotonic() >= slice_end:  # the slice ended while we queued
                            for later in indexes[position:]:
                                outcomes[later] = Outcome.deferred()
                            return
                        # The backend may have been found unreachable while we queued.
                        outcome = stop[0] if stop else await self._send_one(batch[index], deadline)
                    if outcome.kind is OutcomeKind.RETRY and outcome.reason in _STOP_REASONS:
                        # Every other request would fail the same way: keep the rest for later.
                        stop.append(outcome)
                        self._unreachable = True
                    elif probing and outcome.kind is not OutcomeKind.DEFERRED:
                        probing = False  # it answers: open the gate to the others
                        self._unreachable = False
                        for _ in range(self.max_concurrent_requests - 1):
                            gate.release()
                outcomes[index] = outcome
                if outcome.kind in (OutcomeKind.RETRY, OutcomeKind.DEFERRED):
                    # Later events of this run must not overtake this one.
                    for later in indexes[position + 1 :]:
                        outcomes[later] = outcome
                    return

        await asyncio.gather(*(run_lane(indexes) for indexes in lanes.values()))
        return [o if o is not None else DELIVERED for o in outcomes]

    async def _send_one(self, event: SerializedEvent, deadline: float) -> Outcome:
        answer = await self._post(self.single_url, event.body, deadline)
        if isinstance(answer, Outcome):
            return answer
        if 200 <= answer.status_code < 300:
            return DELIVERED
        return self._status_outcome(answer, self.single_url)


# What DataHub's dataset URNs cannot hold (its docs: "URN restrictions"), and what java.net.URI
# refuses in the URI DataHub makes of a namespace with a scheme (it then leaves the dataset out).
_URN_RESERVED = frozenset(",()\u241f")
_URI_ILLEGAL = re.compile(r'[\x00-\x20"<>\\^`{|}\x7f]|%(?![0-9A-Fa-f]{2})')


def datahub_unsafe_dataset(body: bytes) -> str | None:
    """What is wrong, for released DataHub, with the first dataset of this event that its
    converter cannot turn into a usable URN, or None.  The name checked is the one DataHub
    uses: a TABLE symlink's name when there is one, else the dataset's own name."""
    try:
        event = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(event, dict):
        return None
    for key in ("inputs", "outputs"):
        datasets = event.get(key)
        for dataset in datasets if isinstance(datasets, list) else ():
            if not isinstance(dataset, dict):
                continue
            namespace, name = dataset.get("namespace"), dataset.get("name")
            if not isinstance(namespace, str) or not isinstance(name, str):
                continue
            facets = dataset.get("facets")
            symlinks = facets.get("symlinks") if isinstance(facets, dict) else None
            identifiers = symlinks.get("identifiers") if isinstance(symlinks, dict) else None
            for identifier in identifiers if isinstance(identifiers, list) else ():
                table = identifier.get("name") if isinstance(identifier, dict) else None
                if isinstance(table, str) and identifier.get("type") == "TABLE":
                    namespace, name = "hive", table  # DataHub's hive platform, the symlink's name
            reserved = sorted(_URN_RESERVED.intersection(name))
            if reserved:
                return (
                    f"the dataset {namespace}/{name} holds {' '.join(repr(c) for c in reserved)}, which "
                    "DataHub's dataset URNs cannot hold"
                )
            if "://" in namespace and _URI_ILLEGAL.search(f"{namespace}/{name}"):
                return (
                    f"the dataset {namespace}/{name} holds a character a URI cannot (a space, a quote, "
                    "a bare %, ...), so DataHub cannot make a URI of it and leaves the dataset out"
                )
    return None


def _environment_proxy(url: str) -> str | None:
    """The proxy HTTP(S)_PROXY/NO_PROXY give for ``url``, as httpx would pick it (an explicit
    httpx transport does not read the environment by itself)."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def _snippet(response: httpx.Response, limit: int = 200) -> str:
    text = response.text.strip().replace("\n", " ")
    return text[:limit] + ("..." if len(text) > limit else "") if text else "(no body)"


def _failed_events(body: Any) -> list[Any] | None:
    if not isinstance(body, dict):
        return None
    failed = body.get("failed_events", body.get("failedEvents"))
    return failed if isinstance(failed, list) else None


def _has_failed_events(response: httpx.Response) -> bool:
    try:
        return _failed_events(orjson.loads(response.content)) is not None
    except orjson.JSONDecodeError:
        return False


def _read_batch_answer(response: httpx.Response, size: int) -> list[Outcome]:
    """Per-event outcomes from a batch answer: the spec's ``failed_events`` (or
    OpenMetadata's ``failedEvents``); events not listed there were received."""
    try:
        body = orjson.loads(response.content) if response.content else None
    except orjson.JSONDecodeError:
        body = None
    failed = _failed_events(body)
    if response.status_code >= 400 and failed is None:
        return [Outcome.rejected("rejected_by_backend", _snippet(response))] * size
    outcomes: list[Outcome] = [DELIVERED] * size
    for entry in failed or ():
        if not isinstance(entry, dict):
            continue
        index = entry.get("index")
        if not isinstance(index, int) or not 0 <= index < size:
            continue
        reason = str(entry.get("reason") or "failed")
        if entry.get("retriable") is True:
            outcomes[index] = Outcome.retry(
                "partial_success", f"batch event {index}: {reason}", about=About.EVENT
            )
        else:
            outcomes[index] = Outcome.rejected("rejected_by_backend", f"batch event {index}: {reason}")
    return outcomes


def _ssl_context(verify: bool | str, cert: str | None, key: str | None) -> ssl.SSLContext | bool:
    if not cert and isinstance(verify, bool):
        return verify  # httpx's own default context, or no verification
    return tls_context(
        verify if isinstance(verify, str) else None,
        cert,
        key,
        verify=verify is not False,
        described=f"verify={verify!r}, client_cert={cert!r}",
    )


# -- openlineage-python configuration ------------------------------------------------------------

_OPENLINEAGE_KEYS = {
    "type",
    "url",
    "endpoint",
    "auth",
    "compression",
    "custom_headers",
    "timeout",
    "verify",
    "retry",
    "sslcontext",
    "sslContext",
    "ssl_context",
    "max_concurrent_requests",
    "max_queue_size",
}
_OUR_KEYS = {"mode", "batch_endpoint", "batch_format", "connect_timeout", "read_timeout"}
#: async_http's max_concurrent_requests when none is given, as in openlineage-python.
_ASYNC_HTTP_CONCURRENCY = 100


def http_kwargs(resolved: ResolvedTransport) -> dict[str, Any]:
    """``HttpTransport`` keyword arguments from an openlineage-python style config."""
    config = dict(resolved.config or {})
    origin = resolved.origin
    for key in ("name", "priority"):  # openlineage-python's factory drops them too
        config.pop(key, None)
    known = _OPENLINEAGE_KEYS - {"sslcontext", "ssl_context"} | _OUR_KEYS
    for key in sorted(set(config) - _OPENLINEAGE_KEYS - _OUR_KEYS):
        # openlineage-python ignores keys it does not know: a warning, not a failed init.
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = (
            f"did you mean {close[0]}?"
            if close
            else f"the settings are {', '.join(sorted(known - {'type'}))}"
        )
        warn_once(f"{origin(key)}: {key!r} is not an HTTP transport setting (ignored); {hint}")
        config.pop(key)
    url = config.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(
            f"the {config.get('type', 'http')} transport needs a url: set OPENLINEAGE_URL "
            "or OPENLINEAGE__TRANSPORT__URL (e.g. http://marquez:5000)"
        )
    kwargs: dict[str, Any] = {"url": url}
    for key in ("endpoint", "batch_endpoint", "mode", "batch_format", "compression"):
        if key in config:
            value = config[key]
            if key == "compression" and value in ("", None):
                continue  # openlineage-python sends an empty compression uncompressed
            if not isinstance(value, str):
                raise ConfigError(f"{origin(key)}={value!r} must be a string")
            kwargs[key] = value
    plain_http = url.strip().lower().startswith("http://")
    for key in ("timeout", "connect_timeout", "read_timeout"):
        if key in config:
            kwargs[key] = _number(origin(key), config[key])
    if "max_concurrent_requests" in config:
        value = config["max_concurrent_requests"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{origin('max_concurrent_requests')}={value!r} is not an integer >= 1")
        kwargs["max_concurrent_requests"] = value
    elif config.get("type") == "async_http":
        kwargs["max_concurrent_requests"] = _ASYNC_HTTP_CONCURRENCY  # openlineage-python's default
    if "verify" in config:
        verify = config["verify"]
        if not isinstance(verify, (bool, str)):
            raise ConfigError(f"{origin('verify')}={verify!r} must be true, false or the path of a CA bundle")
        if plain_http and isinstance(verify, str):
            # requests never reads verify for an http:// URL, so openlineage-python delivers.
            warn_once(
                f"{origin('verify')}={verify!r} has no effect on the http:// URL {redact_url(url.strip())} "
                "(ignored); it matters for https:// only"
            )
        else:
            kwargs["verify"] = verify
    ssl_config = config.get("sslContext", config.get("ssl_context", config.get("sslcontext")))
    if ssl_config is not None:
        if not isinstance(ssl_config, dict):
            raise ConfigError(f'{origin("sslContext")} must be a mapping such as {{"caCertPath": ...}}')
        ca = ssl_config.get("caCertPath", ssl_config.get("ca_cert_path", ssl_config.get("cacertpath")))
        cert = ssl_config.get(
            "clientCertPath", ssl_config.get("client_cert_path", ssl_config.get("clientcertpath"))
        )
        client_key = ssl_config.get(
            "clientKeyPath", ssl_config.get("client_key_path", ssl_config.get("clientkeypath"))
        )
        if client_key and not cert:
            raise ConfigError(f"{origin('sslContext')}: clientKeyPath needs clientCertPath")
        if plain_http and (ca or cert):
            warn_once(
                f"{origin('sslContext')} has no effect on the http:// URL {redact_url(url.strip())} "
                "(ignored): TLS files matter for https:// only"
            )
        else:
            if ca:
                kwargs["verify"] = ca
            kwargs["client_cert"], kwargs["client_key"] = cert, client_key
    if "custom_headers" in config:
        headers = config["custom_headers"]
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ConfigError(f"{origin('custom_headers')} must map header names to strings")
        _check_headers(headers, origin("custom_headers"))
        kwargs["custom_headers"] = headers
    if "auth" in config:
        auth = config["auth"]
        kind = auth.get("type") if isinstance(auth, dict) else None
        if kind in (None, "api_key"):
            kwargs["api_key"] = _api_key(origin("auth"), auth)
        else:
            kwargs["token_provider"] = _token_provider(origin("auth"), auth)
    if "retry" in config:
        retry = config["retry"]
        if not isinstance(retry, dict):
            raise ConfigError(f"{origin('retry')}={retry!r} must be a mapping of urllib3 Retry keywords")
        # Any urllib3 Retry keyword is accepted, as openlineage-python passes them all on; only
        # status_forcelist changes anything here (the outbox retries until delivered or dropped).
        if "status_forcelist" in retry:
            statuses = retry["status_forcelist"]
            if not isinstance(statuses, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in statuses
            ):
                raise ConfigError(f"{origin('retry')}: status_forcelist must be a list of status codes")
            kwargs["status_forcelist"] = statuses
    return kwargs


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{name}={value!r} is not a positive number of seconds")
    return float(value)


def _token_provider(name: str, auth: dict[str, Any]) -> Any:
    """openlineage-python's own token provider for ``auth`` (``jwt``, ``oauth2`` or a
    ``module.Class``); a ConfigError naming the setting when it cannot be built."""
    from openlineage.client.transport.http import create_token_provider

    try:
        provider = create_token_provider(dict(auth))
    except Exception as exc:  # KeyError for a missing field, TypeError, ImportError, ...
        text = _redact_userinfo(f"{type(exc).__name__}: {exc}")
        for key, value in auth.items():  # a provider of one's own may quote its settings
            if (
                isinstance(value, str)
                and len(value) >= 4
                and re.search(r"key|secret|passw|^token$", key, re.I)
            ):
                text = text.replace(value, "***")
        raise ConfigError(
            f"{name}: openlineage-python cannot build the {auth.get('type')!r} token provider: "
            f"{text} (the credentials are never logged)"
        ) from None
    _RedactingFilter.secrets.update(_provider_secrets(provider))
    ol_logger = logging.getLogger("openlineage.client.transport.http")
    if _OPENLINEAGE_FILTER not in ol_logger.filters:
        ol_logger.addFilter(_OPENLINEAGE_FILTER)
    return provider


def _api_key(name: str, auth: Any) -> str | None:
    if not isinstance(auth, dict):
        raise ConfigError(f'{name} must be a mapping such as {{"type": "api_key", "apiKey": "..."}}')
    kind = auth.get("type")
    if kind is None:
        return None
    if kind != "api_key":
        raise ConfigError(
            f"{name}: auth type {kind!r} is not supported by lineage-outbox; use api_key "
            "(or custom_headers for another scheme)"
        )
    key = auth.get("apiKey") or auth.get("apikey") or auth.get("api_key")
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{name}: auth type api_key needs apiKey (the value is never logged)")
    # Checked here to name where it came from (the constructor knows only its keyword).
    _secret_text(name if name == "OPENLINEAGE_API_KEY" else f"{name}: apiKey", key, header=True)
    return key
