"""``triton-layernorm`` (``benchmarks/bert/layernorm_triton.py``) against its reference,
``layer_norm(dropout(x + bias) + residual)`` in fp32 autograd: the output and all five
gradients, without dropout and with the kernel's own mask (read back from the dense output's
gradient), for a hidden size that is a power of two and one that is not and a row count
that is not a multiple of a backward program's; the output's fork (its gradient added to the
output's in the backward kernel) and a layer whose output is both the next GEMM's input and
the next block's residual. On the GPU, or on the CPU under Triton's
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
@pytest.mark.parametrize("fork", ["fork-unused", "fork-used"])
def test_the_kernels_equal_the_reference(rows, h, p, fork):
    from benchmarks.bert.layernorm_triton import DropoutAddLayerNorm

    inputs = _inputs(rows, h)
    dy, dfork = (torch.randn(rows, h, generator=torch.Generator().manual_seed(s)).to(DEVICE)
                 for s in (1, 2))
    out, forked = DropoutAddLayerNorm.apply(*inputs, p, 1e-12)
    assert torch.equal(forked, out)
    if fork == "fork-used":
        got = torch.autograd.grad((out, forked), inputs, (dy, dfork))
        dy = dy + dfork
    else:
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
    first, second = (DropoutAddLayerNorm.apply(x, bias, res, w, b, 0.5, 1e-12)[0]
                     for _ in range(2))
    assert first.dtype == torch.bfloat16 and not torch.equal(first, second)
    seed = torch.tensor([12345], device=DEVICE)   # given (seeds.py's draw): the same mask
    again = [DropoutAddLayerNorm.apply(x, bias, res, w, b, 0.5, 1e-12, s)[0]
             for s in (seed, seed, seed + 1)]
    assert torch.equal(again[0], again[1]) and not torch.equal(again[0], again[2])
    want = F.layer_norm((x + bias).float() + res.float(), (64,), w.float(), b.float(), 1e-12)
    got = DropoutAddLayerNorm.apply(x, bias, res, w, b, 0.0, 1e-12)[0]
    torch.testing.assert_close(got.float(), want, atol=0.02, rtol=0.01)


def test_the_draws_are_uncorrelated_between_neighbours_and_calls():
    """The mask (read back from the dense output's gradient) at p = 1/2: kept half the time,
    uncorrelated between neighbouring elements and rows and between two calls."""
    from benchmarks.bert.layernorm_triton import DropoutAddLayerNorm

    inputs = _inputs(512, 96)   # 49,152 draws: a mean of 0.02 is 4.4 standard deviations
    masks = []
    for _ in range(2):
        out, _ = DropoutAddLayerNorm.apply(*inputs, 0.5, 1e-12)
        dx = torch.autograd.grad(out, inputs[0], torch.ones_like(out))[0]
        masks.append((dx != 0).float() * 2 - 1)
    m = masks[0]
    assert abs(m.mean().item()) < 0.02
    for pairs in (m[:, 1:] * m[:, :-1], m[1:] * m[:-1], masks[0] * masks[1]):
        assert abs(pairs.mean().item()) < 0.03


def test_a_layer_sends_its_residual_gradient_through_the_fork():
    """Two plain layers against the same layers with ``triton-layernorm`` (no dropout): the
    outputs and every gradient; between the layers, the hidden state's gradient comes only
    from the next GEMMs and its fork's only from the next block's residual."""
    from benchmarks.bert.layernorm_triton import TritonDenseLayerNorm
    from benchmarks.bert.model import BertConfig, DenseLayerNorm, Layer, swap_class

    c = BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    plain = torch.nn.Sequential(Layer(c), Layer(c)).to(DEVICE)
    fast = torch.nn.Sequential(Layer(c), Layer(c)).to(DEVICE)
    fast.load_state_dict(plain.state_dict())
    swap_class(fast, DenseLayerNorm, TritonDenseLayerNorm)
    x = torch.randn(2, 24, 64, device=DEVICE)
    mask = torch.ones(2, 24, device=DEVICE)
    results, seen = [], {}
    for net in (plain, fast):
        h = x.clone().requires_grad_()
        hidden = net[0](h, mask)
        for name, t in (("hidden", hidden), ("fork", getattr(hidden, "fork", None))):
            if t is not None:
                t.register_hook(lambda g, name=name: seen.setdefault(name, g))
        y = net[1](hidden, mask)
        results.append((y, *torch.autograd.grad(y, [h, *net.parameters()], torch.ones_like(y))))
    for a, e in zip(results[1], results[0]):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
    # the fork's gradient is the residual's: LayerNorm's input gradient of the next
    # attention block, which the GEMMs' (the hidden state's) does not equal
    assert seen.keys() == {"hidden", "fork"}
    assert not torch.allclose(seen["hidden"], seen["fork"])


def test_a_hidden_size_not_divisible_by_4_is_refused():
    from benchmarks.bert.layernorm_triton import DropoutAddLayerNorm

    with pytest.raises(ValueError, match="divisible by 4"):
        DropoutAddLayerNorm.apply(*_inputs(4, 6), 0.1, 1e-12)
