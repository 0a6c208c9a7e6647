"""One lane against a healthy backend, request by request: how long each request is on the wire,
and how long the sidecar takes between an answer and its next request, for several trees.
With one lane, events/s is the time of all requests plus all gaps; a worker that serializes
the next batch while a request is on the wire has small gaps.  Run it from outside any
checkout (each tree is put on PYTHONPATH in turn):

    python tests/scripts/lane_gaps.py [--runs 50000] [--repeat 3] [--server null|sink] TREE [TREE ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

PROBE = """
import statistics, sys, time
from outbox import Outbox
from outbox.tools.benchmarks import throughput as t
from outbox.transports import HttpTransport

runs, server = int(sys.argv[1]), getattr(t, sys.argv[2])
with t.Server(*server) as url:
    transport = HttpTransport(url, mode="batch")
    spans = []
    send = transport.send

    async def timed(batch, deadline):
        started = time.perf_counter()
        try:
            return await send(batch, deadline)
        finally:
            spans.append((started, time.perf_counter()))

    transport.send = timed
    outbox = Outbox(transport, max_events=2 * runs, max_bytes=2**31, max_concurrency=1, close_at_exit=False)
    started = time.perf_counter()
    t._emit_runs(outbox, t._job(), runs)
    emitted = time.perf_counter()
    report = outbox.close(300)
    ended = time.perf_counter()
assert report.delivered == 2 * runs, report
wire = [b - a for a, b in spans]
gaps = [spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1)]
print(
    f"{report.delivered / (ended - started):>9,.0f} events/s  {len(spans)} requests  "
    f"on the wire {sum(wire):5.2f} s (median {statistics.median(wire) * 1e3:5.2f} ms)  "
    f"between {sum(gaps):5.2f} s (median {statistics.median(gaps) * 1e3:5.2f} ms)  "
    f"emitting {emitted - started:4.2f} s of {ended - started:4.2f} s"
)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--runs", type=int, default=50_000, help="runs (START + COMPLETE) per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per tree, interleaved")
    parser.add_argument("--server", choices=("null", "sink"), default="null")
    args = parser.parse_args()
    server = {"null": "NULL_SERVER", "sink": "SINK"}[args.server]
    trees = [os.path.abspath(tree) for tree in args.trees]
    for round_ in range(args.repeat):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": tree}
            with tempfile.TemporaryDirectory() as away:  # not in a checkout: `outbox` is the tree's
                done = subprocess.run(
                    [sys.executable, "-c", PROBE, str(args.runs), server],
                    env=env,
                    cwd=away,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
            if done.returncode != 0:
                raise SystemExit(f"{tree} failed:\n{done.stderr}")
            print(f"{round_ + 1}  {os.path.basename(tree):<14} {done.stdout.strip()}", flush=True)


if __name__ == "__main__":
    main()
