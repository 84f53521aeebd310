import logging

import pytest
import torch

from common.workload import (
    CapturePolicy,
    EvalPoint,
    Target,
    epoch_points,
    evaluation_epochs,
    interval_points,
    maybe_compile,
)


def test_mlperf_resnet_schedule():
    epochs = evaluation_epochs(4, 2, 37)
    assert epochs == [3, 7, 11, 15, 19, 23, 27, 31, 35, 37]
    points = epoch_points(epochs, 10)
    assert points[0] == EvalPoint(step=30, epoch_num=3, first_epoch_num=1, epoch_count=3)
    assert points[1] == EvalPoint(step=70, epoch_num=7, first_epoch_num=4, epoch_count=4)
    assert sum(p.epoch_count for p in points) == 37 and points[-1].step == 370


def test_every_epoch_schedule():
    assert evaluation_epochs(1, 0, 3) == [1, 2, 3]
    assert [p.first_epoch_num for p in epoch_points([1, 2, 3], 4)] == [1, 2, 3]


def test_interval_points_from_a_start_other_than_zero():
    points = interval_points([2, 4], lambda step: 1 + step / 4, start=1)
    assert points == [EvalPoint(2, 1.5, 1, 0.5), EvalPoint(4, 2.0, 1.5, 0.5)]


def test_interval_points_in_samples_start_where_the_last_block_ended():
    points = interval_points([3, 5], lambda step: step * 8)
    assert points == [EvalPoint(3, 24, 0, 24), EvalPoint(5, 40, 24, 16)]


@pytest.mark.parametrize("period,offset,epochs", [(0, 0, 3), (4, 4, 10), (1, 0, 0)])
def test_bad_schedules_rejected(period, offset, epochs):
    with pytest.raises(ValueError):
        evaluation_epochs(period, offset, epochs)


@pytest.mark.parametrize("make", [lambda: epoch_points([2, 2], 1),
                                  lambda: interval_points([0, 3], float),
                                  lambda: interval_points([], float)])
def test_points_must_rise(make):
    with pytest.raises(ValueError):
        make()


def test_targets_higher_and_lower_is_better():
    acc, wer = Target("top1", 0.759), Target("wer", 0.058, higher_is_better=False)
    assert acc.met({"top1": 0.759}) and not acc.met({"top1": 0.7589})
    assert wer.met({"wer": 0.058}) and wer.met({"wer": 0.01}) and not wer.met({"wer": 0.0581})
    assert str(wer) == "wer <= 0.058"


@pytest.mark.parametrize("kwargs", [dict(mode="sometimes"), dict(mode="static", max_graphs=2),
                                    dict(mode="bucketed", max_graphs=0)])
def test_bad_capture_policies_rejected(kwargs):
    with pytest.raises(ValueError):
        CapturePolicy(**kwargs)


def test_maybe_compile_passes_inductor_options_and_rejects_unknown_ones():
    x = torch.arange(4.0)
    assert torch.equal(maybe_compile(lambda t: t * 2 + 1, "default",
                                     loop_ordering_after_fusion=False)(x), x * 2 + 1)
    with pytest.raises(RuntimeError, match="no_such_option"):
        maybe_compile(lambda t: t, "default", no_such_option=1)


def test_tuned_mode_compiles_and_quiets_only_the_tuners_failed_candidates():
    x = torch.arange(4.0)
    assert torch.equal(maybe_compile(lambda t: t * 3 - 1, "tuned")(x), x * 3 - 1)
    log = logging.getLogger("torch._inductor.runtime.triton_heuristics")

    def record(msg):
        return log.makeRecord(log.name, logging.ERROR, __file__, 0, msg, ("k", "src", {}), None)
    assert not log.filter(record("Triton compilation failed: %s\n%s\nmetadata: %s"))
    assert log.filter(record("Triton autotuning failed: %s %s %s"))
