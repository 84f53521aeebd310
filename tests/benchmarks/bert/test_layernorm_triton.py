"""``triton-layernorm`` (``benchmarks/bert/layernorm_triton.py``) against its reference,
``layer_norm(dropout(x + bias) + residual)`` in fp32 autograd: the output and all five
gradients, without dropout and with the kernel's own mask (read back from the dense output's
gradient), for a hidden size that is a power of two and one that is not and a row count
that is not a multiple of a backward program's. On the GPU, or on the CPU under Triton's
interpreter (``TRITON_INTERPRET=1`` with Triton installed)."""

import os

import pytest
import torch
import torch.nn.functional as F

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRETED),
                                 reason="needs CUDA (or TRITON_INTERPRET=1 and Triton)")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(rows, h, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(rows, h), (h,), (rows, h), (h,), (h,)]   # x, bias, residual, weight, ln bias
    x, bias, res, w, b = (torch.randn(s, generator=g).to(DEVICE) for s in shapes)
    w = w * 0.5 + 1
    return [t.requires_grad_() for t in (x, bias, res, w, b)]


def _grads(out, inputs, dy):
    return torch.autograd.grad(out, inputs, dy)


@pytest.mark.parametrize("rows, h", [(130, 64), (70, 40)])
@pytest.mark.parametrize("p", [0.0, 0.25])
def test_the_kernels_equal_the_reference(rows, h, p):
    from benchmarks.bert.layernorm_triton import DropoutAddLayerNorm

    inputs = _inputs(rows, h)
    dy = torch.randn(rows, h, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out = DropoutAddLayerNorm.apply(*inputs, p, 1e-12)
    got = _grads(out, inputs, dy)
    keep = got[0] != 0   # the dense output's gradient is zero exactly where dropped
    if p == 0:
        assert keep.all()
    else:
        assert abs(keep.float().mean().item() - (1 - p)) < 0.03
    x, bias, res, w, b = inputs
    want_out = F.layer_norm(torch.where(keep, (x + bias) / (1 - p), 0.0) + res, (h,), w, b,
                            1e-12)
    torch.testing.assert_close(out, want_out, atol=2e-5, rtol=1e-5)
    for name, a, e in zip(("x", "bias", "residual", "weight", "ln bias"), got,
                          _grads(want_out, inputs, dy)):
        torch.testing.assert_close(a, e, atol=5e-5, rtol=1e-4, msg=name)


def test_each_call_draws_a_new_mask_and_bf16_rounds_once():
    from benchmarks.bert.layernorm_triton import DropoutAddLayerNorm

    x, bias, res, w, b = (t.detach().to(torch.bfloat16) for t in _inputs(64, 64))
    first, second = (DropoutAddLayerNorm.apply(x, bias, res, w, b, 0.5, 1e-12)
                     for _ in range(2))
    assert first.dtype == torch.bfloat16 and not torch.equal(first, second)
    want = F.layer_norm((x + bias).float() + res.float(), (64,), w.float(), b.float(), 1e-12)
    got = DropoutAddLayerNorm.apply(x, bias, res, w, b, 0.0, 1e-12)
    torch.testing.assert_close(got.float(), want, atol=0.02, rtol=0.01)


def test_a_hidden_size_not_divisible_by_4_is_refused():
    from benchmarks.bert.layernorm_triton import DropoutAddLayerNorm

    with pytest.raises(ValueError, match="divisible by 4"):
        DropoutAddLayerNorm.apply(*_inputs(4, 6), 0.1, 1e-12)
