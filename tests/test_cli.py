"""The ``outbox`` command's own arguments, refused as a user meets them: a process, its exit
status and its message."""

import subprocess
import sys

import pytest


def outbox(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
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
