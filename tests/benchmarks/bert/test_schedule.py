"""The reference learning-rate schedule and the MLPerf evaluation schedule by samples."""

import pytest
import torch

from benchmarks.bert.schedule import bert_lr, eval_interval_samples, eval_steps


def test_linear_decay_without_warmup():
    assert bert_lr(0, 3.5e-4, 7100, 0, 0) == pytest.approx(3.5e-4)
    assert bert_lr(3550, 3.5e-4, 7100, 0, 0) == pytest.approx(1.75e-4)
    assert bert_lr(7100, 3.5e-4, 7100, 0, 0) == 0.0
    assert bert_lr(9000, 3.5e-4, 7100, 0, 0) == 0.0


def test_warmup_with_negative_start_warmup_step():
    # bert_ref_8192: 287 warm-up steps starting at step -76
    lr = 0.00288293
    assert bert_lr(0, lr, 600, 287, -76) == pytest.approx(lr * 76 / 287)
    assert bert_lr(210, lr, 600, 287, -76) == pytest.approx(lr * 286 / 287)
    assert bert_lr(211, lr, 600, 287, -76) == pytest.approx(lr * (1 - 211 / 600))


def test_tensor_form_matches_python_form():
    steps = torch.arange(0, 700, 7)
    got = bert_lr(steps, 0.002, 600, 287, -76)
    want = torch.tensor([bert_lr(int(s), 0.002, 600, 287, -76) for s in steps])
    torch.testing.assert_close(got, want.float())


def test_eval_interval_rule():
    assert eval_interval_samples(448) == 150_000   # NVIDIA v1.1 8-GPU config
    assert eval_interval_samples(256) == 150_000
    assert eval_interval_samples(8192) == 225_000


def test_eval_steps():
    assert eval_steps(448, 150_000, 150_000, 1100) == [335, 670, 1005, 1100]
    assert eval_steps(32, 1600, 1600, 120) == [50, 100, 120]
    assert eval_steps(32, 0, 1600, 60) == [50, 60]
