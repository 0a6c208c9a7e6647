"""``outbox sink``: a local OpenLineage HTTP backend for development, demos and tests.

It serves the OpenLineage 2.0.2 endpoints, validates each event's structure,
keeps what it accepts (in memory, and optionally in a JSON-lines file), lists it
back, and can be told to misbehave (slow, failing, single-endpoint only) so it can
play Marquez, OpenMetadata or a broken proxy.

Endpoints (``flavor="spec"``, the default):

* ``POST /api/v1/lineage``: one event; 200, or 422 ``{"code": 422, "errors": [...]}``
  (Marquez's shape) for an invalid one, 400 for a body that is not JSON.
* ``POST /api/v1/lineage/batch``: a JSON array; 200 with the spec's body
  (``status`` ``success`` or ``partial_success``, ``summary``, ``failed_events``).
* ``GET /api/v1/events``: every event received, oldest first (``?limit=N``: the last N).
* ``DELETE /api/v1/events``: forget them.  ``GET /healthz``: ``ok``.

``flavor="marquez"``: as Marquez 0.51.1 answers (:func:`marquez_answer`): 201 with no body, no
batch route (404), 415 without a JSON content type, 422 ``{"errors": [...]}`` for a missing
field, 500 with a ``{"code": 400, ...}`` body for JSON it cannot map.
``flavor="openmetadata"``: as released 2.0.7 answers: the routes under
``/api/v1/openlineage/lineage``, a batch body ``{"events": [...]}`` and a response with
``failedEvents`` (200 even when every event failed; ``openmetadata_all_failed_status=400`` for
newer servers), 400 to a JobEvent or DatasetEvent, and ``lineageEdgesCreated`` counted as the
server counts it: on a COMPLETE event (or one without ``eventType``) with inputs and outputs,
one edge per output x input that both resolve to a table of ``openmetadata_tables`` (by a
dotted name or a symlink; an S3 object alone never does).
``flavor="datahub"``: released DataHub's one route, ``/openapi/openlineage/api/v1/lineage``
(the batch route 404), and 500 wherever the released server throws: "Unable to determine
orchestrator" for an event with no ``processing_engine`` run facet whose producer does not
match DataHub's own pattern, and a body that is not an object, has no run (a JobEvent, a
DatasetEvent, ``{}``), or no ``eventType``.

Example::

    with Sink(port=0) as sink:                      # a free port on 127.0.0.1
        ... point OPENLINEAGE_URL at sink.url ...
        sink.wait_for(4, timeout=5)
        print(sink.events)
"""

from __future__ import annotations

import gzip
import random
import ssl
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, Self, TextIO
from urllib.parse import parse_qs, urlsplit

import orjson

from ._sink_rules import (
    EVENT_TYPES,
    datahub_failure,
    datahub_orchestrator,
    marquez_answer,
    openmetadata_single_answer,
    openmetadata_table,
    validate_event,
)

__all__ = [
    "EVENT_TYPES",
    "Sink",
    "SinkBehaviour",
    "datahub_failure",
    "datahub_orchestrator",
    "marquez_answer",
    "openmetadata_single_answer",
    "openmetadata_table",
    "validate_event",
]

Flavor = Literal["spec", "marquez", "openmetadata", "datahub"]


@dataclass
class SinkBehaviour:
    """How the sink answers; change it at any time (tests flip it mid-run)."""

    #: ``spec``, ``marquez`` (as Marquez 0.51.1), ``openmetadata`` (as released OpenMetadata
    #: 2.0.7: its routes and bodies) or ``datahub`` (as released DataHub: one route, and 500 to
    #: an event that names no orchestrator).
    flavor: Flavor = "spec"
    #: Seconds to wait before answering each request.
    delay: float = 0.0
    #: Answer this status instead of processing (None: behave).
    fail_status: int | None = None
    #: Fraction of requests that get ``fail_status``.
    fail_rate: float = 1.0
    #: Once this many events are accepted, answer every request 503 (None: no such limit;
    #: a test that must leave some events undelivered, whatever the machine's speed).
    accept_most: int | None = None
    #: ``Retry-After`` value sent with ``fail_status``.
    retry_after: str | None = None
    #: ``Location`` sent with ``fail_status`` (a redirect, say).
    location: str | None = None
    #: Answer 404 on the batch route (like a proxy in front of Marquez).
    single_only: bool = False
    #: Require ``Authorization: Bearer <api_key>`` (401 without, 403 wrong).
    api_key: str | None = None
    #: Answer 413 to bodies larger than this many bytes.
    max_body: int | None = None
    #: The status of the missing batch route (``single_only``, ``marquez``): 404 or 405, say.
    batch_missing_status: int = 404
    #: ``spec``: a bad event in a batch is listed in ``failed_events``; ``whole``: the whole
    #: batch gets a bare 400, as some proxies and older servers answer.
    batch_errors: Literal["spec", "whole"] = "spec"
    #: The next this-many events received in batches fail as *retriable* (``partial_success``).
    flaky_events: int = 0
    #: Answer 500 (with Marquez's ``{"code": 400, ...}`` body) to any request whose body holds
    #: this text, as a backend does to an event it cannot map.
    poison: str | None = None
    #: ``openmetadata``: the status of a batch in which every event failed: 200 (released
    #: 2.0.7, with ``"status": "failure"``) or 400 (newer servers).
    openmetadata_all_failed_status: int = 200
    #: ``openmetadata``: the tables the server has (``service.db.schema.table``); an edge is
    #: counted only where both ends resolve to one of them.
    openmetadata_tables: tuple[str, ...] = ()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256
    sink: Sink

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets the connection (or is killed) is not the sink's problem.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    # Buffered writes, flushed once per response: headers and body leave in one segment
    # (two small writes meet Nagle and delayed ACKs: a 40 ms stall per request).
    wbufsize = -1
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the sink prints events
        pass

    def _reply(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        payload = b"" if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        if payload:
            self.send_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else b""
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            data = gzip.decompress(data)
        return data

    def do_GET(self) -> None:
        sink = self.server.sink
        url = urlsplit(self.path)
        if url.path == "/healthz":
            self._reply(200, b"ok")
        elif url.path == "/api/v1/events":
            limit = parse_qs(url.query).get("limit", [None])[0]
            events = sink.events
            if limit is not None and limit.isdigit():
                events = events[-int(limit) :] if int(limit) else []
            self._reply(200, events)
        else:
            self._refuse_other("GET", 404, f"no route for GET {url.path}")

    def do_DELETE(self) -> None:
        if urlsplit(self.path).path == "/api/v1/events":
            self.server.sink.clear()
            self._reply(204)
        else:
            self._refuse_other("DELETE", 404, f"no route for DELETE {urlsplit(self.path).path}")

    def _answer(
        self,
        path: str,
        status: int,
        body: Any = None,
        *,
        count: int | None = None,
        headers: dict[str, str] | None = None,
        reason: str | None = None,
    ) -> None:
        """Record the request (and log it when it is refused, or always if verbose), then reply.
        ``count``: the events the body held, when it was read as events (the log line says the
        body's size otherwise)."""
        size = int(self.headers.get("Content-Length") or 0)
        self.server.sink._record(path, status, count, reason or _reason(status, body), size=size)
        self._reply(status, body, headers)

    def _refuse_other(self, method: str, status: int, message: str) -> None:
        """A request to no route of this sink (a GET or DELETE elsewhere): logged, then 404."""
        self.server.sink._log_refused(method, urlsplit(self.path).path, status, message, None, 0)
        self._reply(status, {"code": status, "message": message})

    def do_POST(self) -> None:
        sink = self.server.sink
        with sink._lock:
            sink._active += 1
            sink.most_concurrent = max(sink.most_concurrent, sink._active)
        try:
            self._post(sink)
        finally:
            with sink._lock:
                sink._active -= 1

    def _post(self, sink: Sink) -> None:
        behaviour = sink.behaviour
        path = urlsplit(self.path).path
        sink.last_headers = dict(self.headers.items())
        length = int(self.headers.get("Content-Length") or 0)
        if behaviour.max_body is not None and length > behaviour.max_body:
            self.rfile.read(length)
            message = f"body of {length} bytes exceeds {behaviour.max_body}"
            self._answer(path, 413, {"code": 413, "message": message})
            return
        try:
            raw = self._body()
        except (OSError, EOFError) as exc:
            self._answer(path, 400, {"code": 400, "message": f"unreadable body: {exc}"})
            return
        if behaviour.delay:
            time.sleep(behaviour.delay)
        if behaviour.api_key is not None:
            given = self.headers.get("Authorization")
            if given != f"Bearer {behaviour.api_key}":
                status = 401 if given is None else 403
                reason = "no bearer token" if given is None else "wrong bearer token"
                self._answer(
                    path, status, {"code": status, "message": "missing or wrong bearer token"}, reason=reason
                )
                return
        full = behaviour.accept_most is not None and len(sink._events) >= behaviour.accept_most
        injected = 503 if full else behaviour.fail_status
        if injected is not None and (full or random.random() < behaviour.fail_rate):
            headers = {"Retry-After": behaviour.retry_after} if behaviour.retry_after else {}
            if behaviour.location:
                headers["Location"] = behaviour.location
            body = {"code": injected, "message": "injected"}
            self._answer(path, injected, body, headers=headers, reason="injected (--fail-status)")
            return
        if behaviour.poison is not None and behaviour.poison.encode() in raw:
            self._answer(path, 500, {"code": 400, "message": "Unable to process JSON"}, reason="poison")
            return
        single, batch = sink.routes()
        if path == single and behaviour.flavor == "marquez":
            status, body, event = marquez_answer(raw, self.headers.get("Content-Type"))
            if event is not None:
                sink._accept([event])
            self._answer(single, status, body, count=1 if event is not None else None)
        elif path == single:
            self._single(raw)
        elif path == batch and batch in sink.served_routes():
            self._batch(raw)
        else:
            status = behaviour.batch_missing_status if path == batch else 404
            self._answer(
                path, status, {"code": status, "message": f"HTTP {status}: no route for POST {path}"}
            )

    def _single(self, raw: bytes) -> None:
        sink = self.server.sink
        single, _ = sink.routes()
        flavor = sink.behaviour.flavor
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self._answer(single, 400, {"code": 400, "message": "Unable to process JSON"})
            return
        if flavor == "datahub":
            failure = datahub_failure(event)
            if failure is not None:  # what released DataHub throws on: a 500
                self._answer(single, 500, {"error": failure}, count=1)
                return
        if flavor == "openmetadata" and isinstance(event, dict) and not isinstance(event.get("run"), dict):
            kind = "a DatasetEvent" if "dataset" in event else "a JobEvent" if "job" in event else "an event"
            message = f"{kind} is not a RunEvent: the OpenLineage API takes run events (run is required)"
            self._answer(single, 400, {"code": 400, "message": message}, count=1)
            return
        errors = validate_event(event)
        if errors:
            self._answer(single, 422, {"code": 422, "errors": errors}, count=1)
            return
        sink._accept([event])
        if flavor == "openmetadata":
            self._answer(
                single, 200, openmetadata_single_answer(event, sink.behaviour.openmetadata_tables), count=1
            )
        else:
            self._answer(single, 200, count=1)

    def _batch(self, raw: bytes) -> None:
        sink = self.server.sink
        _, batch = sink.routes()
        openmetadata = sink.behaviour.flavor == "openmetadata"
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self._answer(batch, 400, {"code": 400, "message": "Unable to process JSON"})
            return
        # OpenMetadata's route takes {"events": [...]} only (400 for an array), the spec an array.
        events = body
        if openmetadata:
            events = body.get("events") if isinstance(body, dict) else None
        if not isinstance(events, list) or (openmetadata and not events):
            expected = (
                'an object {"events": [...]} with at least one event' if openmetadata else "a JSON array"
            )
            self._answer(batch, 400, {"code": 400, "message": f"the batch body must be {expected}"})
            return
        failed = []
        accepted = []
        retriable = 0
        for index, event in enumerate(events):
            errors = validate_event(event)
            if not errors and openmetadata and not isinstance(event.get("run"), dict):
                errors = ["not a RunEvent (run is required)"]
            if errors:
                failed.append({"index": index, "reason": "; ".join(errors), "retriable": False})
            elif sink._take_flaky():
                failed.append({"index": index, "reason": "Timeout", "retriable": True})
                retriable += 1
            else:
                accepted.append(event)
        if sink.behaviour.batch_errors == "whole" and len(failed) > retriable:
            invalid = f"{len(failed) - retriable} of {len(events)} events invalid: {failed[0]['reason']}"
            self._answer(batch, 400, b"Bad Request", count=len(events), reason=invalid)
            return
        sink._accept(accepted)
        summary = {
            "received": len(events),
            "successful": len(accepted),
            "failed": len(failed),
            "retriable": retriable,
            "non_retriable": len(failed) - retriable,
        }
        status_word = (
            "success" if not failed else ("failure" if openmetadata and not accepted else "partial_success")
        )
        answer: dict[str, Any] = {"status": status_word, "summary": summary}
        answer["failedEvents" if openmetadata else "failed_events"] = failed
        all_failed = sink.behaviour.openmetadata_all_failed_status
        status = all_failed if openmetadata and events and not accepted else 200
        reason: str | None = None
        if failed:
            reason = f"{len(failed)} of {len(events)} events failed, the first: {failed[0]['reason']}"
        self._answer(batch, status, answer, count=len(events), reason=reason)


def _reason(status: int, body: Any) -> str:
    """What an answer says, in a few words, for the request log."""
    if isinstance(body, dict):
        for key in ("errors", "message", "error"):
            value = body.get(key)
            if isinstance(value, list) and value:
                return "; ".join(str(v) for v in value)
            if isinstance(value, str) and value:
                return value
    return "ok" if status < 400 else f"HTTP {status}"


class Sink:
    """An OpenLineage HTTP backend on a local port (see the module's docstring).

    Args:
        host: interface to listen on (default loopback).
        port: port, or 0 for a free one (read it back from ``port``/``url``).
        store: also append every accepted event to this JSON-lines file.
        echo: print one line per accepted event to ``stream`` (default standard output).
        behaviour: how to answer; also settable later through ``sink.behaviour``.
        log_requests: print one line per refused request (status and reason) to ``stream``;
            ``"all"`` for accepted requests too.
        tls: serve HTTPS with this server-side context (``url`` then says ``https``).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        store: str | None = None,
        echo: bool = False,
        stream: TextIO | None = None,
        behaviour: SinkBehaviour | None = None,
        log_requests: Literal["refused", "all"] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.behaviour = behaviour or SinkBehaviour()
        self._log_requests = log_requests
        self._lock = threading.Condition()
        self._events: list[dict[str, Any]] = []
        #: (path, status, events in the request) for every POST, oldest first.
        self.requests: list[tuple[str, int, int]] = []
        #: Why each POST was answered as it was (its reason), in the order of ``requests``.
        self.reasons: list[str] = []
        #: The headers of the last POST.
        self.last_headers: dict[str, str] = {}
        #: The most POSTs being answered at once so far.
        self.most_concurrent = 0
        self._active = 0
        self._store = store
        self._echo = echo
        self._stream = stream
        self._server = _Server((host, port), _Handler)
        self._server.sink = self
        self._tls = tls is not None
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        return f"{'https' if self._tls else 'http'}://{host!s}:{self.port}"

    @property
    def active(self) -> int:
        """POSTs being answered now."""
        return self._active

    def routes(self) -> tuple[str, str]:
        """(single route, batch route) for the current flavor."""
        if self.behaviour.flavor == "openmetadata":
            return "/api/v1/openlineage/lineage", "/api/v1/openlineage/lineage/batch"
        if self.behaviour.flavor == "datahub":
            return "/openapi/openlineage/api/v1/lineage", "/openapi/openlineage/api/v1/lineage/batch"
        return "/api/v1/lineage", "/api/v1/lineage/batch"

    def served_routes(self) -> tuple[str, ...]:
        """The POST routes the current flavor serves: Marquez and released DataHub have no
        batch route, nor does ``single_only``."""
        single, batch = self.routes()
        if self.behaviour.single_only or self.behaviour.flavor in ("marquez", "datahub"):
            return (single,)
        return (single, batch)

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, args=(0.05,), name="outbox-sink", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every accepted event, oldest first (a copy)."""
        with self._lock:
            return list(self._events)

    def clear(self) -> None:
        with self._lock:
            self._events.clear()
            self.requests.clear()
            self.reasons.clear()

    def wait_for(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` events were accepted; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self._events) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    def _take_flaky(self) -> bool:
        with self._lock:
            if self.behaviour.flaky_events > 0:
                self.behaviour.flaky_events -= 1
                return True
            return False

    def _record(
        self, path: str, status: int, count: int | None = 1, reason: str = "", *, size: int = 0
    ) -> None:
        """A POST answered: in :attr:`requests` (``count`` 1 when the body was not read as
        events) and :attr:`reasons`, and logged when refused (or always, verbose)."""
        with self._lock:
            self.requests.append((path, status, 1 if count is None else count))
            self.reasons.append(reason)
        self._log_refused("POST", path, status, reason, count, size)

    def _log_refused(
        self, method: str, path: str, status: int, reason: str, count: int | None, size: int
    ) -> None:
        if not (self._log_requests == "all" or (self._log_requests == "refused" and status >= 400)):
            return
        if count is not None:
            held = f" ({count} event{'s' if count != 1 else ''})"
        else:
            held = f" ({size:,} bytes)" if size else ""
        when = datetime.now().astimezone().isoformat(timespec="seconds")
        line = f"{when}  {status} {method} {path}{held}: "
        stream = self._stream or sys.stdout
        stream.write(line + reason.replace("\n", " ")[:500] + "\n")
        stream.flush()

    def _accept(self, events: Sequence[dict[str, Any]]) -> None:
        if not events:
            return
        with self._lock:
            self._events.extend(events)
            if self._store:
                with open(self._store, "ab") as f:
                    f.write(b"".join(orjson.dumps(e) + b"\n" for e in events))
            self._lock.notify_all()
        if self._echo:
            stream = self._stream or sys.stdout
            stream.write("".join(_describe(e) + "\n" for e in events))
            stream.flush()


def _describe(event: dict[str, Any]) -> str:
    job = event.get("job") or event.get("dataset") or {}
    kind = event.get("eventType") or ("DATASET" if "dataset" in event else "JOB")
    run = (event.get("run") or {}).get("runId", "-")
    inputs = ",".join(f"{d.get('namespace')}/{d.get('name')}" for d in event.get("inputs") or [])
    line = f"{event.get('eventTime', '?')}  {kind:<8} {job.get('namespace')}/{job.get('name')}  run={run}"
    return line + (f"  inputs={inputs}" if inputs else "")
