"""The `growing` flood (tests/scripts/flood.py) N times, four at a time, beside two CPU-bound
processes: the byte bound by construction under the load that broke it in CI (#39).

    python tests/scripts/flood_beside_load.py [N] [KIND]     # default: 20 growing

Prints each flood's growth (MiB) and events held, then the largest growth against the bound the
test checks (1.5 x max_bytes + 60 MiB = 156 MiB) and how many passed it.
"""

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FLOOD = Path(__file__).with_name("flood.py")
BOUND_MIB = 1.5 * 64 + 60
# What tests/integration/buffer/test_memory.py allows the growing flood to hold.
HELD = 2000 + 64 * 1024 * 1024 // 100_000


def one(kind: str) -> tuple[float, int]:
    result = subprocess.run(
        [sys.executable, str(FLOOD), kind, "20000", str(HELD)], capture_output=True, text=True, check=True
    )
    grown, held = result.stdout.split()[:2]
    return float(grown), int(held)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    kind = sys.argv[2] if len(sys.argv) > 2 else "growing"
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        with ThreadPoolExecutor(4) as pool:
            results = sorted(pool.map(one, [kind] * runs))
    finally:
        for process in busy:
            process.kill()
    for grown, held in results:
        print(f"grew {grown:6.1f} MiB, held {held} events")
    over = sum(grown > BOUND_MIB for grown, _ in results)
    largest = results[-1][0]
    print(f"{kind}: {runs} floods, largest growth {largest:.1f} MiB (bound {BOUND_MIB:.0f}); {over} over it")


if __name__ == "__main__":
    main()
