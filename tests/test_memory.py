"""max_bytes bounds memory for every kind of event: a flood of 100 KB events against a backend
that is down (peak RSS, in a fresh interpreter).  Before, objects were held at a 1 KiB estimate:
the same flood of dicts grew the process by 1,068 MiB (20,000 events, max_bytes 64 MiB).

Typical growth now is 73-86 MiB for every kind.  The first object events are sized by a guess
until the sidecar has measured one, and on a busy machine the emitting thread can get ahead of it
for a while (172 MiB once on Python 3.13; 238 MiB with the machine running a second test suite), so
the peak RSS bound checked here is 4 x max_bytes + 60 MiB; what the outbox holds once it has
measured is checked exactly."""

import subprocess
import sys
from pathlib import Path

import pytest

FLOOD = Path(__file__).parent / "scripts" / "flood.py"
MAX_BYTES_MIB = 64


@pytest.mark.parametrize("kind", ["dict", "object", "str", "bytes", "strsub", "bytessub"])
def test_a_flood_of_large_events_stays_within_the_byte_bound(kind):
    result = subprocess.run(
        [sys.executable, str(FLOOD), kind, "20000"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    grown, held = result.stdout.split()[:2]
    assert float(grown) <= 4 * MAX_BYTES_MIB + 60, result.stderr
    # 100 KB events in 64 MiB: a few hundred held, the rest counted as dropped.
    assert int(held) <= MAX_BYTES_MIB * 1024 * 1024 // 100_000
    assert "dropped_full" in result.stdout
