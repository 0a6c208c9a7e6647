"""The test suite's own promises: a failure reads from the test to the assertion."""

from support.paths import REPO, TESTS

pytest_plugins = ["pytester"]


def test_a_failing_test_prints_its_own_frames_not_the_runners(pytester):
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(
        test_demo="""
        def helper(x):
            assert x == 2, "x should be 2"

        def test_fails():
            helper(1)
        """
    )
    result = pytester.runpytest_subprocess("--tb=native", "-q")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "_pytest" not in out, out
    assert "pluggy" not in out, out
    assert "in test_fails" in out
    assert "in helper" in out
    assert "FAILED test_demo.py::test_fails - AssertionError: x should be 2" in out
    failure = out.split("FAILURES")[1].split("short test summary")[0]
    assert len(failure.splitlines()) < 15, failure


def test_not_slow_leaves_out_the_slow_tests_and_never_starts_the_end_to_end_suite(pytester):
    """.ci/run appends -m "not slow" to the README's command on 3.12 and 3.13: that must not
    select the e2e tests, which the default run leaves out and -m e2e alone runs."""
    root = REPO
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    (pytester.path / "pyproject.toml").write_text((root / "pyproject.toml").read_text())
    pytester.makepyfile(
        test_fast="def test_fast(): pass",
        test_slow="import pytest\n\n@pytest.mark.slow\ndef test_slow(): pass",
    )
    (pytester.path / "e2e").mkdir()
    (pytester.path / "e2e" / "test_peer.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.e2e\n\ndef test_peer(): pass\n"
    )

    def selected(*args: str) -> set[str]:
        result = pytester.runpytest("--collect-only", "-q", *args)
        assert result.ret == 0, result.stdout.str()
        return {line.split("::")[-1] for line in result.stdout.lines if "::" in line}

    assert selected() == {"test_fast", "test_slow"}
    assert selected("-m", "not slow") == {"test_fast"}
    assert selected("-m", "e2e", "e2e") == {"test_peer"}


def test_the_chaos_pulse_excuses_a_stopped_process_and_not_a_waiting_caller():
    """The chaos test's timing checks count only the time the process ran: a process stopped by
    the machine (SIGSTOP here, for 0.4 s) is not the library's wait; a caller blocked on a lock
    while the process runs is."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    from support.chaos import Pulse

    pulse = Pulse(slow_emit=10.0)
    try:
        # The child waits until we are stopped, then resumes us 0.4 s later (or at once, after
        # 30 s: never a test that hangs).  The interval judged is the stop's own: not the
        # child's start before it, nor its exit after (0.57 s on 3.13 beside load, running).
        resumer = subprocess.Popen([sys.executable, "-c", RESUMER, str(os.getpid())])
        began = time.monotonic()
        os.kill(os.getpid(), signal.SIGSTOP)
        ended = time.monotonic()
        resumer.wait(10)
        assert ended - began >= 0.4
        assert pulse.unexplained(began, ended) < 0.25, pulse.gaps
        # A wait on a lock while the process runs: all of it counted.  (A process starved of
        # the CPU for part of the wait looks stopped to the pulse, which excuses that part: seen
        # once beside load, 0.18 s counted of 0.4.  Up to five waits: one counted whole passes;
        # a pulse that excused every wait fails.)
        counted = []
        for _ in range(5):
            lock = threading.Lock()
            lock.acquire()
            threading.Timer(0.4, lock.release).start()
            began = time.monotonic()
            lock.acquire()
            ended = time.monotonic()
            counted.append(pulse.unexplained(began, ended))
            if counted[-1] >= 0.35:
                break
        assert counted[-1] >= 0.35, (counted, pulse.gaps)
    finally:
        pulse.stop()


def test_running_time_leaves_out_a_stop_of_the_process_and_counts_a_wait():
    """The helper the close-deadline checks of the composite tests use (``support.chaos``)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from support.chaos import running_time

    def stopped() -> str:
        resumer = subprocess.Popen([sys.executable, "-c", RESUMER, str(os.getpid())])
        os.kill(os.getpid(), signal.SIGSTOP)
        resumer.wait(10)
        return "resumed"

    began = time.monotonic()
    result, took = running_time(stopped)
    wall = time.monotonic() - began
    assert result == "resumed"
    assert wall - took >= 0.3, (wall, took)  # the stop (0.4 s) left out
    # A sleep while the process runs is counted (up to five, as above: one counted whole).
    counted = [running_time(lambda: time.sleep(0.4))[1]]
    while counted[-1] < 0.35 and len(counted) < 5:
        counted.append(running_time(lambda: time.sleep(0.4))[1])
    assert counted[-1] >= 0.35, counted


RESUMER = """
import os, signal, sys, time
pid = int(sys.argv[1])
give_up = time.monotonic() + 30
while time.monotonic() < give_up:
    with open(f"/proc/{pid}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] == "T":
            time.sleep(0.4)
            break
    time.sleep(0.005)
os.kill(pid, signal.SIGCONT)
"""


def test_a_refused_port_refuses_connections_and_is_given_to_no_server():
    """``support.helpers.refused_port``: the "down" endpoint of many tests.  A server started
    after it (asyncio's, httpx's test servers: ``SO_REUSEADDR``) cannot be given its port."""
    import socket

    import pytest

    from support.helpers import refused_port

    port = refused_port()
    with socket.socket() as client, pytest.raises(ConnectionRefusedError):
        client.connect(("127.0.0.1", port))
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError, match="in use"):
            server.bind(("127.0.0.1", port))
