"""``python -m outbox.tools.benchmarks instructions``: what one call costs the handler's thread, in
CPU instructions counted by valgrind's callgrind, which the machine's load does not change.

The latency figures (``tail``) are what a handler feels, but on a shared machine two runs of the
same code differ by more than most changes to ``emit`` do.  An instruction count is repeatable:
the same code, inputs and interpreter give the same count, however busy the machine is.  So a
change to the hot path carries both: the tail before and after, and these counts, which say
whether the change made the caller's work smaller.

Each figure is ``(count with N calls - count with 0 calls) / N``, in a process of its own
(``_instructions_child.py``), for: ``emit`` of an openlineage-python ``RunEvent``, of a dict and
of pre-serialized bytes, and one invocation of the run helpers (``with outbox.run(job,
inputs=[s3_dataset(...)])``: START and COMPLETE, building included), outside any span and, as
a DataEngine handler runs, in a span of its own trace after 5,000 traces (the span's own
entering and leaving, the runtime's work, counted apart and taken off).  The sidecar is idle (a
linger longer than the run), so only the caller's thread is counted.  ``--library PATH`` counts
another checkout's ``outbox`` beside this one's, in the same run.  Needs ``valgrind``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CHILD = Path(__file__).with_name("_instructions_child.py")
CASES = ("object", "dict", "bytes", "helpers", "helpers-span")
# A case's figure less its baseline's: what the caller's own code around the call costs.
BASELINES = {"helpers-span": "span-only"}
_COLLECTED = re.compile(rb"Collected : (\d+)")


def count(case: str, calls: int, library: str | None) -> int:
    """Instructions callgrind counts for a child process making ``calls`` calls of ``case``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "OUTBOX_"))}
    if library:
        env["PYTHONPATH"] = os.pathsep.join([library, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            str(CHILD),
            case,
            str(calls),
        ],
        capture_output=True,
        env=env,
        timeout=600,
    )
    found = _COLLECTED.search(out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {case} failed:\n{out.stderr[-2000:].decode(errors='replace')}")
    return int(found.group(1))


def per_call(case: str, calls: int, library: str | None) -> float:
    figure = (count(case, calls, library) - count(case, 0, library)) / calls
    baseline = BASELINES.get(case)
    return figure - per_call(baseline, calls, library) if baseline else figure


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m outbox.tools.benchmarks instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--calls", type=int, default=5000, help="calls counted per case (default 5000)")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="what to count")
    parser.add_argument(
        "--library", metavar="PATH", help="also count the outbox package of this checkout (an earlier one)"
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 1
    print(f"instructions per call on the caller's thread (callgrind, {args.calls:,} calls, sidecar idle)")
    header = f"  {'call':<44}{'this tree':>12}"
    if args.library:
        header += f"{'--library':>12}{'ratio':>8}"
    print(header)
    labels = {
        "object": "emit(RunEvent) (openlineage-python object)",
        "dict": "emit(dict)",
        "bytes": "emit(bytes) (pre-serialized)",
        "helpers": "run helpers: START + COMPLETE, building incl.",
        "helpers-span": "the same, each in a span of its own trace",
    }
    for case in args.cases:
        ours = per_call(case, args.calls, None)
        line = f"  {labels[case]:<44}{ours:>12,.0f}"
        if args.library:
            theirs = per_call(case, args.calls, args.library)
            line += f"{theirs:>12,.0f}{ours / theirs:>8.2f}"
        print(line, flush=True)
    return 0
