"""HTTP settings from the environment, exactly as openlineage-python reads them, plus ours (what
they do at a real backend: tests/integration/transports/test_http_auth.py)."""

import json
import logging

import pytest

from outbox import ConfigError, Outbox
from outbox.transports import HttpTransport

from support import parts
from support.helpers import wait_until


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
    assert parts.http_headers(t)["Authorization"] == "Bearer s3cr3t-key"
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
    assert parts.http_headers(t)["X-Tenant"] == "t1"
    assert parts.http_headers(t)["Authorization"] == "Bearer k"
    assert t.timeout == 2.5
    assert parts.http_verify(t) is False
    assert parts.http_forcelist(t) == {409}


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
    ("kind", "use"), [("apikey", "'api_key' (did you mean it?)"), ("bearer", "api_key, jwt or oauth2")]
)
def test_an_auth_type_openlineage_python_does_not_know_is_named_with_the_ones_it_does(capfd, kind, use):
    """helper-37: ``apikey`` went to openlineage-python as a module path: an ImportError about
    importing "apikey", after a stray "not enough values to unpack" line on stderr."""
    env = {
        "OPENLINEAGE__TRANSPORT__TYPE": "http",
        "OPENLINEAGE__TRANSPORT__URL": "http://m:5000",
        "OPENLINEAGE__TRANSPORT__AUTH__TYPE": kind,
        "OPENLINEAGE__TRANSPORT__AUTH__APIKEY": "secret-value",
    }
    with pytest.raises(ConfigError) as raised:
        Outbox.from_env(env, close_at_exit=False)
    assert str(raised.value) == (
        f"OPENLINEAGE__TRANSPORT__AUTH__TYPE={kind!r} is not a token provider: use {use}, or the "
        "module.Class of your own TokenProvider"
    )
    assert "unpack" not in capfd.readouterr().err


def test_a_yaml_timeout_that_yaml_reads_as_text_says_so(tmp_path):
    """helper-37: YAML reads ``1e-9`` (no dot) as text; "'1e-9' is not a positive number of
    seconds" left the user looking at a positive number."""
    config = tmp_path / "openlineage.yml"
    config.write_text("transport:\n  type: http\n  url: http://m:5000\n  timeout: 1e-9\n")
    with pytest.raises(ConfigError) as raised:
        Outbox.from_env({"OPENLINEAGE_CONFIG": str(config)}, close_at_exit=False)
    assert str(raised.value) == (
        f"{config}: transport.timeout='1e-9' is not a positive number of seconds; it is text, not a "
        "number: write it without quotes (an exponent needs a dot: 1.0e-3)"
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OPENLINEAGE_URL": "marquez:5000"}, "url='marquez:5000' is not an HTTP URL"),
        (
            {"OPENLINEAGE__TRANSPORT__TYPE": "http"},
            "the http transport needs a url: set OPENLINEAGE__TRANSPORT__URL ",
        ),
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
        (  # helper-37: the value is read as JSON (as openlineage-python reads it): it said "needs a topic"
            {"OPENLINEAGE__TRANSPORT__TYPE": "kafka", "OPENLINEAGE__TRANSPORT__TOPIC": "123"},
            "OPENLINEAGE__TRANSPORT__TOPIC=123 is read as a number, not a topic name; quote it "
            """\\(OPENLINEAGE__TRANSPORT__TOPIC='"123"'""",
        ),
        # Refused at construction, not a lookup that fails at every send.
        (
            {"OPENLINEAGE_URL": "http://<lineage host>:5000"},  # function/lineage-demo.yaml's placeholder
            r"url='http://<lineage host>:5000' has no host name there \('<lineage host>'\)",
        ),
        ({"OPENLINEAGE_URL": "http://:5000"}, "url='http://:5000' has no host name there"),
        ({"OPENLINEAGE_URL": "http://my host:5000"}, "url='http://my host:5000' has no host name there"),
        ({"OPENLINEAGE_URL": "http://m:5000/ api"}, "url='http://m:5000/ api' holds a space"),
        ({"OPENLINEAGE_URL": "http://[::1"}, r"url='http://\[::1' is not an HTTP URL"),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__URL": "http://m",
                "OPENLINEAGE__TRANSPORT__TIMEOUT": "NaN",  # (JSON: a float)
            },
            "OPENLINEAGE__TRANSPORT__TIMEOUT: timeout=nan is not a positive number of seconds",
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


@pytest.mark.parametrize(
    "url", ["http://[::1]:5000", "http://marquez_1:5000", "http://müller.example:5000", "https://u:p@m/api"]
)
def test_urls_with_hosts_httpx_reaches_are_accepted(url):
    assert HttpTransport(url).url


def test_a_secret_that_is_not_text_is_a_config_error_naming_it():
    # It was an AttributeError ('int' object has no attribute 'strip') out of the constructor.
    with pytest.raises(
        ConfigError, match=r"api_key \(OPENLINEAGE_API_KEY or auth.apiKey\) is of type int, not text"
    ):
        HttpTransport("http://m:5000", api_key=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["apiKey", "apikey", "api_key"])
def test_an_api_key_that_no_header_can_carry_is_named_as_it_was_written(tmp_path, field):
    """The key's setting is named by the key it was written under (openlineage-python reads all
    three), in the file that holds it."""
    config = tmp_path / "openlineage.yml"
    config.write_text(
        "transport:\n  type: http\n  url: http://m:5000\n"
        f'  auth:\n    type: api_key\n    {field}: "k\\nX-Injected: 1"\n'
    )
    with pytest.raises(ConfigError) as raised:
        Outbox.from_env({"OPENLINEAGE_CONFIG": str(config)}, close_at_exit=False)
    assert str(raised.value).startswith(f"{config}: transport.auth.{field} contains a control character")
    assert "X-Injected" not in str(raised.value)
