"""HTTP credentials and headers set in the environment, as openlineage-python reads them, checked
at a real backend on loopback (`outbox sink`, a token endpoint): openlineage-python's token
providers, custom headers, and tokens a header cannot carry, never logged.  (The settings as
read, without a backend: tests/unit/config/test_http_config.py.)"""

import json
import logging

import pytest

from outbox import Outbox
from outbox.transports import HttpTransport

from support.helpers import run_event, wait_until


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))


class TokenEndpoint:
    """A token endpoint on loopback, as an identity provider answers (JSON with the token), or
    one in trouble answering ``status`` with no token and a new reason phrase each time."""

    def __init__(self, field: str, token: str, status: int = 200) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                endpoint.forms.append(self.rfile.read(length).decode())
                endpoint.authorizations.append(self.headers.get("Authorization"))
                body = json.dumps({field: token, "expires_in": 3600} if status == 200 else {}).encode()
                # In trouble, a reason that differs every time, as a gateway quoting a request id.
                self.send_response(status, None if status == 200 else f"Down (request {len(endpoint.forms)})")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.forms: list[str] = []
        self.authorizations: list[str | None] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.parametrize(
    ("auth", "field"),
    [
        ({"type": "jwt", "apiKey": "ibm-key"}, "token"),
        ({"type": "oauth2", "clientId": "lineage", "clientSecret": "s3cret"}, "access_token"),
    ],
)
def test_jwt_and_oauth2_through_openlineage_pythons_token_providers(auth, field):
    """The bearer token comes from openlineage-python's own provider, fetched in the sidecar
    (never on the caller's thread) and cached by it: one token request for many events."""
    import json

    from outbox.tools.sink import Sink, SinkBehaviour

    endpoint = TokenEndpoint(field, "short-lived-token")
    with Sink(behaviour=SinkBehaviour(api_key="short-lived-token")) as sink:
        env = {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": sink.url,
            "OPENLINEAGE__TRANSPORT__MODE": "single",
            "OPENLINEAGE__TRANSPORT__AUTH": json.dumps({**auth, "tokenEndpoint": endpoint.url}),
        }
        outbox = Outbox.from_env(env, linger=0, close_at_exit=False)
        for n in range(3):
            outbox.emit(run_event(n=n))
        report = outbox.close(10)
        assert report.delivered == 3, (report, outbox.stats())
        assert "short-lived-token" not in repr(outbox)
    endpoint.server.shutdown()
    assert len(endpoint.forms) == 1  # cached by the provider
    if auth["type"] == "jwt":
        assert "apikey=ibm-key" in endpoint.forms[0]
    else:
        assert endpoint.authorizations[0].startswith("Basic ")  # client_secret_basic


def test_custom_headers_override_the_auth_header_as_in_openlineage_python():
    from outbox.tools.sink import Sink

    with Sink() as sink:
        transport = HttpTransport(
            sink.url, api_key="k", custom_headers={"authorization": "Basic dXNlcjpwdw=="}
        )
        outbox = Outbox(transport, close_at_exit=False)
        outbox.emit(run_event())
        assert outbox.close(5).delivered == 1
        headers = {k.lower(): v for k, v in sink.last_headers.items()}
    assert headers["authorization"] == "Basic dXNlcjpwdw=="


def test_a_plain_custom_header_with_inner_spaces_and_a_tab_is_sent():
    from outbox.tools.sink import Sink

    with Sink() as sink:
        value = "a value\twith spaces"
        outbox = Outbox(HttpTransport(sink.url, custom_headers={"X-Note": value}), close_at_exit=False)
        outbox.emit(run_event())
        assert outbox.close(5).delivered == 1
        assert sink.last_headers["X-Note"] == value


def outbox_records(caplog) -> str:
    return "\n".join(
        f"{r.levelname} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records if r.name == "outbox"
    )


def test_a_token_a_header_cannot_carry_is_never_logged_and_the_events_are_counted(caplog):
    """openlineage-python's jwt provider, fed a token with a non-ASCII letter by its endpoint:
    the transport does not raise (the worker would log the exception's text, token and all),
    keeps the events, says what is wrong without the token, and close counts them."""
    from outbox.tools.sink import Sink

    endpoint = TokenEndpoint("token", "tökén-s3cret-token")
    with Sink() as sink:
        env = {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": sink.url,
            "OPENLINEAGE__TRANSPORT__AUTH": json.dumps(
                {"type": "jwt", "apiKey": "ibm-key", "tokenEndpoint": endpoint.url}
            ),
        }
        with caplog.at_level(logging.DEBUG):
            outbox = Outbox.from_env(env, linger=0, backoff_base=0.01, backoff_cap=0.05, close_at_exit=False)
            outbox.emit(run_event())
            assert wait_until(lambda: outbox.stats().retried >= 2, 10)
            last_error = outbox.stats().last_error or ""
            report = outbox.close(0.5)
        assert sink.events == []
    endpoint.server.shutdown()
    assert report.undelivered == {"dropped_shutdown": 1}
    assert "cannot be sent in an HTTP header" in last_error
    assert "JwtTokenProvider" in last_error
    logged = outbox_records(caplog)
    assert "cannot be sent in an HTTP header" in logged
    assert "raised" not in logged  # not the worker's "transport raised" with its exception text
    for seen in (logged, last_error, repr(outbox)):
        assert "s3cret" not in seen
        assert "tökén" not in seen


OPENLINEAGE_LOGGER = "openlineage.client.transport.http"


@pytest.fixture
def fresh_openlineage_log_limit():
    """The rate limit on openlineage-python's HTTP logger lasts for the process (it is added
    once, by the first token provider built): forget what it let through, so that a test
    expecting one of its records does not depend on which test ran before it."""
    from outbox._observability._log import RateLimitFilter

    for kept in logging.getLogger(OPENLINEAGE_LOGGER).filters:
        if isinstance(kept, RateLimitFilter):
            kept._last.clear()


def test_a_token_endpoint_that_fails_is_retried_without_its_credentials_in_the_log(
    caplog, fresh_openlineage_log_limit
):
    """A token endpoint that refuses connections, named with a password in its URL: the
    provider's error (which quotes the URL) reaches the outbox's log and stats redacted."""
    from outbox.tools.sink import Sink

    from support.helpers import refused_port

    endpoint = f"http://svc:pw-s3cret@127.0.0.1:{refused_port()}/token"
    with Sink() as sink:
        env = {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": sink.url,
            "OPENLINEAGE__TRANSPORT__AUTH": json.dumps(
                {"type": "jwt", "apiKey": "ibm-s3cret-key", "tokenEndpoint": endpoint}
            ),
        }
        with caplog.at_level(logging.DEBUG):
            outbox = Outbox.from_env(env, linger=0, backoff_base=0.01, backoff_cap=0.05, close_at_exit=False)
            outbox.emit(run_event())
            assert wait_until(lambda: outbox.stats().retried >= 2, 20)
            last_error = outbox.stats().last_error or ""
            outbox.close(0.5)
    assert "JwtTokenProvider" in last_error
    assert "svc:***@127.0.0.1" in last_error
    logged = outbox_records(caplog)
    assert "raised" not in logged
    # openlineage-python's provider logs its failure too, under its own logger: redacted as well.
    theirs = [r.getMessage() for r in caplog.records if r.name.startswith("openlineage")]
    assert any("svc:***@127.0.0.1" in text for text in theirs)
    for seen in (logged, last_error, *theirs):
        assert "s3cret" not in seen


@pytest.mark.parametrize("down", ["refused", "500"])
def test_a_token_endpoint_that_stays_down_is_logged_by_openlineage_python_at_a_bounded_rate(
    caplog, down, fresh_openlineage_log_limit
):
    """openlineage-python's provider logs an ERROR for every failed fetch, and the outbox asks
    it for a token before every attempt: over 40 retries, its logger gives one record (per
    message template and 30 s), not one per retry, still without the endpoint's password.
    The 500s' texts differ from one attempt to the next: bounded all the same, because the
    limit keys on the template, before the redacting filter replaces it with the text."""
    from outbox.tools.sink import Sink

    from support.helpers import refused_port

    if down == "refused":
        auth = {"type": "jwt", "apiKey": "ibm-s3cret-key"}
        port = refused_port()
    else:
        auth = {"type": "oauth2", "clientId": "lineage", "clientSecret": "client-s3cret"}
        failing = TokenEndpoint("access_token", "unused", status=500)
        port = failing.server.server_address[1]
    auth["tokenEndpoint"] = f"http://svc:pw-s3cret@127.0.0.1:{port}/token"
    with Sink() as sink:
        env = {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": sink.url,
            "OPENLINEAGE__TRANSPORT__AUTH": json.dumps(auth),
        }
        with caplog.at_level(logging.DEBUG):
            outbox = Outbox.from_env(env, linger=0, backoff_base=0.01, backoff_cap=0.02, close_at_exit=False)
            outbox.emit(run_event())
            assert wait_until(lambda: outbox.stats().retried >= 40, 30)
            outbox.close(0.5)
        assert sink.events == []
    retried = outbox.stats().retried
    if down == "500":
        failing.server.shutdown()
        assert len(failing.forms) >= 40  # each retry did ask the endpoint
    theirs = [r for r in caplog.records if r.name == OPENLINEAGE_LOGGER and r.levelno >= logging.ERROR]
    assert len(theirs) == 1, f"{len(theirs)} records from {OPENLINEAGE_LOGGER} over {retried} retries"
    text = theirs[0].getMessage()
    assert "svc:***@127.0.0.1" in text
    assert "s3cret" not in text
