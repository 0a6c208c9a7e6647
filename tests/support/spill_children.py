"""Starting ``spill_child.py`` processes and reading their lines (the spill tests' children)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

CHILD = str(Path(__file__).parent / "spill_child.py")


def start_child(cfg: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, CHILD, json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 60.0) -> str:
    # 60 s: a child that starts beside busy processes took more than 15 s to print its first line.
    """The child's next stdout line starting with ``prefix`` (its stderr on failure)."""
    box: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(prefix):
                box.append(line[len(prefix) :].strip())
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        proc.kill()
        raise AssertionError(f"no {prefix!r} line from the child: {proc.communicate()[1][-3000:]}")
    return box[0]


def tell(proc: subprocess.Popen[str]) -> None:
    """Send the child the line it waits for on standard input."""
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
