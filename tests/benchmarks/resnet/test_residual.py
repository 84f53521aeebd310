"""The residual stream's operators (``cudnn-fusion``) against plain autograd."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.resnet import residual

CL = torch.channels_last


def _tail_inputs(projected: bool, dtype=torch.float64, device="cpu"):
    torch.manual_seed(2)
    n, c, h, k = 2, 8, 5, 4

    def t(*shape, scale=1.0, offset=0.0):
        x = torch.randn(*shape, dtype=dtype, device=device) * scale + offset
        return x.to(memory_format=CL) if len(shape) == 4 and shape[2] > 1 else x

    y, shortcut = t(n, c, h, h), t(n, c, h, h)
    scale, bias = t(1, c, 1, 1, scale=0.3, offset=1.0), t(1, c, 1, 1, scale=0.2)
    sc_scale, sc_bias = ((t(1, c, 1, 1, scale=0.3, offset=1.0), t(1, c, 1, 1, scale=0.2))
                         if projected else (None, None))
    weight = t(k, c, 1, 1).to(memory_format=CL)
    return [y, scale, bias, shortcut, sc_scale, sc_bias, weight]


@pytest.mark.parametrize("projected", [False, True])
def test_operator_registration(projected):
    """Fake (meta) implementations, autograd formula and schemas agree with the real ops."""
    inputs = [None if t is None else t.requires_grad_() for t in _tail_inputs(projected)]
    torch.library.opcheck(residual.tail_conv, tuple(inputs))
    y, _, _, shortcut, *_ = inputs
    g = [torch.randn_like(y) for _ in range(2)]
    out = torch.relu(y + shortcut).detach()
    torch.library.opcheck(residual.residual_grad,
                          (*g, out, y.detach(), shortcut.detach() if projected else None))


@pytest.mark.parametrize("projected", [False, True])
def test_tail_conv_gradients_match_autograd(projected):
    """``out`` used twice (a loss on it and on the next convolution's output and sums):
    every input's gradient equals autograd's through the plain ops."""
    inputs = _tail_inputs(projected)

    def loss(out, y_next, total, total_sq):
        return (out.sin().sum() + y_next.cos().sum() + (total * torch.arange(4.0)).sum()
                + total_sq.tanh().sum())

    ours = [None if t is None else t.clone().requires_grad_() for t in inputs]
    loss(*residual.tail_conv(*ours)).backward()
    plain = [None if t is None else t.clone().requires_grad_() for t in inputs]
    y, scale, bias, shortcut, sc_scale, sc_bias, weight = plain
    if projected:
        shortcut = shortcut * sc_scale + sc_bias
    out = torch.relu(y * scale + bias + shortcut)
    y_next = F.conv2d(out, weight)
    loss(out, y_next, y_next.sum((0, 2, 3)), y_next.square().sum((0, 2, 3))).backward()
    for name, a, b in zip(["y", "scale", "bias", "shortcut", "sc_scale", "sc_bias", "weight"],
                          ours, plain):
        if a is not None:
            torch.testing.assert_close(a.grad, b.grad, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", [(4, 256, 56), (3, 200, 7), (8, 2048, 7)])
@pytest.mark.parametrize("projected", [False, True])
def test_triton_kernel_matches_the_reference_in_fp16(shape, projected):
    n, c, hw = shape
    a, b, out, y, sc = (torch.randn(n, c, hw, hw, device="cuda").half().to(memory_format=CL)
                        for _ in range(5))
    sc = sc if projected else None
    g, partials = residual.residual_grad(a, b, out, y, sc)
    assert partials.shape[0] == residual._chunks(out) > 1
    wide = [None if t is None else t.double().cpu() for t in (a, b, out, y, sc)]
    want_g, want = residual.residual_grad(*wide)
    assert g.is_contiguous(memory_format=CL)
    torch.testing.assert_close(g.double().cpu(), want_g, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(partials.sum(0).double().cpu(), want[0], rtol=1e-4, atol=1e-2)
