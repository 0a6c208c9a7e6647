"""What the tests of the dead-letter file and of ``outbox replay`` share: the command run as an
operator runs it, and records to write."""

import os
import subprocess
import sys
from pathlib import Path

import orjson

from support.helpers import run_event


def replay(path, url=None, *args, env=None, timeout=60):
    """``outbox replay`` as an operator runs it: a new process, an environment of its own."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    home = Path(path).parent / "home"
    home.mkdir(exist_ok=True)  # no ~/.openlineage/openlineage.yml of this machine's
    base.update(HOME=str(home), **({"OPENLINEAGE_URL": url} if url else {}), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "outbox.tools.cli", "replay", str(path), *args],
        capture_output=True,
        text=True,
        env=base,
        cwd=home,
        timeout=timeout,
    )


def records(first: int, count: int) -> list:
    return [("poison", "500", orjson.dumps(run_event(n=n)), None) for n in range(first, first + count)]
