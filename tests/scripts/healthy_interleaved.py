"""Events/s to a healthy backend (the ``--only healthy`` scenario of
``python -m outbox.tools.benchmarks``), for several trees, interleaved: each round runs every
cell (the does-no-work server and ``outbox sink``, one lane and 8) once per tree, back to back,
the trees in a rotated order; the figures are each tree's median over the rounds and the median
of its ratios to the first tree within a round.
On a shared machine one sitting's events/s drift by 15% and more from run to run; interleaving
many short runs lets the drift fall on every tree alike.  Run it from outside any checkout (each
tree is put on PYTHONPATH in turn; a tree is any checkout or worktree of this repository):

    python tests/scripts/healthy_interleaved.py [--rounds 6] [--cells null:1,sink:1] TREE [TREE ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

NAMES = {"NULL_SERVER": "does-no-work server", "SINK": "outbox sink"}


def one_run(tree: str, server: str, lanes: int, runs: int) -> float:
    code = (
        "from outbox.tools.benchmarks import throughput as t;"
        f"print(t.bench_healthy(t.{server}, {runs}, {lanes})['per_s'])"
    )
    env = {**os.environ, "PYTHONPATH": tree}
    with tempfile.TemporaryDirectory() as away:  # not in a checkout: `outbox` is the tree's
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=away, capture_output=True, text=True, timeout=600
        )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {server} with {lanes} lane(s) failed:\n{done.stderr}")
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="checkouts to compare; ratios are to the first")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=50_000, help="runs (START + COMPLETE) per measurement")
    parser.add_argument("--cells", default="null:1,null:8,sink:1,sink:8", help="server:lanes,...")
    args = parser.parse_args()
    servers = {"null": "NULL_SERVER", "sink": "SINK"}
    cells = [(servers[cell.split(":")[0]], int(cell.split(":")[1])) for cell in args.cells.split(",")]
    trees = [os.path.abspath(tree) for tree in args.trees]
    figures: dict[tuple[str, str, int], list[float]] = {}
    for round_ in range(args.rounds):
        order = trees[round_ % len(trees) :] + trees[: round_ % len(trees)]
        for server, lanes in cells:
            for tree in order:
                rate = one_run(tree, server, lanes, args.runs)
                figures.setdefault((tree, server, lanes), []).append(rate)
        print(f"round {round_ + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    for server, lanes in cells:
        print(f"{NAMES[server]}, max_concurrency={lanes} (median of {args.rounds}, events/s):")
        anchor = figures[(trees[0], server, lanes)]
        for tree in trees:
            rates = figures[(tree, server, lanes)]
            ratio = statistics.median(rate / first for rate, first in zip(rates, anchor, strict=True))
            each = " ".join(f"{rate:,.0f}" for rate in rates)
            print(f"  {tree:<28} {statistics.median(rates):>9,.0f}  ratio {ratio:.2f}   ({each})")


if __name__ == "__main__":
    main()
