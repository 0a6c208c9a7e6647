"""An outbox across a fork and at the process's exit, in real child processes: a forked child gets
a fresh, working sidecar and leaves the parent's untouched; the exit hook delivers what no close
did, unless it is switched off.  (The lifecycle in one process: tests/unit/runtime/.)"""

import json
import os
import subprocess
import sys
import textwrap

from outbox import Outbox
from outbox.transports import FileTransport

from support import parts
from support.helpers import ScriptedTransport, run_event


def make(transport, **kw) -> Outbox:
    kw.setdefault("close_at_exit", False)
    return Outbox(transport, **kw)


def test_fork_gives_the_child_a_fresh_working_sidecar(tmp_path):
    child_file = tmp_path / "child.jsonl"

    class ForkAware(ScriptedTransport):
        def clone(self):  # what the child ships through
            return FileTransport(child_file, append=True)

    parent_transport = ForkAware()
    outbox = make(parent_transport, linger=0)
    outbox.emit(run_event(n=1))
    assert parent_transport.wait_delivered(1)
    # Leave something buffered in the parent: the child must not inherit it.
    parent_transport.gate.clear()
    outbox.emit(run_event(n=2))
    assert parent_transport.send_started.wait(2)

    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            stats = outbox.stats()
            fresh = stats.emitted == 0 and stats.queued_events == 0 and stats.in_flight == 0
            parts.set_transport(outbox, FileTransport(child_file, append=True))  # where the child ships
            ok = outbox.emit(run_event(n=3)) and outbox.flush(5)
            code = 0 if (fresh and ok) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert [json.loads(line)["n"] for line in child_file.read_text().splitlines()] == [3]
    # The parent is unaffected: its buffered event is still delivered.
    parent_transport.gate.set()
    report = outbox.close(2)
    assert report.delivered == 2
    assert [e["n"] for e in parent_transport.delivered] == [1, 2]


def test_exit_without_close_still_delivers(tmp_path):
    out = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        from outbox import Outbox
        from outbox.transports import FileTransport
        outbox = Outbox(FileTransport({str(out)!r}, append=True), linger=30.0)
        for i in range(500):
            outbox.emit({{"eventType": "START", "n": i}})
        # no close(): the exit hook must flush within shutdown_timeout
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = out.read_text().splitlines()
    assert [json.loads(line)["n"] for line in lines] == list(range(500))


def test_exit_hook_can_be_switched_off(tmp_path):
    out = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        from outbox import Outbox
        from outbox.transports import FileTransport
        outbox = Outbox(FileTransport({str(out)!r}, append=True), linger=30.0, close_at_exit=False)
        outbox.emit({{"eventType": "START"}})
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not out.exists()
