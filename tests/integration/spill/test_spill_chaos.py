"""The spill's chaos test (tests/support/spill_chaos.py): owners sharing one directory, killed
at random points or closed, a flapping backend, every overflow policy, small disks; the
accounting checked event by event.  ``SPILL_CHAOS_SEEDS`` (comma-separated) and
``SPILL_CHAOS_GENERATIONS`` change it; ``python tests/support/spill_chaos.py --seed N`` runs one
outside pytest."""

import os

import pytest

from support.spill_chaos import run_spill_chaos

# A minute or so of processes and faults: once per CI run, on 3.11 (docs/development.md).
pytestmark = pytest.mark.slow

SEEDS = [int(s) for s in os.environ.get("SPILL_CHAOS_SEEDS", "20261205,36").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_every_accepted_event_is_delivered_or_counted_lost_once_across_crashes(seed):
    generations = int(os.environ.get("SPILL_CHAOS_GENERATIONS", "5"))
    outcome = run_spill_chaos(seed, generations)
    # It drove the spill through the hard parts: owners killed and adopted, events lost and
    # counted, and the last outbox had something to drain.
    assert outcome["killed"] >= 1, outcome
    assert outcome["accepted"] > 1000, outcome
    assert outcome["delivered"] > 0, outcome
