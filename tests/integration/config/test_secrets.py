"""Secrets a header cannot carry, through the transports openlineage-python builds behind the
outbox (datadog, transform, a custom class): refused at construction naming the setting, or,
when only sending finds them, never quoted in a log line, ``stats()`` or the command's output."""

import json
import os
import subprocess
import sys

import pytest

from outbox import ConfigError, Outbox

from support.helpers import refused_port
from support.paths import TESTS

KEY = "dd-KEY-5a1e0b"


def clean_env(**env: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    return {**kept, "PYTHONPATH": str(TESTS), **env}


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (KEY + "\nX-Injected: 1", "a control character"),
        ("ключ-" + KEY, "a character an HTTP header cannot carry"),
    ],
)
def test_outbox_check_refuses_a_datadog_api_key_a_header_cannot_carry_naming_the_variable_only(key, problem):
    env = clean_env(
        OPENLINEAGE__TRANSPORT__TYPE="datadog",
        OPENLINEAGE__TRANSPORT__APIKEY=key,
        OPENLINEAGE__TRANSPORT__SITE=f"http://127.0.0.1:{refused_port()}",
    )
    done = subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", "check", "--timeout", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"FAIL  config     OPENLINEAGE__TRANSPORT__APIKEY contains {problem}" in output
    assert "Traceback" not in output
    for part in (KEY, "ключ", "X-Injected"):
        assert part not in output


CASES = [
    ({"custom_headers": {"x_token": "é" + KEY}}, "contains a character an HTTP header cannot carry"),
    ({"auth": {"type": "api_key", "api_key": KEY + "\x00"}}, "contains a control character"),
    ({"apiKey": KEY + "\n" + KEY}, "contains a control character"),
]


@pytest.mark.parametrize(("config", "said"), CASES)
def test_a_header_secret_in_an_openlineage_python_config_is_a_config_error_naming_it(config, said):
    # Directly (datadog), and nested in a transform transport's inner transport.
    inner = {"type": "datadog", "site": "http://127.0.0.1:1", **config}
    direct = {f"OPENLINEAGE__TRANSPORT__{k.upper()}": json.dumps(v) for k, v in inner.items()}
    nested = {
        "OPENLINEAGE__TRANSPORT__TYPE": "transform",
        "OPENLINEAGE__TRANSPORT__TRANSFORMER_CLASS": "support.ol_transports.RenameJob",
        "OPENLINEAGE__TRANSPORT__TRANSPORT": json.dumps(inner),
    }
    key = next(iter(config))
    for environ, setting in (
        (direct, f"OPENLINEAGE__TRANSPORT__{key.upper()}"),
        (nested, "OPENLINEAGE__TRANSPORT__TRANSPORT: "),
    ):
        with pytest.raises(ConfigError) as raised:
            Outbox.from_env(environ, close_at_exit=False)
        message = str(raised.value)
        assert message.startswith(setting), message
        assert said in message
        assert "(the value is not shown)" in message
        assert KEY not in message


def test_an_api_key_ending_in_a_newline_is_stripped_as_httptransport_strips_it():
    env = {
        "OPENLINEAGE__TRANSPORT__TYPE": "datadog",
        "OPENLINEAGE__TRANSPORT__SITE": "http://127.0.0.1:1",
        "OPENLINEAGE__TRANSPORT__APIKEY": KEY + "\n",
    }
    outbox = Outbox.from_env(env, close_at_exit=False)
    try:
        assert outbox.transport.transport.config.apiKey == KEY
    finally:
        outbox.close(0)


def test_a_token_only_sending_finds_unsendable_is_never_quoted_in_a_log_line_or_stats(tmp_path):
    # openlineage-python's HTTP transport (inside a transform transport) with a custom token
    # provider whose token ends in a line break: requests refuses the header, quoting it.
    script = tmp_path / "emit.py"
    script.write_text(
        "import logging, sys\n"
        "from outbox import Outbox\n"
        "from support.helpers import run_event, wait_until\n"
        "logging.basicConfig(level=logging.DEBUG, stream=sys.stdout)\n"
        "outbox = Outbox.from_env(backoff_base=0.01, log_interval=0)\n"
        "outbox.emit(run_event(n=1))\n"
        "wait_until(lambda: outbox.stats().retried >= 2, timeout=15)\n"
        "print('STATS', outbox.stats())\n"
        "outbox.close(0.5)\n"
    )
    inner = {
        "type": "http",
        "url": f"http://127.0.0.1:{refused_port()}",
        "auth": {"type": "support.ol_transports.VaultTokenProvider"},
    }
    env = clean_env(
        OPENLINEAGE__TRANSPORT__TYPE="transform",
        OPENLINEAGE__TRANSPORT__TRANSFORMER_CLASS="support.ol_transports.RenameJob",
        OPENLINEAGE__TRANSPORT__TRANSPORT=json.dumps(inner),
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60, cwd=TESTS
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "STATS" in output
    assert "emit raised InvalidHeader (a header value HTTP cannot carry?" in output
    assert "vault-TOKEN" not in output


@pytest.mark.parametrize(
    ("args", "variable", "said"),
    [
        (
            ["forward", "--topic", "t", "--url", "http://127.0.0.1:9", "--api-key", "clé-" + KEY],
            None,
            "--api-key",
        ),
        (["forward", "--topic", "t", "--url", "http://127.0.0.1:9"], KEY + "\nX", "OPENLINEAGE_API_KEY"),
        (["sink", "--port", "0", "--api-key", "clé-" + KEY], None, "--api-key"),
    ],
)
def test_the_commands_name_the_api_key_a_header_cannot_carry_as_it_was_given(args, variable, said):
    # Before: forward named "api_key (OPENLINEAGE_API_KEY or auth.apiKey)" for --api-key, and
    # the sink served, requiring a token no client can send.
    env = clean_env(**({"OPENLINEAGE_API_KEY": variable} if variable else {}))
    done = subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", *args], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"outbox {args[0]}: {said} contains "), done.stderr
    assert "(the value is not shown)" in done.stderr
    assert KEY not in done.stdout + done.stderr
