"""``benchmarks.maskrcnn.conv_relu``: the operator's forward and its autograd formula against
the plain convolution, add and ReLU; on the GPU, cuDNN's fused kernels against an fp32 reference."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.maskrcnn.conv_relu import conv_bias_relu

# (input channels, output channels, kernel, stride, padding): the shapes of ResNet-50 FPN's
# convolutions followed by ReLU (1x1, strided 1x1, 3x3, strided 3x3, the stem's 4x4 over 2x2
# pixel blocks)
SHAPES = [(8, 6, 1, 1, 0), (8, 6, 1, 2, 0), (6, 8, 3, 1, 1), (6, 8, 3, 2, 1), (16, 8, 4, 1, 0)]


def plain(x, weight, bias, residual, stride, padding):
    y = F.conv2d(x, weight, bias, stride, padding)
    return F.relu(y if residual is None else y + residual)


def inputs(shape, residual: bool, channels_last: bool, device="cpu", dtype=torch.float32,
           seed=0):
    cin, cout, k, stride, padding = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, cin, 13, 11, generator=g)
    weight = torch.randn(cout, cin, k, k, generator=g) / (cin * k * k) ** 0.5
    bias = torch.randn(cout, generator=g)
    size = F.conv2d(x, weight, None, stride, padding).shape
    z = torch.randn(size, generator=g) if residual else None
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    tensors = [t if t is None else t.to(device, dtype).requires_grad_()
               for t in (x.to(memory_format=fmt), weight.to(memory_format=fmt), bias, z)]
    return (*tensors, stride, padding)


def grads(out, args, seed=1):
    g = torch.Generator().manual_seed(seed)
    grad = torch.randn(out.shape, generator=g).to(out)
    leaves = [t for t in args[:4] if t is not None]
    return [out.detach(), *torch.autograd.grad(out, leaves, grad)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
def test_operator_is_the_convolution_add_and_relu(shape, residual, channels_last):
    args = inputs(shape, residual, channels_last)
    out = conv_bias_relu(*args)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=fmt)
    for got, expected in zip(grads(out, args), grads(plain(*args), args)):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    torch.library.opcheck(torch.ops.maskrcnn.conv_bias_relu.default, args)


def test_compiled_operator_is_the_plain_form():
    args = inputs(SHAPES[2], True, True)
    compiled = torch.compile(conv_bias_relu, fullgraph=True)
    for got, expected in zip(grads(compiled(*args), args), grads(plain(*args), args)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_autocast_casts_the_inputs():
    args = inputs(SHAPES[0], True, False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = conv_bias_relu(*args)
        assert out.dtype == torch.bfloat16
    # autograd casts the gradients back to the fp32 leaves
    assert all(g.dtype == torch.float32 for g in grads(out, args)[1:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cudnn_kernels_are_the_plain_form(shape, residual, dtype):
    """cuDNN's fused kernels, channels-last as the backbone runs them: the output within the
    dtype's rounding of an fp32 reference (bf16: 2^-8 of the largest output a rounding),
    the gradients within the plain path's own distance from it (bf16) or 1e-4 (fp32)."""
    reference = inputs(shape, residual, True, "cuda", torch.float32)
    fused = inputs(shape, residual, True, "cuda", dtype)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        expected = grads(plain(*reference), reference)
        got = grads(conv_bias_relu(*fused), fused)
        ours = grads(plain(*fused), fused)
    if dtype == torch.float32:
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
        return
    # one bf16 rounding of the output, two with a residual (the convolution's, the sum's)
    bound = (2 if residual else 1) * 2 ** -8 * expected[0].abs().max().item()
    assert (got[0].float() - expected[0]).abs().max().item() <= bound
    for g, o, e in zip(got[1:], ours[1:], expected[1:]):
        assert ((g.float() - e).abs().max() <= 2 * (o.float() - e).abs().max()
                + 1e-3 * e.abs().max())
