"""A ``multiprocessing`` child that emits and returns without ``close()``: multiprocessing ends
its children with ``os._exit``, so ``atexit`` never runs there.  The outbox closes in
multiprocessing's own finalizers instead: the child's events arrive at a real sink, or are
counted in a warning; an outbox that does not close at exit says what it leaves behind."""

import subprocess
import sys

import pytest

from outbox.tools.sink import Sink

from support.helpers import refused_port

CHILD = """
import logging, multiprocessing, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(process)d %(message)s")
from outbox import Outbox
from outbox.transports import HttpTransport

URL = {url!r}

def event(n):
    run = {{"runId": "11111111-1111-1111-1111-1111111111%02d" % (n % 8)}}
    return {{"eventType": "START", "eventTime": "2026-12-02T10:00:00+00:00", "n": n, "run": run,
            "job": {{"namespace": "n", "name": "child"}}, "producer": "p", "schemaURL": "s"}}

def make():
    # A close at exit that sends its batch at once takes milliseconds; the 10 s bounds are for
    # a starved machine (with 2 s, a spawned child's first request beside busy processes ran
    # out of time: "took longer than 1.87 s", its 100 events counted, not delivered).
    return Outbox(HttpTransport(URL, mode="batch", timeout=10), linger=30,
                  shutdown_timeout={deadline}, close_at_exit={close_at_exit})

OUTBOX = make() if {inherited} else None

def child(first=0):
    outbox = OUTBOX if OUTBOX is not None else make()
    for n in range(first, first + 100):
        assert outbox.emit(event(n))
    # returns: no close(), no flush()

if __name__ == "__main__":
    context = multiprocessing.get_context({method!r})
    if {pool!r} == "pool":  # two workers, each a task of 100 events; the pool closed and joined
        pool = context.Pool(2)
        pool.map(child, [0, 100], chunksize=1)
        pool.close()
        pool.join()
        print("exitcode 0")
    elif {pool!r} == "executor":
        import concurrent.futures
        with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as executor:
            list(executor.map(child, [0, 100]))
        print("exitcode 0")
    else:
        process = context.Process(target=child)
        process.start()
        process.join(60)
        print("exitcode", process.exitcode)
"""


def run_child(
    tmp_path,
    url: str,
    method: str,
    *,
    inherited: bool = True,
    close_at_exit: bool = True,
    pool: str = "",
    deadline: float = 10,
):
    """The script above in a fresh interpreter (a file: forkserver children import its main)."""
    script = tmp_path / "parent.py"
    script.write_text(
        CHILD.format(
            url=url,
            method=method,
            inherited=inherited,
            close_at_exit=close_at_exit,
            pool=pool,
            deadline=deadline,
        )
    )
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90, cwd=tmp_path
    )


@pytest.mark.parametrize(
    ("method", "inherited"),
    [("fork", True), ("fork", False), ("forkserver", False), ("spawn", False)],
    ids=["fork-inherited-outbox", "fork-own-outbox", "forkserver", "spawn"],
)
def test_a_multiprocessing_child_that_returns_without_close_delivers_its_events(tmp_path, method, inherited):
    with Sink() as sink:
        result = run_child(tmp_path, sink.url, method, inherited=inherited)
        assert result.returncode == 0, result.stderr
        assert "exitcode 0" in result.stdout, result.stderr
        # The child's exit waited for its close: the events are there once it has ended.
        events = sink.events
    assert sorted(e["n"] for e in events) == list(range(100)), result.stderr


@pytest.mark.parametrize("pool", ["pool", "executor"])
def test_pool_workers_that_end_with_the_pool_deliver_what_their_tasks_emitted(tmp_path, pool):
    with Sink() as sink:
        result = run_child(tmp_path, sink.url, "fork", pool=pool)
        assert result.returncode == 0, result.stderr
        events = sink.events
    assert sorted(e["n"] for e in events) == list(range(200)), result.stderr


def test_a_multiprocessing_child_with_the_backend_down_counts_its_events_when_it_ends(tmp_path):
    down = f"http://127.0.0.1:{refused_port()}/api/v1/lineage"
    result = run_child(tmp_path, down, "fork", deadline=2)  # a refused backend: it waits all of it
    assert result.returncode == 0, result.stderr
    assert "exitcode 0" in result.stdout, result.stderr
    # The close report of the child's outbox, logged as it ends: all 100 counted.
    report = [line for line in result.stderr.splitlines() if "closed at exit" in line]
    assert len(report) == 1, result.stderr
    assert "100 lineage event(s) emitted, 0 delivered, 100 not delivered" in report[0], report


def test_a_multiprocessing_child_whose_outbox_does_not_close_at_exit_warns_of_what_it_leaves(tmp_path):
    with Sink() as sink:
        result = run_child(tmp_path, sink.url, "fork", close_at_exit=False)
        assert result.returncode == 0, result.stderr
        events = sink.events
    assert events == []  # close_at_exit=False: the program's own choice
    warning = [line for line in result.stderr.splitlines() if "multiprocessing child" in line]
    assert len(warning) == 1, result.stderr
    assert "100 event(s) not delivered" in warning[0], warning
    assert "close()" in warning[0], warning


BARE_FORK = """
import logging, os, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(process)d %(message)s")
from outbox import Outbox
from outbox.transports import HttpTransport

kept = Outbox(HttpTransport({url!r}, mode="batch", timeout=10), linger=30, shutdown_timeout=10, name="kept")
left = Outbox(HttpTransport({url!r}, mode="batch", timeout=2), linger=30, close_at_exit=False, name="left")
pid = os.fork()
role = "child" if pid == 0 else "parent"
for n in range(10):
    kept.emit({{"eventType": "START", "eventTime": "2026-12-02T10:00:00+00:00", "n": n, "role": role,
               "run": {{"runId": "11111111-1111-1111-1111-111111111111"}},
               "job": {{"namespace": "n", "name": role}}, "producer": "p", "schemaURL": "s"}})
    left.emit({{"eventType": "START", "n": n}})
if pid:
    os.waitpid(pid, 0)
# both end normally: atexit runs
"""


def test_a_process_or_bare_fork_child_that_ends_normally_warns_of_an_outbox_left_unclosed(tmp_path):
    with Sink() as sink:
        script = tmp_path / "bare.py"
        script.write_text(BARE_FORK.format(url=sink.url))
        result = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=90, cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
        events = sink.events
    # close_at_exit (the default): the parent's and the child's events delivered at exit.
    assert sorted(e["n"] for e in events if e["role"] == "child") == list(range(10))
    assert sorted(e["n"] for e in events if e["role"] == "parent") == list(range(10))
    # close_at_exit=False: each process says what it leaves, once.
    warnings = [line for line in result.stderr.splitlines() if "outbox 'left'" in line]
    assert len(warnings) == 2, result.stderr
    assert all("10 event(s) not delivered, and close_at_exit=False" in line for line in warnings), warnings
    assert len({line.split()[0] for line in warnings}) == 2  # two processes


MID_RECORD = r"""
import logging, os, signal, sys, threading, time
from outbox import Outbox
from outbox.transports import HttpTransport

# A sidecar runs in this process (its backend refuses: nothing is delivered, nothing needed).
outbox = Outbox(HttpTransport("http://127.0.0.1:9"), close_at_exit=False)


class Stream:
    # Writes under a lock of its own, as io.BufferedWriter does; one record takes a while.
    def __init__(self):
        self.lock, self.writing, self.lines = threading.Lock(), threading.Event(), []

    def write(self, text):
        with self.lock:
            if text.startswith("slow"):
                self.writing.set()
                time.sleep(0.5)
            self.lines.append(text)

    def flush(self):
        with self.lock:
            pass


stream = Stream()
log = logging.getLogger("outbox.worker")
log.addHandler(logging.StreamHandler(stream))
writer = threading.Thread(target=log.warning, args=("slow record, written as the fork comes",))
writer.start()
stream.writing.wait()
pid = os.fork()
if pid == 0:
    log.warning("the child's record")  # waits forever if the stream's lock was held at the fork
    os._exit(0 if any("the child's record" in line for line in stream.lines) else 3)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child exit", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.01)
else:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print("child stuck")
writer.join()
outbox.close(0.5)
"""


def test_a_fork_while_a_log_record_is_being_written_leaves_the_child_able_to_log(tmp_path):
    # A sidecar thread logs (a backend down, at a bounded rate) while the program forks: the
    # child inherited a stream whose own lock the writing thread held, and its first record
    # to that handler waited forever (the chaos test's forked child, stuck 1 run in ~20).
    script = tmp_path / "mid_record.py"
    script.write_text(MID_RECORD)
    result = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "child exit 0", (result.stdout, result.stderr[-2000:])
