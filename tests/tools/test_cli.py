"""The ``outbox`` command's own arguments, refused as a user meets them: a process, its exit
status and its message."""

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def outbox(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """``outbox ARGS`` as a user runs it, with no OPENLINEAGE_* or OUTBOX_* variable set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    return subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=env,
    )


@pytest.mark.parametrize("runs", ["0", "-3", "two"])
def test_demo_refuses_a_run_count_below_one(runs, tmp_path):
    done = outbox("demo", "--runs", runs, "--file", str(tmp_path / "d.jsonl"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"argument --runs: {runs!r} is not a number of runs; give 1 or more" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "d.jsonl").exists()  # refused before anything was written


def test_demo_runs_one(tmp_path):
    done = outbox("demo", "--runs", "1", "--file", str(tmp_path / "d.jsonl"))
    assert done.returncode == 0, done.stderr
    assert "emitted 2 events for 1 runs" in done.stdout


@pytest.mark.parametrize("timeout", ["0", "-1", "inf", "soon"])
def test_check_refuses_a_timeout_that_is_not_a_positive_number(timeout):
    done = outbox("check", "--timeout", timeout)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "argument --timeout:" in done.stderr
    assert "number of seconds" in done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["replay", "--timeout", "inf", "F"], "argument --timeout: inf is not a number of seconds above 0"),
        (["replay", "--timeout", "-1", "F"], "argument --timeout: -1 is not a number of seconds above 0"),
        (["replay", "--timeout", "0", "F"], "argument --timeout: 0 is not a number of seconds above 0"),
        (["forward", "--topic", "t", "--session-timeout", "0"], "0 is not a number of seconds above 0"),
        (
            ["forward", "--topic", "t", "--progress-interval", "-1"],
            "-1 is not a number of seconds, 0 or more",
        ),
        (["forward", "--topic", "t", "--drain-timeout", "nan"], "nan is not a number of seconds, 0 or more"),
        (["sink", "--port", "99999"], "argument --port: '99999' is not a port; give 0 (a free one) to 65535"),
        (["sink", "--fail-rate", "2"], "argument --fail-rate: '2' is not a fraction; give 0 to 1"),
        (["sink", "--delay", "-1"], "argument --delay: -1 is not a number of seconds, 0 or more"),
        (["sink", "--fail-status", "42"], "argument --fail-status: '42' is not an HTTP status"),
        (["sink", "--max-body", "0"], "argument --max-body: '0' is not a number of bytes; give 1 or more"),
        (["bench", "--invocations", "0"], "argument --invocations: '0' is not a whole number of 1 or more"),
        (
            ["bench", "--policies", "--buffer-sizes", "0"],
            "argument --buffer-sizes: '0' is not a whole number",
        ),
        (["bench", "--rate", "-5"], "argument --rate: '-5' is not a finite number of 0 or more"),
        (["bench", "--error-rate", "3"], "argument --error-rate: '3' is not a fraction"),
    ],
)
def test_an_argument_out_of_range_is_refused_at_once_naming_it(args, said, tmp_path):
    # Before: replay ran with any timeout (inf: a traceback), the sink crashed on a port out of
    # range and served with --fail-rate 2, forward tried the brokers first.
    done = outbox(*[str(tmp_path / "f.jsonl") if a == "F" else a for a in args])
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (
            "{bad",
            "--kafka-config is not JSON (Expecting property name enclosed in double quotes at character 2)",
        ),
        ("[1]", "--kafka-config is not a JSON object"),
    ],
)
def test_forward_refuses_a_kafka_config_that_is_not_a_json_object(config, said):
    done = outbox("forward", "--topic", "t", "--url", "http://127.0.0.1:9", "--kafka-config", config)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"outbox forward: {said}; give an object such as"), done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_forward_refuses_kafka_config_keys_it_would_ignore():
    """An operator's typo, or a librdkafka key aiokafka has no equivalent for, would otherwise be
    dropped without a word (the transport only warns: openlineage-python's configs carry them)."""
    config = '{"sasl.mechansim": "PLAIN", "statistics.interval.ms": 1000, "client.id": "fwd"}'
    done = outbox("forward", "--topic", "t", "--url", "http://127.0.0.1:9", "--kafka-config", config)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(
        "outbox forward: --kafka-config: sasl.mechansim (did you mean sasl.mechanism?), "
        "statistics.interval.ms would have no effect (aiokafka has no equivalent); the keys it reads: "
    ), done.stderr
    assert "client.id" in done.stderr  # among the keys it reads
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_forward_names_the_url_as_it_was_given():
    """helper-37: a bad ``--url`` was refused naming OPENLINEAGE_URL, which the user never set."""
    done = outbox("forward", "--topic", "t", "--url", "http://<lineage host>:5000")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (
        "outbox forward: url='http://<lineage host>:5000' has no host name there ('<lineage host>'); "
        "put the backend's host name or address, e.g. http://marquez:5000 (--url)"
    )


def test_demo_refuses_a_file_it_cannot_write_before_emitting(tmp_path):
    done = outbox("demo", "--runs", "1", "--file", str(tmp_path / "missing" / "d.jsonl"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"outbox demo: --file: the folder of {tmp_path / 'missing' / 'd.jsonl'} does not exist" in done.stderr
    )
    done = outbox("demo", "--runs", "1", "--file", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"outbox demo: --file: {tmp_path} is a folder" in done.stderr
    assert "Traceback" not in done.stderr


def test_demo_refuses_a_file_the_system_will_not_create_though_its_folder_looks_writable(tmp_path):
    """helper-37: ``--file /proc/x`` (root "may write" /proc by os.access) emitted, lost every
    event and ended in a traceback reading the file back.  The file is tried first now."""
    done = outbox("demo", "--runs", "1", "--file", "/proc/outbox-demo.jsonl")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("outbox demo: --file: cannot write /proc/outbox-demo.jsonl ("), done.stderr
    assert "give a path you can write" in done.stderr
    assert "Traceback" not in done.stderr


def test_demo_refuses_a_file_that_is_not_a_regular_one(tmp_path):
    """helper-41: a FIFO hung the demo (it counted the lines there first); /dev/zero never ended."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        done = outbox("demo", "--runs", "1", "--file", str(path))
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"outbox demo: --file: {path} is not a regular file" in done.stderr


def test_demo_run_twice_into_one_file_reports_its_own_events(tmp_path):
    path = tmp_path / "d.jsonl"
    assert outbox("demo", "--runs", "1", "--file", str(path)).returncode == 0
    again = outbox("demo", "--runs", "1", "--file", str(path))
    # Before: "4 events in d.jsonl" and exit 1, the first run's two events taken for this one's.
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"2 events written to {path} (after 2 lines already there)" in again.stdout
    assert len(path.read_text().splitlines()) == 4


def test_sink_on_a_port_in_use_or_a_store_it_cannot_write_says_so_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = outbox("sink", "--port", str(port))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(f"outbox sink: cannot listen on 127.0.0.1:{port}: Address already in use")
    assert "Traceback" not in done.stderr
    done = outbox("sink", "--port", "0", "--store", str(tmp_path / "missing" / "s.jsonl"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "outbox sink: --store: the folder of" in done.stderr


def _every_option() -> list[tuple[str, Any]]:
    """(command, option) for every option of ``outbox`` and its commands, ``outbox bench``'s
    own parser included."""
    from outbox.tools.bench import build_parser as bench_parser
    from outbox.tools.cli import build_parser

    parsers = [("outbox", build_parser())]
    for action in parsers[0][1]._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers += [(f"outbox {name}", sub) for name, sub in action.choices.items()]
    parsers.append(("outbox bench", bench_parser()))
    return [(command, action) for command, parser in parsers for action in parser._actions]


def test_every_option_with_a_default_says_it_in_its_help():
    """#39: ``bench --timeout``, ``--close-timeout`` and ``forward --drain-timeout`` (and three
    more) had a default that their --help did not give."""
    missing = []
    for command, action in _every_option():
        default = action.default
        if not action.option_strings or default in (None, False, argparse.SUPPRESS):
            continue  # flags, help, version, options without a default
        said = action.help or ""
        value = f"{default:g}" if isinstance(default, float | int) and not isinstance(default, bool) else None
        if "default" not in said or (value is not None and value not in said):
            missing.append(f"{command} {action.option_strings[-1]} (default {default!r}): {said}")
    assert missing == []
