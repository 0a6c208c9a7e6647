"""``import outbox`` stays cheap: openlineage-python's ``openlineage.client`` package (about
300 ms of imports) is not loaded by importing the library, naming datasets or building an
outbox; only by what needs it (``outbox.OutboxTransport``, an openlineage-python transport or
token provider, ``LineageJob``, ``outbox demo``)."""

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
box.close(1)
import outbox.tools.check, outbox.tools.cli, outbox.tools.sink  # the outbox command, check, sink
seen["the outbox command (cli, check, sink)"] = loaded()
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


def test_outbox_transport_is_still_listed() -> None:
    assert "OutboxTransport" in dir(outbox)
    assert outbox.OutboxTransport.__module__ == "outbox"
