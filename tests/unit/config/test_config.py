"""Outbox.from_env(): openlineage-python's rules for the transport, OUTBOX_* for our knobs."""

import json
import logging
import re

import pytest

from outbox import ConfigError, Outbox
from outbox.transports import ConsoleTransport, FileTransport

from support import parts


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    # No openlineage.yml from the working directory or the home folder.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))


def from_env(env, **kw) -> Outbox:
    return Outbox.from_env(env, close_at_exit=False, **kw)


def test_outbox_variables_set_the_knobs():
    outbox = from_env(
        {
            "OUTBOX_MAX_EVENTS": "2000",
            "OUTBOX_MAX_BYTES": "8MiB",
            "OUTBOX_POLICY": "drop_newest",
            "OUTBOX_MAX_BATCH_EVENTS": "50",
            "OUTBOX_MAX_BATCH_BYTES": "512KiB",
            "OUTBOX_LINGER": "0.25",
            "OUTBOX_SHUTDOWN_TIMEOUT": "2",
            "OUTBOX_NAME": "fn",
        }
    )
    assert parts.limits(outbox).max_events == 2000
    assert parts.limits(outbox).max_bytes == 8 * 1024 * 1024
    assert parts.limits(outbox).policy.value == "drop_newest"
    assert parts.settings(outbox).max_batch_events == 50
    assert parts.settings(outbox).max_batch_bytes == 512 * 1024
    assert parts.settings(outbox).linger == 0.25
    assert parts.shutdown_timeout(outbox) == 2.0
    assert parts.name(outbox) == "fn"
    outbox.close(0)


def test_keyword_arguments_override_variables():
    outbox = from_env({"OUTBOX_MAX_EVENTS": "2000"}, max_events=30)
    assert parts.limits(outbox).max_events == 30
    outbox.close(0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OUTBOX_MAX_EVENTS": "lots"}, "OUTBOX_MAX_EVENTS='lots' is not a whole number"),
        ({"OUTBOX_MAX_EVENTS": "0"}, "OUTBOX_MAX_EVENTS: max_events=0 is out of range"),
        (
            {"OUTBOX_MAX_BYTES": "64 parsecs"},
            "OUTBOX_MAX_BYTES='64 parsecs' is not a size; use a whole number of bytes, or e.g. 512KiB",
        ),
        (
            {"OUTBOX_POLICY": "drop_all"},
            "OUTBOX_POLICY: 'drop_all' is not a policy; use one of drop_oldest, drop_newest, block",
        ),
        ({"OUTBOX_LINGER": "soon"}, "OUTBOX_LINGER='soon' is not a number of seconds"),
        ({"OUTBOX_LINGER": "nan"}, "OUTBOX_LINGER='nan' is not a finite number"),
        (
            {"OUTBOX_CLOSE_AT_EXIT": "maybe"},
            "OUTBOX_CLOSE_AT_EXIT='maybe' is not a boolean; use true or false",
        ),
        (
            {"OPENLINEAGE__TRANSPORT__TYPE": "carrier_pigeon"},
            "OPENLINEAGE__TRANSPORT__TYPE='carrier_pigeon' is not a transport lineage-outbox supports",
        ),
        ({"OPENLINEAGE__TRANSPORT__TYPE": "file"}, "the file transport needs a log_file_path"),
        (
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "file",
                "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": "x",
                "OPENLINEAGE__TRANSPORT__APPEND": '{"sometimes": true}',
            },
            "OPENLINEAGE__TRANSPORT__APPEND={'sometimes': True} is not a boolean",
        ),
    ],
)
def test_invalid_values_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        from_env(env)


def test_file_transport_from_variables(tmp_path):
    outbox = from_env(
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "file",
            "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": str(tmp_path / "ol.jsonl"),
            "OPENLINEAGE__TRANSPORT__APPEND": "true",
        }
    )
    assert isinstance(outbox.transport, FileTransport)
    assert outbox.transport.append is True
    outbox.emit({"eventType": "START"})
    outbox.close(2)
    assert json.loads((tmp_path / "ol.jsonl").read_text()) == {"eventType": "START"}


def test_whole_object_variable_wins(tmp_path):
    outbox = from_env(
        {
            "OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(tmp_path / "a"), "append": True}
            ),
            "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": str(tmp_path / "b"),
        }
    )
    assert outbox.transport.log_file_path == str(tmp_path / "a")
    outbox.close(0)


def test_yaml_file_from_openlineage_config_wins_over_variables(tmp_path):
    config = tmp_path / "ol.yml"
    config.write_text(
        f"transport:\n  type: file\n  log_file_path: {tmp_path / 'from-yaml'}\n  append: true\n"
    )
    outbox = from_env(
        {
            "OPENLINEAGE_CONFIG": str(config),
            "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": str(tmp_path / "from-env"),
        }
    )
    assert outbox.transport.log_file_path == str(tmp_path / "from-yaml")
    outbox.close(0)


def test_openlineage_yml_in_working_directory_is_found(tmp_path):
    (tmp_path / "openlineage.yml").write_text(
        f"transport:\n  type: file\n  log_file_path: {tmp_path / 'cwd'}\n"
    )
    outbox = from_env({})
    assert isinstance(outbox.transport, FileTransport)
    assert outbox.transport.append is False
    outbox.close(0)


@pytest.mark.parametrize(
    ("content", "logged"),
    [
        (None, "OPENLINEAGE_CONFIG=.*missing.yml' is not a readable file; ignored"),
        ("transport: [unclosed\n", "cannot read the OpenLineage config file .*broken.yml"),
        ("- a list\n", "must hold a mapping, not list"),
        ("", "is empty"),
    ],
    ids=["missing", "bad-yaml", "not-a-mapping", "empty"],
)
def test_an_unusable_config_file_is_logged_and_the_next_rule_applies(tmp_path, caplog, content, logged):
    """openlineage-python logs these and goes on (a lineage misconfiguration must not fail a
    function's init): so does from_env, and OPENLINEAGE_URL then applies."""
    path = tmp_path / ("missing.yml" if content is None else "broken.yml")
    if content is not None:
        path.write_text(content)
    with caplog.at_level(logging.ERROR, logger="outbox"):
        outbox = from_env({"OPENLINEAGE_CONFIG": str(path), "OPENLINEAGE_URL": "http://marquez:5000"})
    assert re.search(logged, caplog.text), caplog.text
    assert outbox.transport.single_url == "http://marquez:5000/api/v1/lineage"
    outbox.close(0)


def test_nothing_configured_falls_back_to_console_with_a_warning(caplog, capsys):
    with caplog.at_level(logging.WARNING, logger="outbox"):
        outbox = from_env({})
    assert isinstance(outbox.transport, ConsoleTransport)
    assert "no OpenLineage transport is configured" in caplog.text
    outbox.emit({"eventType": "START"})
    outbox.close(2)
    assert json.loads(capsys.readouterr().out) == {"eventType": "START"}


@pytest.mark.parametrize(
    ("yaml_text", "env", "said"),
    [
        ("transport:\n  url: http://m:5000\n", {}, "openlineage.yml's transport has no type (its keys: url)"),
        ("trasnport:\n  type: http\n", {}, "openlineage.yml has no transport mapping (keys trasnport; write"),
        ("transport:\n  - type: http\n", {}, "no transport mapping (a transport that is a list; write"),
        (None, {"OPENLINEAGE_ULR": "http://m:5000"}, "OPENLINEAGE_ULR is set: did you mean OPENLINEAGE_URL?"),
        (None, {"OPENLINEAGE_TRANSPORT_TYPE": "http"}, "did you mean OPENLINEAGE__TRANSPORT__TYPE?"),
        (
            None,
            {"OPENLINEAGE__TRANSPORT__URL": "http://m:5000"},
            "OPENLINEAGE__TRANSPORT__* settings are set without OPENLINEAGE__TRANSPORT__TYPE",
        ),
    ],
)
def test_the_console_fallback_names_what_was_there_and_configured_nothing(
    tmp_path, monkeypatch, caplog, yaml_text, env, said
):
    # It said "no OpenLineage transport is configured (..., openlineage.yml)" beside a file
    # named so in the working directory, or a variable one letter off.
    monkeypatch.chdir(tmp_path)
    if yaml_text is not None:
        (tmp_path / "openlineage.yml").write_text(yaml_text)
    with caplog.at_level(logging.WARNING, logger="outbox"):
        outbox = from_env(env)
    outbox.close(0)
    assert isinstance(outbox.transport, ConsoleTransport)
    warned = [r.getMessage() for r in caplog.records if "no OpenLineage transport" in r.getMessage()]
    assert len(warned) == 1, warned
    assert said in warned[0], warned


def test_the_console_fallback_takes_other_openlineage_variables_for_what_they_are(caplog):
    with caplog.at_level(logging.WARNING, logger="outbox"):
        outbox = from_env({"OPENLINEAGE_ENDPOINT": "api/v1/lineage", "OPENLINEAGE_API_KEY": "k"})
    outbox.close(0)
    assert (
        "no OpenLineage transport is configured (OPENLINEAGE_URL, OPENLINEAGE__TRANSPORT__TYPE, "
        "openlineage.yml); lineage events" in caplog.text
    )


@pytest.mark.parametrize("value", ["true", " TRUE ", "True"])
def test_openlineage_disabled_accepts_nothing_and_counts_it(value):
    """The close report of an outbox that is disabled says what it refused, apart: nothing was
    emitted into it, nothing lost (#39: it read emitted=0 beside undelivered disabled: 1, lost
    1 and not complete, as if an event had vanished)."""
    outbox = from_env({"OPENLINEAGE_DISABLED": value, "OPENLINEAGE_URL": "http://localhost:1"})
    assert outbox.emit({"eventType": "START"}) is False
    assert outbox.emit({"eventType": "COMPLETE"}) is False
    assert outbox.stats().dropped == {"disabled": 2}
    report = outbox.close(1)
    assert (report.emitted, report.delivered, dict(report.undelivered)) == (0, 0, {})
    assert report.disabled == 2
    assert report.lost == 0
    assert report.complete
    assert "disabled=2" in repr(report)


def test_openlineage_disabled_false_is_not_disabled(tmp_path):
    outbox = from_env(
        {
            "OPENLINEAGE_DISABLED": "false",
            "OPENLINEAGE__TRANSPORT__TYPE": "file",
            "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": str(tmp_path / "x"),
        }
    )
    assert outbox.emit({"eventType": "START"})
    outbox.close(1)


def test_resolution_follows_openlineage_python_for_url_and_async_http():
    from outbox._config._config import resolve_transport_config

    plain = resolve_transport_config(
        {"OPENLINEAGE_URL": "http://m:5000", "OPENLINEAGE_ENDPOINT": "api/v2/x", "OPENLINEAGE_API_KEY": "k"}
    )
    assert plain.config == {
        "type": "http",
        "url": "http://m:5000",
        "endpoint": "api/v2/x",
        "auth": {"type": "api_key", "apiKey": "k"},
    }
    aliased = resolve_transport_config(
        {"OPENLINEAGE_URL": "http://m:5000", "OPENLINEAGE__TRANSPORT__TYPE": "async_http"}
    )
    assert aliased.config == {"type": "async_http", "url": "http://m:5000"}
    assert aliased.origin("url") == "OPENLINEAGE_URL"
    # Explicit transport config wins over OPENLINEAGE_URL.
    explicit = resolve_transport_config(
        {"OPENLINEAGE_URL": "http://m:5000", "OPENLINEAGE__TRANSPORT__TYPE": "console"}
    )
    assert explicit.config == {"type": "console"}
    # Values parse as JSON when they parse.
    parsed = resolve_transport_config(
        {
            "OPENLINEAGE__TRANSPORT__TYPE": "kafka",
            "OPENLINEAGE__TRANSPORT__CONFIG": '{"acks": "all"}',
            "OPENLINEAGE__TRANSPORT__FLUSH": "false",
        }
    )
    assert parsed.config == {"type": "kafka", "config": {"acks": "all"}, "flush": False}


def test_an_unknown_outbox_variable_is_warned_about_once_and_ignored(caplog):
    environ = {"OUTBOX_MAX_EVENT": "10", "OUTBOX_RELAY_TOPIC": "orders", "OUTBOX_LINGER": "0.5"}
    with caplog.at_level("WARNING", logger="outbox"):
        outbox = Outbox.from_env(environ, close_at_exit=False)
        Outbox.from_env(environ, close_at_exit=False).close(0)
    outbox.close(0)
    warnings = [r.getMessage() for r in caplog.records if "not a lineage-outbox setting" in r.getMessage()]
    assert any("OUTBOX_MAX_EVENT " in w and "did you mean OUTBOX_MAX_EVENTS?" in w for w in warnings)
    assert any("OUTBOX_RELAY_TOPIC" in w for w in warnings)  # (another library's, maybe)
    assert len(warnings) == 2  # once each, however many outboxes
