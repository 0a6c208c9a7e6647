"""The randomized stateful test (see tests/support/chaos.py): one fixed seed for about a minute,
the spill's directory on a 4 MiB tmpfs that fills and frees (as root, and always in CI).

``CHAOS_SEED`` and ``CHAOS_SECONDS`` change it; ``python tests/support/chaos.py --seed N --seconds S``
runs a longer soak outside pytest.
"""

import os

import pytest

from support.chaos import run_chaos

# A minute of random faults: once per CI run, on 3.11 (docs/development.md).
pytestmark = pytest.mark.slow


def test_chaos_keeps_every_invariant_through_random_faults():
    seed = int(os.environ.get("CHAOS_SEED", "20261202"))
    seconds = float(os.environ.get("CHAOS_SECONDS", "60"))
    # The spill's directory on a disk that fills and frees: mounting it needs root, as CI runs.
    disk = os.geteuid() == 0 or os.environ.get("CI") == "true"
    chaos = run_chaos(seed, seconds, disk=disk)
    # It drove the outbox through the hard parts, not only emits.
    assert chaos.closes >= 3, chaos.summary()
    assert chaos.forks >= 1, chaos.summary()
    assert chaos.sigterms >= 1, chaos.summary()
    assert len(set(chaos.steps)) >= 10, chaos.summary()
    # A composite with its second member down, black-holed or slow, and the adapter, took part.
    assert chaos.shapes["composite"] >= 1, chaos.summary()
    assert chaos.shapes["adapter"] >= 1, chaos.summary()
    assert any(step.startswith("member backend") for step in chaos.steps), chaos.summary()
