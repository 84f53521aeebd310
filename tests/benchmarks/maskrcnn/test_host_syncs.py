"""Host synchronisations of one Mask R-CNN training step, counted on the CPU as they would
happen on a GPU (``tests.host_syncs``). The count must not grow with the batch (no per-image
syncs); NMS's rounds are counted apart."""

import collections

import pytest

from tests.benchmarks.maskrcnn.test_workload import TINY, build
from tests.host_syncs import SyncCounter

MOST_PER_STEP = 1       # the RoI counts; the RPN's proposals none (padded rows, fixed widths)


def step_syncs(batch_size: int) -> collections.Counter:
    """Syncs of the second training step (the first makes the cached constants)."""
    argv = list(TINY)
    argv[argv.index("--batch-size") + 1] = str(batch_size)
    wl = build(argv)
    batch = wl.synthetic_batch(batch_size)
    wl.train_step(*batch)
    with SyncCounter("benchmarks/maskrcnn/") as counter:
        wl.train_step(*batch)
    return counter.calls


@pytest.mark.parametrize("batch_size", [2, 4])
def test_a_training_step_syncs_a_few_times_whatever_the_batch(batch_size):
    calls = step_syncs(batch_size)
    rounds = sum(n for where, n in calls.items() if where.startswith("_greedy_keep"))
    others = {where: n for where, n in calls.items() if not where.startswith("_greedy_keep")}
    assert rounds >= 1
    assert sum(others.values()) <= MOST_PER_STEP, others
