"""``--compile``: the networks' three compiled regions give the eager step's losses and
gradients, on batches whose padded size changes (the regions turn dynamic instead of
recompiling for every size)."""

import torch
from torch._dynamo.utils import counters

from benchmarks.maskrcnn import data
from tests.benchmarks.maskrcnn.test_workload import TINY, build


def test_compiled_regions_compute_the_eager_steps_losses_and_gradients():
    torch._dynamo.reset()
    counters.clear()
    plain, compiled = build(TINY), build([*TINY, "--compile", "default"])
    compiled.net.load_state_dict(plain.net.state_dict())
    small = data.synthetic_batch(2, plain.num_classes, 64, 64)
    large = data.synthetic_batch(2, plain.num_classes, 96, 128)
    assert small.images.shape[-2:] != large.images.shape[-2:]
    for batch in (small, large, small):
        losses = []
        for wl in (plain, compiled):
            torch.manual_seed(1)                # the same anchors and RoIs sampled
            losses.append(wl.train_step(*batch))
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-6)
    for (name, p), q in zip(plain.net.named_parameters(), compiled.net.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-6, msg=name)
    # three regions, each compiled once static and once dynamic at most
    assert 3 <= counters["stats"]["unique_graphs"] <= 6, dict(counters["stats"])
