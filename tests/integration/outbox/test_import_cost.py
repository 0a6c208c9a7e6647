"""``import outbox`` stays cheap: openlineage-python's ``openlineage.client`` package (about
300 ms of imports) is not loaded by importing the library, naming datasets or building an
outbox; only by what needs it (``outbox.OutboxTransport``, an openlineage-python transport or
token provider, ``LineageJob``, ``outbox demo`` once its ``--file`` is accepted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import outbox

# Run in a fresh interpreter: this one has long imported openlineage-python.
_PROBE = """
import json, sys

def loaded():
    return sorted(m for m in sys.modules if m == "openlineage.client" or m.startswith("openlineage.client."))

import outbox
seen = {"import outbox": loaded()}
outbox.s3_dataset("bucket", "key")
outbox.trino_dataset("trino.example", 8080, "vast", "lineage", "orders")
seen["s3_dataset, trino_dataset"] = loaded()
box = outbox.Outbox.from_env(close_at_exit=False)  # an http transport, from OPENLINEAGE_URL
seen["Outbox.from_env() (http)"] = loaded()
import collections
assert box.emit(collections.OrderedDict(eventType="START"))  # a dict subclass, first seen
try:
    box.emit(object())
except TypeError:
    pass
else:
    raise AssertionError("emit(object()) did not raise TypeError")
seen["emit: a dict subclass, then an object that is no event"] = loaded()
box.close(1)
import outbox.tools.check, outbox.tools.cli, outbox.tools.sink  # the outbox command, check, sink
seen["the outbox command (cli, check, sink)"] = loaded()
assert outbox.tools.cli.main(["demo", "--runs", "1", "--file", "/no-such-folder/d.jsonl"]) == 2
seen["outbox demo, refusing its --file"] = loaded()
print(json.dumps(seen))
"""


def test_import_outbox_leaves_openlineage_client_unimported(tmp_path: Path) -> None:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_")) and k != "HOME"
    }
    # Nothing listens on the discard port; nothing is emitted, so nothing is sent.
    environ.update(OPENLINEAGE_URL="http://127.0.0.1:9", HOME=str(tmp_path))
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=60
    )
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    loaded = {step: f"{len(modules)} modules, {modules[:3]}..." for step, modules in seen.items() if modules}
    assert not loaded, f"openlineage.client imported after: {loaded}"


def test_openlineage_events_are_still_admitted_once_openlineage_is_imported(tmp_path: Path) -> None:
    """The type check reads openlineage-python's classes from the modules already imported (an
    event object cannot exist before its module): its events, new and legacy, are admitted."""
    probe = """
import warnings
from outbox import Outbox
from outbox.transports import MemoryTransport
from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from openlineage.client import run as legacy
box = Outbox(MemoryTransport(), close_at_exit=False)
job = Job(namespace="n", name="j")
assert box.emit(RunEvent(eventType=RunState.START, eventTime="2026-01-01T00:00:00Z",
                         run=Run(runId="0192a1b2-0000-7000-8000-000000000000"), job=job, producer="p"))
assert box.emit(legacy.RunEvent(eventType=legacy.RunState.START, eventTime="2026-01-01T00:00:00Z",
                                run=legacy.Run(runId="0192a1b2-0000-7000-8000-000000000001"),
                                job=legacy.Job(namespace="n", name="j"), producer="p"))
report = box.close(5)
assert report.delivered == 2, report
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_outbox_transport_is_still_listed() -> None:
    assert "OutboxTransport" in dir(outbox)
    assert outbox.OutboxTransport.__module__ == "outbox"


_FIRST_REQUEST = """
import json, sys
from outbox import Outbox
from outbox.tools.sink import Sink
from outbox.transports import HttpTransport

with Sink() as sink:
    box = Outbox(HttpTransport(f"http://127.0.0.1:{sink.port}"), close_at_exit=False)
    before = set(sys.modules)
    assert box.emit({"eventType": "START"})
    assert box.flush(30)
    print(json.dumps(sorted(set(sys.modules) - before)))
    box.close(5)
"""


def test_the_first_request_imports_nothing_on_the_sidecars_thread(tmp_path: Path) -> None:
    """The HTTP client's first request imported anyio's asyncio backend (26 modules, tens of
    milliseconds on the sidecar's thread, which held it while a burst right after the outbox
    started filled the buffer: 31 events dropped against a healthy disk with a spill).  Now the
    transport's module imports it, on the application's thread (a fork mid-import on the
    sidecar's thread would also leave a child a half-made module)."""
    probe = subprocess.run(
        [sys.executable, "-c", _FIRST_REQUEST], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert probe.returncode == 0, probe.stderr
    new = [m for m in json.loads(probe.stdout) if m.split(".")[0] in ("anyio", "httpcore", "httpx", "h11")]
    assert not new, f"the first request imported {len(new)} modules: {new[:5]}"
