"""``fp8-ffn`` and ``fp8-wgrad`` (``benchmarks/bert/fp8.py``): the FP8 feed-forward block, its
weight gradients in bf16 or in FP8, against the same block computed in fp32 from operands
quantised here by hand (the plumbing: scales, formats, layouts,
the GELU chain, within bf16 rounding), and against the plain fp32 block (FP8's own error: E4M3
keeps 3 mantissa bits, E5M2 2, about 5% and 9% of a random GEMM's output); the delayed scales'
history; the model with it (evaluation unchanged, training within FP8's error). On the CPU
(torch's casts and GEMMs) and on the GPU (the Triton casts, cuBLASLt's FP8 GEMMs)."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.bert import fp8
from benchmarks.bert.fp8 import E4M3, E5M2, HISTORY, FeedForward, Scales, fp8_ffn, fp8_wgrad
from benchmarks.bert.model import BertConfig
from tests.benchmarks.bert.test_model import _batch, built
from tests.benchmarks.bert.test_qkv import _outputs_and_grads

DEVICES = ["cpu"] + ["cuda"] * (torch.cuda.is_available()
                                and torch.cuda.get_device_capability() >= (8, 9))
WGRAD = pytest.mark.parametrize("wgrad", [False, True], ids=["fp8-ffn", "fp8-wgrad"])


def _scales(device, wgrad=False):
    scales = Scales(1, device)
    scales.wgrad = wgrad
    scales.advance()                       # the first step: each tensor by its own magnitude
    return scales


def _q(t, dtype, scale=None):
    """``t`` through ``dtype`` and back, scaled by ``scale`` or by its own magnitude."""
    fmax = torch.finfo(dtype).max
    scale = fmax / t.abs().max() if scale is None else scale
    return (t * scale).clamp(-fmax, fmax).to(dtype).float() / scale


def _block(device, seed=0, rows=256, h=64, f=256):
    g = torch.Generator().manual_seed(seed)
    x, w1, b1, w2 = (torch.randn(s, generator=g) * k for s, k in (
        ((rows, h), 1.0), ((f, h), 0.05), ((f,), 0.1), ((h, f), 0.05)))
    dy = torch.randn(rows, h, generator=g) * 1e-3
    return [t.bfloat16().to(device) for t in (x, w1, b1, w2, dy)]


def _fp8(x, w1, b1, w2, dy, scales):
    ins = [t.clone().requires_grad_() for t in (x, w1, b1, w2)]
    y = FeedForward.apply(*ins, scales, 0)
    return y.float(), [d.float() for d in torch.autograd.grad(y, ins, dy)]


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.skipif(len(DEVICES) < 2, reason="the Triton kernels: a GPU with FP8")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(256, 64), (64, 256), (250, 64), (768, 4096)])
def test_each_kernel_and_its_transpose_match_torch_byte_for_byte(shape, dtype):
    """The casts (fp32 weights under autocast, bf16 activations) against torch's casts, each
    transpose against the kernel's own FP8 tensor transposed (a transposed store inside the
    casts' programs came out wrong for fp32 inputs on an H200)."""
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 0.05).to("cuda", dtype)
    scales = _scales("cuda", wgrad=True)
    for slot in (0, 2, 4):
        t8, t8t, _ = scales.cast(x, slot, transpose=True)
        want = fp8._scale_by(x, scales.scales[slot], fp8.FORMATS[slot])
        assert torch.equal(t8.view(torch.uint8), want.view(torch.uint8)), slot
        assert torch.equal(t8t.view(torch.uint8), t8.view(torch.uint8).t()), slot
    bias = torch.randn(shape[1], device="cuda") * 0.1
    g8, g8t, _ = scales.gelu(x, bias, 1)
    assert torch.equal(g8t.view(torch.uint8), g8.view(torch.uint8).t())
    dz8, dz8t, _, _ = scales.gelu_backward(x.bfloat16() * 1e-3, x, bias, 3)
    assert torch.equal(dz8t.view(torch.uint8), dz8.view(torch.uint8).t())


@WGRAD
@pytest.mark.parametrize("device", DEVICES)
def test_the_block_equals_fp32_over_operands_quantised_by_hand(device, wgrad):
    x, w1, b1, w2, dy = _block(device)
    y, (dx, dw1, db1, dw2) = _fp8(x, w1, b1, w2, dy, _scales(device, wgrad))

    x, w1, b1, w2, dy = (t.float() for t in (x, w1, b1, w2, dy))
    z = (_q(x, E4M3) @ _q(w1, E4M3).t()).bfloat16().float().requires_grad_()
    g = F.gelu(z + b1)
    want_y = _q(g, E4M3) @ _q(w2, E4M3).t()
    dg = (_q(dy, E5M2) @ _q(w2, E4M3)).bfloat16().float()
    (dz,) = torch.autograd.grad(g, z, dg)
    if wgrad:
        dws = _q(dz, E5M2).t() @ _q(x, E4M3), _q(dy, E5M2).t() @ _q(g, E4M3)
    else:
        dws = dz.bfloat16().float().t() @ x, dy.t() @ g.bfloat16().float()
    want = (_q(dz, E5M2) @ _q(w1, E4M3), dws[0], dz.sum(0), dws[1])
    assert _rel(y, want_y) < 1e-2          # 1.6e-3 on the CPU, 5.1e-3 (dx) on an H200
    for name, got, ref in zip(("x", "w1", "b1", "w2"), (dx, dw1, db1, dw2), want):
        assert _rel(got, ref) < 1e-2, name


@WGRAD
@pytest.mark.parametrize("device", DEVICES)
def test_the_block_is_within_fp8s_error_of_the_plain_block(device, wgrad):
    x, w1, b1, w2, dy = _block(device, seed=1)
    y, grads = _fp8(x, w1, b1, w2, dy, _scales(device, wgrad))
    ins = [t.float().requires_grad_() for t in (x, w1, b1, w2)]
    want_y = F.gelu(ins[0] @ ins[1].t() + ins[2]) @ ins[3].t()
    want = torch.autograd.grad(want_y, ins, dy.float())
    assert 0.01 < _rel(y, want_y) < 0.07     # E4M3 on both operands of both GEMMs
    for name, got, ref in zip(("x", "w1", "b1", "w2"), grads, want):
        assert _rel(got, ref) < 0.12, name   # E5M2 gradients


@WGRAD
@pytest.mark.parametrize("device", DEVICES)
def test_delayed_scales_come_from_the_last_casts(device, wgrad):
    x, w1, b1, w2, dy = _block(device, seed=2)
    scales = _scales(device, wgrad)
    first = _fp8(x, w1, b1, w2, dy, scales)
    amax = scales.amaxes.clone()
    assert amax[0] == x.float().abs().max() and amax[4] == w1.float().abs().max()
    assert (amax > 0).all()
    fmax = torch.tensor([448.0, 448.0, 57344.0, 57344.0, 448.0, 448.0], device=device)
    torch.testing.assert_close(scales.scales, fmax / amax)     # each by its own magnitude
    scales.advance()                       # the second step: the first's magnitudes
    torch.testing.assert_close(scales.scales, fmax / amax)
    torch.testing.assert_close(scales.inverses[:, 0], amax / fmax)
    assert (scales.amaxes == 0).all()
    # the same tensors, now by the delayed scales, which are their own: the same results
    second = _fp8(x, w1, b1, w2, dy, scales)
    torch.testing.assert_close(second[0], first[0])
    # a tensor twice as large saturates at the old scale (clamped, not inf)
    y, _ = _fp8(2 * x, w1, b1, w2, dy, scales)
    assert torch.isfinite(y).all()
    for _ in range(HISTORY + 1):          # the history forgets what is older than HISTORY
        scales.advance()
    assert scales.history.shape == (6, HISTORY) and (scales.history[:, -1] == 0).all()
    assert (scales.history[:, 0] == 0).all()   # the last steps cast nothing


@WGRAD
@pytest.mark.parametrize("device", DEVICES)
def test_the_model_with_it_trains_within_fp8s_error_and_evaluates_unchanged(device, wgrad):
    torch.manual_seed(0)
    c = BertConfig(vocab_size=61, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=256, max_position_embeddings=16)
    ref = built(c=c).to(device)
    fast = built(None, ref, c=c).to(device)
    fp8_ffn(fast)                          # as the workload applies it: built on the device
    if wgrad:
        fp8_wgrad(fast)
    assert type(fast.bert.encoder.layer[0]).__name__ == "Fp8FeedForwardLayer"
    ids, seg, mask, pos = _batch()
    batch = [torch.cat([t] * 16) .to(device) for t in (ids, seg, mask, pos)]   # 768 tokens
    for m in (ref, fast):
        m.eval()
    with torch.no_grad():
        for a, b in zip(ref(*batch), fast(*batch)):
            assert torch.equal(a, b)
    for m in (ref, fast):
        m.train()
        for layer in m.bert.encoder.layer:   # dropout off: the two models' outputs compare
            layer.attention.output.dropout.p = layer.output.dropout.p = 0.0
            layer.attention.self.dropout_p = 0.0
        m.bert.embeddings.dropout.p = 0.0
    (out_r, grads_r), (out_f, grads_f) = (_outputs_and_grads(m, batch, device=device)
                                          for m in (ref, fast))
    for a, b in zip(out_f, out_r):
        assert _rel(a, b) < 0.02           # 1.4e-3 on the CPU
    largest = max(g.norm() for g in grads_r.values())
    for name, g in grads_r.items():
        if g.norm() < 1e-6 * largest:      # the key bias: no gradient through a softmax
            assert grads_f[name].norm() < 1e-6 * largest, name
        else:
            assert _rel(grads_f[name], g) < 0.12, name   # up to 7.4e-2 on the CPU
    scales = fast.bert.encoder.layer[0].fp8[0]
    assert scales.steps == 1 and (scales.amaxes > 0).all()
