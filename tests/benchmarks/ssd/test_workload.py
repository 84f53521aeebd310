"""The SSD workload's schedule and checks against the v1.1 reference's definitions."""

import pytest
import torch

from benchmarks.ssd.model import SSD300
from benchmarks.ssd.workload import HParams, SSDWorkload, lr_at
from common.coco import cli
from common.errors import UserError


def reference_lr(iter_num: int, base: float, wb: int, factor: int, spe: int, decays) -> float:
    """train.py: x0.1 at the start of each decay epoch, then lr_warmup for iter < wb."""
    lr = base * 0.1 ** sum(1 for e in decays if iter_num // spe >= e)
    if iter_num < wb:
        lr = lr - (wb - iter_num) * lr / (wb * 2 ** factor)
    return lr


@pytest.mark.parametrize("factor", [0, 1])
def test_lr_is_the_references_warmup_and_decay(factor):
    for step in [0, 1, 49, 50, 51, 399, 400, 499, 500, 900]:
        got = lr_at(torch.tensor(float(step)), 0.16, 50, factor, 10, [40, 50]).item()
        assert got == pytest.approx(reference_lr(step, 0.16, 50, factor, 10, [40, 50]),
                                    rel=1e-5, abs=1e-9), step   # float32 on the device


def test_evaluation_points_and_decay_boundaries_follow_the_rules(monkeypatch):
    monkeypatch.setattr(SSDWorkload, "steps_per_epoch", 7)
    wl = SSDWorkload.__new__(SSDWorkload)
    wl.hp = HParams()   # the reference's
    points = wl.eval_points()
    assert [p.epoch_num for p in points] == [40, 50, 55, 60, 65, 70, 75, 80]
    assert points[0].step == 280 and (points[1].first_epoch_num, points[1].epoch_count) == (41, 10)
    first, second = wl.hp.lr_decay_epochs   # closed_ssd.yaml's integer rules
    assert (10 * (first / 40 - 1)).is_integer() and (10 * (second / 50 - 1)).is_integer()


def test_a_backbone_checkpoint_of_another_format_is_one_line(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"conv.weight": torch.zeros(1)}, path)
    with pytest.raises(UserError, match="not a torchvision resnet34 state dict") as e:
        cli.load_backbone(path, "resnet34", SSD300(6, 8).backbone.load_torchvision)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_fused_match_off_the_gpu_is_one_line():
    from common.dist import DistEnv
    from common.precision import Precision
    from common.training import build_parser

    args = SSDWorkload.parse_bench_args(build_parser(SSDWorkload),
                                        ["--opt", "fused-match", "--width", "8"], "synthetic", 2)
    with pytest.raises(UserError, match="optimisation fused-match needs CUDA") as e:
        SSDWorkload(args, DistEnv(device=torch.device("cpu")), Precision("fp32", "cpu"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("flag, value", [("--batch-size", "0"), ("--epochs", "-1"),
                                         ("--max-samples", "7"), ("--lr-decay-epochs", "40,x"),
                                         ("--bn-group", "0"), ("--momentum", "1")])
def test_a_bad_hyper_parameter_is_a_one_line_parse_error(flag, value, capsys):
    from common.training import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser(SSDWorkload).parse_args(["--synthetic-data", flag, value])
    assert e.value.code == 2
    assert flag in capsys.readouterr().err.strip().splitlines()[-1]
