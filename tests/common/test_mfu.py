"""MFU: FLOPs counted on one training step against their formulas (a linear layer, a
convolution, nn.LSTM's fused kernel), a workload's formula preferred to a count, and the
utilisation over the bf16 peak (n/a on the CPU)."""

import types

import pytest
import torch

from common.mfu import COUNTED, FORMULA, MFU, RNN_FLOPS, count_flops

CPU = torch.device("cpu")


def train(model):
    """One forward and backward: every weight and the input get gradients (3x forward)."""
    def step(x):
        model(x.requires_grad_()).sum().backward()
    return step


def test_a_linear_layer_counts_2_in_out_per_sample_forward_and_3x_with_backward():
    assert count_flops(train(torch.nn.Linear(16, 24)), (torch.randn(5, 16),), 5) == \
        3 * 2 * 16 * 24


def test_a_convolution_counts_2_cin_cout_k2_per_output_pixel_forward_and_3x_with_backward():
    conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
    assert count_flops(train(conv), (torch.randn(2, 3, 16, 16),), 2) == \
        3 * 2 * 3 * 8 * 9 * 8 * 8


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_lstm_kernels_count_2_per_weight_and_step_forward_and_3x_with_backward():
    """oneDNN's fused LSTM (FlopCounterMode has no formula for it) counts as the unfused
    cells count, forward; cuDNN's kernel (GPU only) gets the same formula from the same
    weight shapes."""
    lstm = torch.nn.LSTM(16, 32, 2, batch_first=True)
    x = torch.randn(3, 10, 16)
    forward = 2 * 4 * 32 * (16 + 32 + 32 + 32) * 3 * 10
    assert count_flops(lambda x: lstm(x), (x,), 1) == forward
    with torch.backends.mkldnn.flags(enabled=False):    # the unfused cells' matmuls
        assert count_flops(lambda x: lstm(x), (x,), 1) == forward
    assert count_flops(lambda x: lstm(x)[0].sum().backward(), (x,), 1) == 3 * forward
    shapes = [w.shape for w in lstm._flat_weights]
    assert RNN_FLOPS[torch.ops.aten._cudnn_rnn](x.shape, shapes) == forward
    assert RNN_FLOPS[torch.ops.aten._cudnn_rnn_backward](x.shape, shapes) == 2 * forward


def test_a_workloads_formula_comes_before_a_count_and_a_count_is_per_sample():
    model = torch.nn.Linear(4, 6)
    counted = types.SimpleNamespace(flops_per_sample=None, train_step=train(model))
    mfu = MFU.measure(lambda: (counted, (torch.randn(8, 4),)), CPU)
    assert (mfu.flops_per_sample, mfu.flops_from) == (3 * 2 * 4 * 6, COUNTED)
    formula = types.SimpleNamespace(flops_per_sample=7.0, train_step=None)
    assert MFU.measure(lambda: (formula, None), CPU).flops_from == FORMULA
    other = mfu.counted(lambda x: model(x), (torch.randn(2, 4),))
    assert other.flops_per_sample == 2 * 4 * 6 and other.flops_from == COUNTED


def test_mfu_is_flops_times_rate_over_every_gpus_peak_and_na_on_the_cpu():
    mfu = MFU(1e9, FORMULA, 100.0, gpus=2)
    assert mfu(300.0) == pytest.approx(1e9 * 300 / (2 * 100e12))
    assert mfu.row(300.0) == {"mfu": mfu(300.0), "flops_per_sample": 1e9,
                              "flops_from": FORMULA, "bf16_peak_tflops": 100.0}
    assert mfu.text(200.0) == "MFU  0.1%" and "(formula)" in str(mfu)
    cpu = MFU(1e9, COUNTED, None)
    assert cpu(300.0) is None and cpu.text(300.0) == "MFU n/a on CPU"
    assert "n/a" in str(cpu) and "(counted at this batch)" in str(cpu)


def test_the_peak_probe_leaves_the_tf32_flag_as_it_was_when_it_fails():
    from common.bench.probe import peak_tflops

    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with pytest.raises(KeyError):
            peak_tflops("no-such-precision", torch.device("cpu"))
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
