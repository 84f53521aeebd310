"""ResNet's real training step in amp-fp16: device-side loss scaling and cudnn-fusion."""

import pytest
import torch

from benchmarks.resnet.workload import ResNetWorkload
from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.errors import UserError
from common.precision import Precision
from common.training import build_parser, warm_up


def _workload(*flags: str) -> ResNetWorkload:
    args = ResNetWorkload.parse_bench_args(
        build_parser(ResNetWorkload),
        ["--precision", "amp-fp16", "--seed", "0", "--image-size", "32", "--eval-batch-size", "2",
         *flags], "synthetic", 2)
    wl = ResNetWorkload(args, DistEnv(), Precision("amp-fp16", "cpu"))
    wl.setup()
    return wl


def test_fp16_step_trains_and_an_overflow_skips_it_on_the_device():
    torch.manual_seed(0)
    wl = _workload("--opt", "channels-last,cudnn-fusion,space-to-depth")
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
        _workload("--opt", "channels-last,cudnn-fusion", "--bn-group", "2")


def _counted(step, calls: list):
    def run(*batch):
        calls.append(1)
        return step(*batch)
    return run


def test_init_steps_leave_training_as_it_would_have_been():
    """After ``--init-steps`` (warm-up steps, then the state restored) training goes on
    exactly as in a workload that never warmed up: training_state lists all it needs."""
    runs = []
    for init_steps in (0, 3):
        torch.manual_seed(0)
        wl = _workload("--opt", "channels-last,cudnn-fusion,space-to-depth")
        wl.scaler.loss_scale.fill_(128.0)
        initial = [t.clone() for t in wl.training_state()]
        calls = []
        warm_up(wl, GraphedStep(_counted(wl.train_step, calls), enabled=False), init_steps,
                wl.env)
        assert len(calls) == init_steps
        batch = wl.synthetic_batch(2)
        losses = [wl.train_step(*batch) for _ in range(3)]
        state = [t.clone() for t in wl.training_state()]
        assert not all(torch.equal(a, b) for a, b in zip(initial, state))  # it trained
        runs.append((losses, state))
    (losses0, state0), (losses3, state3) = runs
    assert all(torch.equal(a, b) for a, b in zip(losses0, losses3))
    assert all(torch.equal(a, b) for a, b in zip(state0, state3))


def test_a_schedule_that_ends_within_its_warm_up_is_one_line():
    with pytest.raises(UserError, match=r"--epochs 1 ends within the --warmup-epochs 1.0 "
                                        r"warm-up: raise --epochs"):
        _workload("--epochs", "1", "--warmup-epochs", "1")


def test_a_first_evaluation_beyond_its_period_is_one_line_before_the_run():
    with pytest.raises(UserError, match=r"--eval-offset 4 is not less than --eval-period 4"):
        _workload("--eval-period", "4", "--eval-offset", "4")
