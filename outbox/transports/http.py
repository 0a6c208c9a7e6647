"""The HTTP transport: OpenLineage's ``/lineage`` and ``/lineage/batch`` endpoints over httpx.

Modes:

* ``single``: one event per POST to ``endpoint`` (what Marquez serves), up to
  ``max_concurrent_requests`` at once, each run's events one after another.

In every mode, at most ``max_concurrent_requests`` requests are in flight (and connections
open) at once, across all the worker's lanes.
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
import copy
import gzip
import importlib.util
import operator
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urljoin, urlsplit

import httpx

# httpx imports httpcore when its first client is made, and httpcore its anyio backend at the
# first request: both on the sidecar's thread.  A fork while that thread is inside such an
# import leaves the child a half-made module in sys.modules, and every request of the child's
# own transport then fails (AttributeError: partially initialized module 'httpcore').  So
# they are imported here, on the thread that imports this transport, before any sidecar runs;
# and so is anyio's asyncio backend, which anyio imports at its first use (26 modules, tens of
# milliseconds on the sidecar's thread at its first request, while a burst right after the
# outbox started filled the buffer: 31 events dropped on a healthy disk with a spill).
import anyio._backends._asyncio  # noqa: F401  # isort: skip
import httpcore  # isort: skip
import httpcore._backends.anyio  # noqa: F401  # isort: skip

# httpcore asks for sniffio (``import sniffio``) each time it makes a lock, a few times per
# request; anyio 4 no longer installs it, and each failed import searches sys.path again: about
# 60 µs of the sidecar's CPU each time.  Its absence, remembered once (``import sniffio`` then
# raises ModuleNotFoundError at once, as it did after the search).
if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
    sys.modules["sniffio"] = None  # type: ignore[assignment]

from .._config._config import ResolvedTransport
from .._errors import ConfigError
from .._observability._log import RateLimitedLog, logger
from ._base import DELIVERED, Outcome, OutcomeKind, SerializedEvent
from ._http._answers import (
    BATCH_UNSUPPORTED,
    MAX_ANSWER_BYTES,
    HttpAnswer,
    has_failed_events,
    parse_retry_after,
    read_batch_answer,
    read_capped,
    snippet,
    status_outcome,
)
from ._http._config import TLS_KEYS, http_kwargs
from ._http._datahub import datahub_unsafe_dataset, warned_unsafe_dataset
from ._http._settings import (
    NoBearer,
    Places,
    check_arguments,
    check_bearer,
    check_headers,
    checked_url,
    new_client,
    provider_bearer,
    redact_url,
    request_headers,
    secret_text,
    sent_secrets,
    split_credentials,
    ssl_context,
)
from ._http._single import send_single
from ._http._wire import WireClient

__all__ = [
    "MAX_ANSWER_BYTES",
    "HttpTransport",
    "datahub_unsafe_dataset",
    "http_kwargs",
    "parse_retry_after",
    "redact_url",
]

Mode = Literal["single", "batch", "auto"]
BatchFormat = Literal["array", "openmetadata"]
_DEADLINE_MARGIN = 0.05
_BODY = operator.attrgetter("body")
_SINGLE_SLICE = 1.0


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
        verify: check TLS certificates (default True), or the path of a CA bundle (a file or
            a folder).  Not read for an ``http://`` URL (a warning says so), as requests.
        client_cert: path of a client certificate (PEM) for mutual TLS.  Its files must exist,
            for an ``http://`` URL too, as requests checks them before every request.
        client_key: path of its key, if not in ``client_cert``.
        max_concurrent_requests: requests in flight at once, and connections open, across
            every lane of the worker.
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
        parts = checked_url(url)
        api_key = secret_text("api_key (OPENLINEAGE_API_KEY or auth.apiKey)", api_key, header=True)
        check_headers(custom_headers or {}, "custom_headers")
        # Credentials in the URL become a Basic authorization header.
        url, basic, url_secrets = split_credentials(url, parts)
        self._secrets = url_secrets + sent_secrets(api_key, custom_headers, token_provider)
        timeouts = {"timeout": timeout, "connect_timeout": connect_timeout, "read_timeout": read_timeout}
        check_arguments(mode, batch_format, compression, timeouts, max_concurrent_requests, verify)
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
        self._api_key = api_key
        self._headers, overrides = request_headers(compression, api_key, basic, custom_headers)
        # openlineage-python's jwt / oauth2 / custom TokenProvider: its blocking get_bearer()
        # runs on the sidecar's executor before each request (the provider caches the token).
        self._token_provider = None if "authorization" in overrides else token_provider
        self._tokens: list[str] = []
        connect, read = float(connect_timeout or timeout), float(read_timeout or timeout)
        self._timeouts = httpx.Timeout(self.timeout, connect=connect, read=read)
        self._verify = ssl_context(verify, client_cert, client_key, plain_http=parts.scheme == "http")
        self._client: httpx.AsyncClient | WireClient | None = None
        self._places = Places(max_concurrent_requests)  # every lane's requests share them
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
            if str(exc).startswith("cannot load the TLS files"):  # a file there, but not TLS
                named = [resolved.origin(k) for k in TLS_KEYS if k in (resolved.config or {})]
                raise ConfigError(f"{' and '.join(named)}: {exc}") from None
            raise

    # -- the Transport protocol -------------------------------------------------------------

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        if self._datahub_check and warned_unsafe_dataset(event.body for event in batch):
            self._datahub_check = False  # said once: stop looking (a parse per event meanwhile)
        if self._single_for_good:
            return await self._send_single(batch, deadline)
        return await self._send_batch(batch, deadline, top=True)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def clone(self) -> HttpTransport:
        """The same configuration, with no connections (for a forked child: the parent's
        connection pool and the loop it is bound to are not the child's to use)."""
        twin = copy.copy(self)
        twin._client = None
        twin._places = Places(self.max_concurrent_requests)
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

    def _client_now(self) -> httpx.AsyncClient | WireClient:
        if self._client is None:
            self._client = new_client(
                self.url,
                self._timeouts,
                self._headers,
                self._verify,
                self.max_concurrent_requests,
                posts_to=(self.single_url, self.batch_url),
            )
        return self._client

    async def _post(
        self, url: str, body: bytes, deadline: float, queue_until: float | None = None
    ) -> HttpAnswer | Outcome:
        """POST once one of the ``max_concurrent_requests`` places is free (waiting for one
        until ``queue_until``, default ``deadline``; then DEFERRED: not the backend's fault);
        a network failure or timeout comes back as a RETRY outcome."""
        if not await self._places.take(min(deadline, queue_until or deadline) - _DEADLINE_MARGIN):
            return Outcome.deferred()
        try:
            return await self._post_gated(url, body, deadline)
        finally:
            self._places.give_back()

    async def _post_gated(self, url: str, body: bytes, deadline: float) -> HttpAnswer | Outcome:
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
        except NoBearer as exc:
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

    def _snippet(self, response: HttpAnswer) -> str:
        return self._redact(snippet(response))

    async def _bounded_post(self, url: str, body: bytes) -> HttpAnswer:
        """POST, reading at most ``MAX_ANSWER_BYTES`` of the answer; a longer answer is cut
        there, its connection closed."""
        auth = None
        if self._token_provider is not None:
            bearer = await self._bearer()
            if bearer:
                auth = {"Authorization": bearer}
        client = self._client_now()
        if isinstance(client, WireClient):
            return await client.post(url, body, auth)
        async with client.stream("POST", url, content=body, headers=auth) as response:
            return await read_capped(response)

    async def _bearer(self) -> str | None:
        """The token provider's ``Authorization`` value; :class:`NoBearer`, never the
        provider's own exception, when it fails or gives a token a header cannot carry."""
        assert self._token_provider is not None
        bearer = await provider_bearer(self._token_provider, self._redact)
        if bearer:
            token = bearer.split(" ", 1)[-1]
            if token not in self._tokens:  # redacted from answers and logs like the API key
                self._tokens = [*self._tokens[-3:], token]
            check_bearer(self._token_provider, bearer)
        return bearer

    def _status_outcome(self, response: HttpAnswer, url: str, events: int = 1) -> Outcome:
        """What a non-2xx answer means for one event (or each of a batch's ``events``)."""
        outcome, misconfigured = status_outcome(
            response,
            url,
            self._snippet(response),
            events=events,
            forcelist=self._forcelist,
            retry_statuses=self._retry_statuses,
        )
        if misconfigured is not None:
            self._log.error(
                f"misconfigured-{response.status_code}", "%s. Events stay buffered.", misconfigured
            )
        return outcome

    # -- batch mode --------------------------------------------------------------------------

    def _batch_body(self, batch: Sequence[SerializedEvent]) -> bytes:
        opening, closing = (b'{"events":[', b"]}") if self.batch_format == "openmetadata" else (b"[", b"]")
        bodies = list(map(_BODY, batch))
        if not bodies:
            return opening + closing
        # One join, no copy of the whole after it: a batch's body is hundreds of kilobytes,
        # and each copy of it cost the sidecar's thread 200 µs (a fresh mapping's page faults).
        bodies[0] = opening + bodies[0]
        bodies[-1] += closing
        return b",".join(bodies)

    async def _send_batch(
        self, batch: Sequence[SerializedEvent], deadline: float, top: bool
    ) -> list[Outcome]:
        answer = await self._post(self.batch_url, self._batch_body(batch), deadline)
        if isinstance(answer, Outcome):
            return [answer] * len(batch)
        status = answer.status_code
        if 200 <= status < 300:
            return self._redacted(read_batch_answer(answer, len(batch)))
        if status in BATCH_UNSUPPORTED and self.mode == "auto":
            self._single_for_good = True
            logger.warning(
                "%s answered %d: no batch endpoint there; sending one event per request to %s from now on",
                redact_url(self.batch_url),
                status,
                redact_url(self.single_url),
            )
            return await self._send_single(batch, deadline)
        if status == 413 or (status in (400, 422) and not has_failed_events(answer)):
            if len(batch) == 1:
                # The one event is too large, or it is the bad one; or, sent alone at the top
                # (a linger that ended with one event), the batch's shape is wrong for this
                # endpoint: the single endpoint tells, as for a larger batch refused whole.
                outcome = self._status_outcome(answer, self.batch_url)
                if top and status != 413 and outcome.kind is OutcomeKind.REJECTED:
                    return await self._batch_refused_whole(batch, [outcome], status, deadline)
                return [outcome]
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
            return self._redacted(read_batch_answer(answer, len(batch)))
        outcome = self._status_outcome(answer, self.batch_url, len(batch))
        if status in BATCH_UNSUPPORTED and self.mode == "batch":
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
        return await send_single(self, batch, deadline, _SINGLE_SLICE)

    async def _send_one(
        self, event: SerializedEvent, deadline: float, queue_until: float | None = None
    ) -> Outcome:
        answer = await self._post(self.single_url, event.body, deadline, queue_until)
        if isinstance(answer, Outcome):
            return answer
        if 200 <= answer.status_code < 300:
            return DELIVERED
        return self._status_outcome(answer, self.single_url)
