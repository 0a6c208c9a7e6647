"""A loss is never silent (invariant 13).  In a program that configures no logging, a loss at
close or at exit, and the one-time warnings (a misspelt setting, the console fallback, a spill
directory or dead-letter file that fails), reach stderr, one line each; a program that
configures logging gets them through its own handlers, once; nothing is printed when
everything was delivered.

Each case runs in a child process: a test process has pytest's handlers on the root logger,
so the fallback never writes there."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from outbox._observability._log import FIRST_NEVER_SILENT

from support.helpers import refused_port
from support.paths import REPO

PRELUDE = """
import logging, os, shutil, sys, tempfile
from outbox import Outbox
from outbox.transports import FileTransport, HttpTransport, Outcome

def event(n):
    return {"eventType": "START", "eventTime": "2026-12-05T10:00:00+00:00", "n": n,
            "run": {"runId": "11111111-1111-1111-1111-111111111111"},
            "job": {"namespace": "n", "name": "j"}, "producer": "p", "schemaURL": "s"}
"""

#: How the program sets up logging (or not), and where it then finds the outbox's warnings.
LOGGING = {
    "none": "",
    "basicConfig": "logging.basicConfig(format='app %(levelname)s %(name)s: %(message)s')\n",
    "a handler on outbox": (
        "handler = logging.StreamHandler(sys.stdout)\n"
        "handler.setFormatter(logging.Formatter('app %(levelname)s %(name)s: %(message)s'))\n"
        "logging.getLogger('outbox').addHandler(handler)\n"
    ),
}


def child(code: str, cwd, **variables: str) -> subprocess.CompletedProcess[str]:
    """``code`` after the prelude, in a fresh interpreter, with no OPENLINEAGE_* or OUTBOX_*
    variable but ``variables`` (a developer's own would be warned about)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    result = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=cwd,
        env={**env, **variables},
    )
    assert result.returncode == 0, result.stderr
    return result


def ours(stream: str) -> list[str]:
    """The fallback's lines."""
    return [line for line in stream.splitlines() if line.startswith("lineage-outbox ")]


LOST_AT_EXIT = """
outbox = Outbox(HttpTransport("http://127.0.0.1:{port}"), shutdown_timeout=0.5)
for n in range(100):
    outbox.emit(event(n))
# no close(): the exit hook closes it
"""


def test_a_loss_at_exit_reaches_stderr_in_one_line_with_no_logging_configured(tmp_path):
    # The program: no logging, 100 events to a backend that refuses, and exit.  The line
    # ends with the last error: dropped_shutdown alone sends a user to the deadline, not the URL.
    port = refused_port()
    result = child(LOST_AT_EXIT.format(port=port), tmp_path)
    assert result.stderr.splitlines() == [
        "lineage-outbox warning: outbox 'outbox' closed at exit: 100 lineage event(s) emitted, "
        "0 delivered, 100 not delivered (dropped_shutdown: 100); Outbox.stats() counts every "
        f"loss by reason; the last error: POST http://127.0.0.1:{port}/api/v1/lineage/batch failed: "
        f"ConnectError: [Errno 111] Connect call failed ('127.0.0.1', {port})"
    ]
    assert result.stdout == ""


# The sidecar's thread made the report, then said the loss: a close on the main thread that found
# the report made returned it at once, and a program that then exited (the sidecar's thread a
# daemon) lost the warning (CI, 1 run in many beside load).  "slow" makes the race the rule.
SLOW_TO_SAY = """
    from outbox._worker import _sidecar
    tell = _sidecar._tell_losses
    def slow(*args):
        time.sleep(0.5)
        tell(*args)
    _sidecar._tell_losses = slow
"""


@pytest.mark.parametrize("said", ["", "slow"])
@pytest.mark.parametrize("close", ["outbox.close()", "asyncio.run(outbox.aclose())"])
def test_a_loss_at_close_reaches_stderr_in_one_line(tmp_path, close, said):
    code = f"""
    import asyncio, time
    {SLOW_TO_SAY.strip() if said else ""}
    class Rejecting:
        async def send(self, batch, deadline):
            return [Outcome.rejected(detail="422: the test refuses it") for _ in batch]
        async def aclose(self):
            pass

    outbox = Outbox(Rejecting(), linger=0)
    for n in range(3):
        outbox.emit(event(n))
    time.sleep(0.2 if {said!r} else 0)  # (slow: the worker makes the report first)
    report = {close}
    print(report.undelivered)
    """
    result = child(code, tmp_path)
    assert result.stdout == "{'rejected_by_backend': 3}\n"
    how = "close()" if close == "outbox.close()" else "aclose()"
    assert result.stderr.splitlines() == [
        f"lineage-outbox warning: outbox 'outbox' closed by {how}: 3 lineage event(s) emitted, "
        "0 delivered, 3 not delivered (rejected_by_backend: 3); Outbox.stats() counts every loss "
        "by reason; the last error: 422: the test refuses it"
    ]


def test_a_composite_names_the_member_that_lost_events(tmp_path):
    code = f"""
    import time
    from outbox.transports import CompositeTransport
    members = {{"file": FileTransport("events.jsonl", append=True),
               "down": HttpTransport("http://127.0.0.1:{refused_port()}")}}
    outbox = Outbox(CompositeTransport(members), shutdown_timeout=0.5)
    for n in range(5):
        outbox.emit(event(n))
    # The file member's 5 written first (a condition: beside busy processes its sidecar took more
    # than the 0.5 s close gives, and the report named it too), then the close's report.
    deadline = time.monotonic() + 30
    while outbox.stats().members["file"]["delivered"] < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    outbox.close()
    """
    result = child(code, tmp_path)
    assert result.stderr.splitlines() == [
        "lineage-outbox warning: outbox 'outbox' closed by close(): composite member 'down': 5 lineage "
        "event(s) emitted, 0 delivered, 5 not delivered (dropped_shutdown: 5); Outbox.stats().members "
        "counts every loss by reason"
    ]
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 5  # the other member has all


@pytest.mark.parametrize("logging_setup", ["basicConfig", "a handler on outbox"])
def test_a_program_that_configures_logging_gets_the_loss_there_once(tmp_path, logging_setup):
    port = refused_port()
    code = LOGGING[logging_setup] + LOST_AT_EXIT.format(port=port)
    result = child(code, tmp_path)
    assert ours(result.stdout + result.stderr) == []  # no fallback line: nothing twice
    where = result.stderr if logging_setup == "basicConfig" else result.stdout
    summary = [line for line in where.splitlines() if "closed at exit" in line]
    assert summary == [
        "app WARNING outbox: outbox 'outbox' closed at exit: 100 lineage event(s) emitted, "
        "0 delivered, 100 not delivered (dropped_shutdown: 100); Outbox.stats() counts every "
        f"loss by reason; the last error: POST http://127.0.0.1:{port}/api/v1/lineage/batch failed: "
        f"ConnectError: [Errno 111] Connect call failed ('127.0.0.1', {port})"
    ]


def test_a_null_handler_on_the_outbox_logger_silences_it(tmp_path):
    code = "logging.getLogger('outbox').addHandler(logging.NullHandler())\n" + LOST_AT_EXIT.format(
        port=refused_port()
    )
    result = child(code, tmp_path)
    assert result.stderr == ""


@pytest.mark.parametrize("logging_setup", list(LOGGING))
@pytest.mark.parametrize("end", ["exit", "close"])
def test_nothing_is_printed_when_everything_was_delivered(tmp_path, logging_setup, end):
    code = LOGGING[logging_setup] + textwrap.dedent(
        """
        outbox = Outbox(FileTransport("events.jsonl", append=True))
        for n in range(100):
            outbox.emit(event(n))
        """
    )
    if end == "close":
        code += "assert outbox.close(10).complete\n"
    result = child(code, tmp_path)
    assert result.stdout == ""
    assert result.stderr == ""
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 100  # all delivered


def test_a_misspelt_setting_reaches_stderr_once(tmp_path):
    code = """
    for _ in range(3):  # however many outboxes the program makes
        outbox = Outbox.from_env()
        outbox.emit(event(0))
        assert outbox.close(10).complete
    """
    result = child(
        code,
        tmp_path,
        OUTBOX_MAX_EVENT="10",
        OPENLINEAGE__TRANSPORT__TYPE="file",
        OPENLINEAGE__TRANSPORT__LOG_FILE_PATH="events.jsonl",
        OPENLINEAGE__TRANSPORT__APPEND="true",
    )
    assert result.stderr.splitlines() == [
        "lineage-outbox warning: OUTBOX_MAX_EVENT is not a lineage-outbox setting (ignored); "
        "did you mean OUTBOX_MAX_EVENTS?"
    ]


def test_the_console_fallback_says_so_on_stderr(tmp_path):
    code = """
    outbox = Outbox.from_env()
    outbox.emit(event(0))
    assert outbox.close(10).complete
    """
    result = child(code, tmp_path)
    assert json.loads(result.stdout)["eventType"] == "START"  # the console transport printed it
    assert result.stderr.splitlines() == [
        "lineage-outbox warning: no OpenLineage transport is configured (OPENLINEAGE_URL, "
        "OPENLINEAGE__TRANSPORT__TYPE, openlineage.yml); lineage events will be printed to the console"
    ]


def test_a_dead_letter_file_that_cannot_be_written_is_said_once(tmp_path):
    code = """
    class Rejecting:
        async def send(self, batch, deadline):
            return [Outcome.rejected(detail="422: the test refuses it") for _ in batch]
        async def aclose(self):
            pass

    os.mkdir("letters")
    outbox = Outbox(Rejecting(), dead_letter="letters/dead.jsonl", linger=0)
    shutil.rmtree("letters")
    open("letters", "w").close()  # its folder is now a file: every write fails
    for n in range(3):
        outbox.emit(event(n))
        outbox.flush(10)
    print(outbox.close(10).undelivered, dict(outbox.stats().dead_letter))
    """
    result = child(code, tmp_path)
    assert result.stdout == "{'rejected_by_backend': 3} {'written': 0, 'dead_letter_error': 3}\n"
    lines = ours(result.stderr)
    assert len(lines) == 2, result.stderr  # three failed writes, one line; and the close's
    assert lines[0].startswith("lineage-outbox error: cannot write the dead-letter file letters/dead.jsonl: ")
    assert "3 not delivered (rejected_by_backend: 3)" in lines[1]
    assert result.stderr.splitlines() == lines


def test_a_spill_directory_that_fails_is_said_once(tmp_path):
    code = f"""
    import time
    outbox = Outbox(HttpTransport("http://127.0.0.1:{refused_port()}"), spill_dir="spill",
                    spill_interval=0.01, shutdown_timeout=0.5)
    shutil.rmtree("spill")
    open("spill", "w").close()  # the directory is now a file: it cannot be made again
    # Until making it again has failed twice (tried again some seconds after a failure).
    n, deadline = 0, time.monotonic() + 60
    while outbox.stats().spill.get("failed_enotdir", 0) < 2 and time.monotonic() < deadline:
        outbox.emit(event(n))
        n += 1
        time.sleep(0.02)
    print(outbox.stats().spill.get("failed_enotdir", 0) >= 2, n)
    """
    result = child(code, tmp_path)
    failed_twice, emitted = result.stdout.split()
    assert failed_twice == "True", result.stderr
    lines = ours(result.stderr)
    assert len(lines) == 2, result.stderr  # the directory gone, then the loss at exit
    assert lines[0].startswith(
        f"lineage-outbox warning: spill: this outbox's files in {tmp_path / 'spill'} "
    ), lines[0]
    assert "were removed under it" in lines[0], lines[0]
    assert f"{emitted} not delivered (dropped_shutdown: {emitted})" in lines[1]
    assert result.stderr.splitlines() == lines


def test_every_key_said_once_on_stderr_is_one_the_library_logs():
    """``FIRST_NEVER_SILENT`` names keys of other modules' logs: a key renamed there would go
    silent here without a word."""
    package = REPO / "outbox"
    source = "".join(p.read_text() for p in package.rglob("*.py") if p.name != "_log.py")
    for key in FIRST_NEVER_SILENT:
        assert f'"{key}"' in source, key


def test_a_spill_directory_removed_under_a_running_outbox_is_said_once(tmp_path):
    code = f"""
    import time
    spill = {str(tmp_path / "spill")!r}
    outbox = Outbox(HttpTransport("http://127.0.0.1:{refused_port()}", timeout=0.5), spill_dir=spill,
                    shutdown_timeout=0.5, close_at_exit=False, max_events=100)
    for n in range(60):
        outbox.emit(event(n))
    deadline = time.monotonic() + 30
    while outbox.stats().spill["spilled_events"] < 60 and time.monotonic() < deadline:
        time.sleep(0.01)
    shutil.rmtree(spill)
    for n in range(60, 70):
        outbox.emit(event(n))
    while not os.path.isdir(spill) and time.monotonic() < deadline:  # made again when noticed
        time.sleep(0.01)
    print(os.path.isdir(spill))
    """
    result = child(code, tmp_path)
    assert result.stdout.split() == ["True"], result.stderr
    lines = ours(result.stderr)
    removed = [line for line in lines if "were removed under it" in line]
    assert len(removed) == 1, result.stderr
    assert str(tmp_path / "spill") in removed[0]


def test_close_on_signal_off_the_main_thread_says_a_sigterm_would_lose_the_events(tmp_path):
    # A runtime that calls init() on a worker thread: Python cannot install the handler there.
    # The warning said "relying on the exit hook", on the logger alone (nothing on stderr here),
    # and SIGTERM's default action ends the process without that hook.
    code = f"""
    import threading
    outbox = Outbox(HttpTransport("http://127.0.0.1:{refused_port()}"), close_at_exit=False)
    installed = []
    worker = threading.Thread(target=lambda: installed.append(outbox.close_on_signal()), name="init")
    worker.start()
    worker.join()
    print(installed)
    outbox.close(0)
    """
    result = child(code, tmp_path)
    assert result.stdout.split() == ["[False]"]
    said = [line for line in ours(result.stderr) if "close_on_signal()" in line]
    assert len(said) == 1, result.stderr
    assert "thread 'init', not the main thread" in said[0]
    assert "a SIGTERM ends this process without closing its outboxes" in said[0]
