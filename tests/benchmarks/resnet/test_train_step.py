"""ResNet's real training step in amp-fp16: device-side loss scaling and --cudnn-fusion."""

import pytest
import torch

from benchmarks.resnet.workload import ResNetWorkload
from common.dist import DistEnv
from common.errors import UserError
from common.precision import Precision
from common.training import build_parser


def _workload(*flags: str) -> ResNetWorkload:
    args = ResNetWorkload.parse_bench_args(
        build_parser(ResNetWorkload),
        ["--precision", "amp-fp16", "--seed", "0", "--image-size", "32", *flags], "synthetic", 2)
    wl = ResNetWorkload(args, DistEnv(), Precision("amp-fp16", "cpu"))
    wl.build()
    return wl


def test_fp16_step_trains_and_an_overflow_skips_it_on_the_device():
    torch.manual_seed(0)
    wl = _workload("--cudnn-fusion", "--space-to-depth")
    batch = wl.synthetic_batch(2)
    wl.scaler.loss_scale.fill_(128.0)  # low enough not to overflow this tiny model
    wl.train_step(*batch)  # the learning rate warms up from 0
    before = [p.detach().clone() for p in wl.net.parameters()]
    assert torch.isfinite(wl.train_step(*batch))
    assert wl.scaler.loss_scale.item() == 128.0  # no overflow
    assert any(not torch.equal(a, p) for a, p in zip(before, wl.net.parameters()))

    wl.scaler.loss_scale.fill_(1e30)  # the scaled loss overflows fp16 in the backward
    before = [p.detach().clone() for p in wl.net.parameters()]
    momenta = [s["momentum_buffer"].clone() for s in wl.optimizer.state.values()]
    wl.train_step(*batch)
    for a, p in zip(before, wl.net.parameters()):
        assert torch.equal(a, p)
    for a, s in zip(momenta, wl.optimizer.state.values()):
        assert torch.equal(a, s["momentum_buffer"])
    assert wl.scaler.loss_scale.item() == pytest.approx(5e29)


def test_cudnn_fusion_refuses_group_batch_norm():
    with pytest.raises(UserError, match="--bn-group 2"):
        _workload("--cudnn-fusion", "--bn-group", "2")
