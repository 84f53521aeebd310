"""The SSD throughput tool's FLOPs per image, counted on the plain model's training step."""

import torch

from benchmarks.ssd import throughput
from common.mfu import COUNTED, MFU
from common.precision import Precision

CPU = torch.device("cpu")


def test_plain_steps_flops_are_counted_and_the_same_per_image_at_any_batch():
    """Every image is 300 x 300: a batch of two counts twice the work of one (narrow model)."""
    def counted(batch_size):
        return MFU.measure(lambda: throughput.workload(
            batch_size, 4, Precision("fp32", "cpu"), CPU, "--device", "cpu", "--width", "4"), CPU)
    one, two = counted(1), counted(2)
    assert one.flops_from == COUNTED and one.flops_per_sample > 1e9
    assert two.flops_per_sample == one.flops_per_sample


def test_the_variants_come_from_the_registry_and_the_1xh100_config():
    """``config`` is the GPU config's step (its optimisations but the input pipeline's);
    ``config-minus-image-cache`` would time the same step, so there is none."""
    variants = throughput.ours_variants()
    assert variants["plain"] == []
    assert variants["config"] == ["channels-last", "space-to-depth", "fused-pool",
                                  "class-last-heads", "fused-match", "compile=tuned",
                                  "cuda-graph"]
    assert "compile=tuned" not in variants["config-minus-compile"]
    assert not {"config-minus-image-cache", "config-minus-fused-jitter"} & variants.keys()
    assert not set(variants) & set(throughput.BASELINES)
