"""max_bytes bounds memory for every kind of event: a flood of 100 KB events against a backend
that is down (peak RSS, in a fresh interpreter), within the bound the issue set: 1.5 x max_bytes
+ 60 MiB.  Before, objects were held at a 1 KiB estimate: the same flood of dicts grew the process
by 1,068 MiB (20,000 events, max_bytes 64 MiB); then, with the sidecar measuring, by up to 358 MiB
when the burst came while its thread was starting, and 272 MiB when small events came first and
the sidecar, behind, learnt late that they had grown ("growing"); in CI, 204 MiB for dicts when a
starved sidecar had measured nothing by the 1,400th (the emitter now measures one itself after
64), and up to 175 MiB for objects beside six CPU-bound processes, whose 100 KB job name was held
again, uncounted, in the message key (now counted).  Beside six such processes now: dict 113-121
MiB, object 77-82 MiB."""

import subprocess
import sys

import pytest

from support.paths import TESTS

FLOOD = TESTS / "scripts" / "flood.py"
MAX_BYTES_MIB = 64

# Eight floods in fresh interpreters (about 15 s): once per CI run, on 3.11 (docs/development.md),
# one after the other in one worker (--dist loadgroup): floods side by side starve each other's
# sidecars, a load beyond the two busy processes the figures in docs/operations.md were taken beside.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("memory")]


@pytest.mark.parametrize(
    "kind", ["dict", "object", "str", "bytes", "strsub", "bytessub", "growing", "mix", "textafter"]
)
def test_a_flood_of_large_events_stays_within_the_byte_bound(kind):
    # 100 KB events in 64 MiB: a few hundred held, the rest counted as dropped ("growing" sends
    # 2,000 small ones first, all of which fit; "textafter" 500 small objects, then text: evicted
    # text must not wait for the sidecar's free as objects at their short estimate do, 169-254 MiB).
    small = {"growing": 2000, "textafter": 500}.get(kind, 0)
    bound = small + MAX_BYTES_MIB * 1024 * 1024 // 100_000
    if kind == "mix":
        # Three small ones for each large one: about 4x as many fit, but the objects are held at
        # an estimate learnt from samples of both sizes, not their exact sizes, so the count
        # strays a little (2,694 once beside load, against 4x's 2,684); the bytes are the bound.
        bound = bound * 4 * 11 // 10
    result = subprocess.run(
        [sys.executable, str(FLOOD), kind, "20000", str(bound)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    grown, held = result.stdout.split()[:2]
    assert float(grown) <= 1.5 * MAX_BYTES_MIB + 60, result.stderr
    assert int(held) <= bound, result.stderr
    assert "dropped_full" in result.stdout
