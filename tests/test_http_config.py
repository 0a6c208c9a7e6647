"""HTTP settings from the environment, exactly as openlineage-python reads them, plus ours."""

import json
import logging

import pytest

from outbox import ConfigError, Outbox
from outbox.transports import HttpTransport

from support.helpers import run_event, wait_until


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))


def transport_from(env) -> HttpTransport:
    outbox = Outbox.from_env(env, close_at_exit=False)
    outbox.close(0)
    assert isinstance(outbox.transport, HttpTransport)
    return outbox.transport


def test_openlineage_url_alone_gives_auto_mode_on_the_spec_paths():
    t = transport_from({"OPENLINEAGE_URL": "http://marquez:5000"})
    assert t.single_url == "http://marquez:5000/api/v1/lineage"
    assert t.batch_url == "http://marquez:5000/api/v1/lineage/batch"
    assert t.mode == "auto"


def test_endpoint_and_api_key_variables():
    t = transport_from(
        {
            "OPENLINEAGE_URL": "http://om:8585",
            "OPENLINEAGE_ENDPOINT": "api/v1/openlineage/lineage",
            "OPENLINEAGE_API_KEY": "s3cr3t-key",
        }
    )
    assert t.single_url == "http://om:8585/api/v1/openlineage/lineage"
    assert t._headers["Authorization"] == "Bearer s3cr3t-key"
    assert "s3cr3t-key" not in repr(t)


def test_transport_variables_with_openlineage_and_our_keys():
    t = transport_from(
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": "https://datahub:9002/openapi/openlineage/",
            "OPENLINEAGE__TRANSPORT__ENDPOINT": "api/v1/lineage",
            "OPENLINEAGE__TRANSPORT__MODE": "batch",
            "OPENLINEAGE__TRANSPORT__BATCH_FORMAT": "array",
            "OPENLINEAGE__TRANSPORT__MAX_CONCURRENT_REQUESTS": "4",
            "OPENLINEAGE__TRANSPORT__COMPRESSION": "gzip",
            "OPENLINEAGE__TRANSPORT__CUSTOM_HEADERS": '{"X-Tenant": "t1"}',
            "OPENLINEAGE__TRANSPORT__TIMEOUT": "2.5",
            "OPENLINEAGE__TRANSPORT__VERIFY": "false",
            "OPENLINEAGE__TRANSPORT__RETRY": '{"total": 3, "backoff_factor": 0.5, "status_forcelist": [409]}',
            "OPENLINEAGE__TRANSPORT__AUTH": '{"type": "api_key", "apiKey": "k"}',
        }
    )
    assert t.single_url == "https://datahub:9002/openapi/openlineage/api/v1/lineage"
    assert t.batch_url == "https://datahub:9002/openapi/openlineage/api/v1/lineage/batch"
    assert t.mode == "batch"
    assert t.max_concurrent_requests == 4
    assert t.compression == "gzip"
    assert t._headers["X-Tenant"] == "t1"
    assert t._headers["Authorization"] == "Bearer k"
    assert t.timeout == 2.5
    assert t._verify is False
    assert t._forcelist == {409}


def test_async_http_with_its_own_keys_and_openlineage_url():
    t = transport_from(
        {
            "OPENLINEAGE_URL": "http://marquez:5000",
            "OPENLINEAGE__TRANSPORT__TYPE": "async_http",
            "OPENLINEAGE__TRANSPORT__MAX_QUEUE_SIZE": "5000",
            "OPENLINEAGE__TRANSPORT__MAX_CONCURRENT_REQUESTS": "16",
        }
    )
    assert t.single_url == "http://marquez:5000/api/v1/lineage"
    assert t.max_concurrent_requests == 16


def test_yaml_config(tmp_path):
    (tmp_path / "openlineage.yml").write_text(
        "transport:\n  type: http\n  url: http://m:5000\n  endpoint: api/v1/lineage\n  mode: single\n"
    )
    t = transport_from({})
    assert t.mode == "single"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OPENLINEAGE_URL": "marquez:5000"}, "url='marquez:5000' is not an HTTP URL"),
        ({"OPENLINEAGE__TRANSPORT__TYPE": "http"}, "the http transport needs a url: set OPENLINEAGE_URL"),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": "http://m",
                "OPENLINEAGE__TRANSPORT__MODE": "sometimes",
            },
            "OPENLINEAGE__TRANSPORT__MODE: mode='sometimes' is not a mode; use one of single, batch, auto",
        ),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": "http://m",
                "OPENLINEAGE__TRANSPORT__BATCH_FORMAT": "xml",
            },
            "OPENLINEAGE__TRANSPORT__BATCH_FORMAT: batch_format='xml' is not a format; "
            "use one of array, openmetadata",
        ),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": "http://m",
                "OPENLINEAGE__TRANSPORT__COMPRESSION": "brotli",
            },
            "OPENLINEAGE__TRANSPORT__COMPRESSION: compression='brotli' is not supported; use gzip",
        ),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": "http://m",
                "OPENLINEAGE__TRANSPORT__TIMEOUT": "-1",
            },
            "OPENLINEAGE__TRANSPORT__TIMEOUT=-1 is not a positive number of seconds",
        ),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": "http://m",
                "OPENLINEAGE__TRANSPORT__MAX_CONCURRENT_REQUESTS": "0",
            },
            "OPENLINEAGE__TRANSPORT__MAX_CONCURRENT_REQUESTS=0 is not an integer >= 1",
        ),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": "http://m",
                "OPENLINEAGE__TRANSPORT__AUTH": '{"type": "jwt", "apiKey": "sekrit"}',
            },
            "OPENLINEAGE__TRANSPORT__AUTH: openlineage-python cannot build the 'jwt' token provider: "
            "KeyError: 'tokenEndpoint is required",
        ),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": "http://m",
                "OPENLINEAGE__TRANSPORT__AUTH": '{"type": "api_key"}',
            },
            "OPENLINEAGE__TRANSPORT__AUTH: auth type api_key needs apiKey",
        ),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": "http://m",
                "OPENLINEAGE__TRANSPORT__RETRY": "3",
            },
            "OPENLINEAGE__TRANSPORT__RETRY=3 must be a mapping of urllib3 Retry keywords",
        ),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": "https://m",
                "OPENLINEAGE__TRANSPORT__VERIFY": "/nonexistent/ca.pem",
            },
            "OPENLINEAGE__TRANSPORT__VERIFY='/nonexistent/ca.pem': there is no such CA bundle",
        ),
        (
            {"OPENLINEAGE__TRANSPORT__TYPE": "kafka"},
            "the kafka transport needs a topic: set OPENLINEAGE__TRANSPORT__TOPIC",
        ),
    ],
)
def test_invalid_http_settings_name_the_variable_and_never_the_key(env, message):
    with pytest.raises(ConfigError, match=message) as info:
        Outbox.from_env(env, close_at_exit=False)
    assert "sekrit" not in str(info.value)


def test_the_api_key_never_appears_in_logs(caplog):
    with caplog.at_level(logging.DEBUG):
        outbox = Outbox.from_env(
            {"OPENLINEAGE_URL": "http://127.0.0.1:1", "OPENLINEAGE_API_KEY": "sekrit-key"},
            close_at_exit=False,
            backoff_base=0.01,
            backoff_cap=0.01,
            linger=0,
        )
        outbox.emit({"eventType": "START", "run": {"runId": "r"}, "job": {"namespace": "n", "name": "j"}})
        # Once the sidecar has tried and failed (and logged it): not "0.3 s later", when beside
        # load it may not have tried yet, and the logs checked below would hold nothing.
        assert wait_until(lambda: outbox.stats().last_error is not None, 5)
        report = outbox.close(0.2)
    assert report.delivered == 0
    assert "sekrit-key" not in caplog.text
    assert "sekrit-key" not in repr(outbox)
    assert "sekrit-key" not in (outbox.stats().last_error or "")


def test_unknown_keys_are_warned_about_and_name_and_priority_dropped(caplog):
    """openlineage-python ignores keys it does not know and drops name and priority: the
    same configuration must not fail here (a warning names the key and the closest one)."""
    env = {
        "OPENLINEAGE__TRANSPORT__TYPE": "http",
        "OPENLINEAGE__TRANSPORT__URL": "http://m",
        "OPENLINEAGE__TRANSPORT__NAME": "primary",
        "OPENLINEAGE__TRANSPORT__PRIORITY": "1",
        "OPENLINEAGE__TRANSPORT__ENDPIONT": "api/v2/lineage",
    }
    with caplog.at_level(logging.WARNING, logger="outbox"):
        outbox = Outbox.from_env(env, close_at_exit=False)
    warning = "OPENLINEAGE__TRANSPORT__ENDPIONT: 'endpiont' is not an HTTP transport setting (ignored)"
    assert f"{warning}; did you mean endpoint?" in caplog.text
    assert "'name'" not in caplog.text
    assert "'priority'" not in caplog.text
    assert outbox.transport.single_url == "http://m/api/v1/lineage"
    outbox.close(0)


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


# -- header values a request cannot carry --------------------------------------------------

# Each secret is refused whole; none of its parts may appear in the message.
UNSENDABLE = ["sécret-key-1", "s3cret\u00a0key", "ключ-s3cret", "s3cret\nkey", "s3cret\x7fkey"]


def assert_hidden(text: str, secret: str) -> None:
    for part in ("s3cret", "cret-key", "ключ", "key-1"):
        if part in secret:
            assert part not in text, text


@pytest.mark.parametrize("secret", UNSENDABLE)
@pytest.mark.parametrize(
    ("how", "named"),
    [
        ("keyword", "api_key"),
        ("OPENLINEAGE_API_KEY", "OPENLINEAGE_API_KEY"),
        ("OPENLINEAGE__TRANSPORT__AUTH", "OPENLINEAGE__TRANSPORT__AUTH"),
        ("custom_headers", "'X-Api-Key'"),
    ],
)
def test_a_secret_a_header_cannot_carry_is_a_config_error_naming_the_setting_not_the_value(
    secret, how, named
):
    def build() -> object:
        if how == "keyword":
            return HttpTransport("http://127.0.0.1:9", api_key=secret)
        if how == "custom_headers":
            return HttpTransport("http://127.0.0.1:9", custom_headers={"X-Api-Key": secret})
        if how == "OPENLINEAGE_API_KEY":
            return Outbox.from_env(
                {"OPENLINEAGE_URL": "http://127.0.0.1:9", how: secret}, close_at_exit=False
            )
        env = {
            "OPENLINEAGE__TRANSPORT__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__URL": "http://127.0.0.1:9",
            how: json.dumps({"type": "api_key", "apiKey": secret}),
        }
        return Outbox.from_env(env, close_at_exit=False)

    with pytest.raises(ConfigError) as caught:
        build()
    message = str(caught.value)
    assert named in message
    assert "cannot carry" in message or "control character" in message
    assert "not shown" in message
    assert_hidden(message, secret)


@pytest.mark.parametrize("name", ["X-Kéy", "X Key", "X-Key\n", ""])
def test_a_custom_header_name_that_is_not_one_is_a_config_error(name):
    with pytest.raises(ConfigError, match="is not an HTTP header name"):
        HttpTransport("http://127.0.0.1:9", custom_headers={name: "v"})


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
    from outbox._log import RateLimitFilter

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
