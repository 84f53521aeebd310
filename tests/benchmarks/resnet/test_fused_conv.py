"""The cuDNN-fusion path (``cudnn-fusion``) against the plain modules it replaces."""

import copy

import pytest
import torch

from benchmarks.resnet import fused_conv, residual
from benchmarks.resnet.model import ResNet50


def _pair():
    torch.manual_seed(0)
    ref = ResNet50(10).double().to(memory_format=torch.channels_last)
    for m in ref.modules():  # non-trivial affine parameters, so every term of the backward counts
        if isinstance(m, torch.nn.BatchNorm2d):
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
            torch.nn.init.uniform_(m.bias, -0.2, 0.2)
    fused = copy.deepcopy(ref)
    residual.fuse(fused)
    return ref, fused


def test_fused_bottlenecks_equal_conv_bn_relu_in_fp64():
    """Outputs, every parameter's gradient, the running statistics and evaluation."""
    ref, fused = _pair()
    x = torch.randn(2, 3, 48, 48, dtype=torch.float64).to(memory_format=torch.channels_last)
    want, got = ref(x), fused(x)
    torch.testing.assert_close(got, want)
    g = torch.randn_like(want)
    want.backward(g)
    got.backward(g)
    for (name, p), q in zip(ref.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    for (name, a), b in zip(ref.named_buffers(), fused.buffers()):
        torch.testing.assert_close(b, a, msg=name)
    ref.eval()
    fused.eval()
    torch.testing.assert_close(fused(x), ref(x))


def test_conv_stats_operator_registration():
    """Fake (meta) implementation, autograd formula and schema agree with the real op."""
    x = torch.randn(2, 8, 6, 6, dtype=torch.float64).to(memory_format=torch.channels_last)
    w = torch.randn(4, 8, 3, 3, dtype=torch.float64, requires_grad=True)
    scale = torch.rand(1, 8, 1, 1, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(1, 8, 1, 1, dtype=torch.float64, requires_grad=True)
    x.requires_grad_()
    torch.library.opcheck(fused_conv.conv_stats, (x, w, scale, bias, 2, 1))
    torch.library.opcheck(fused_conv.conv_stats, (x, w, None, None, 1, 1))


def test_gradient_of_the_sums_matches_autograd():
    """The backward folds the sums' gradients into y's: compare with autograd of the
    plain ops on a loss that uses y, the sum and the sum of squares."""
    torch.manual_seed(1)
    x = torch.randn(2, 6, 5, 5, dtype=torch.float64).to(memory_format=torch.channels_last)
    w = torch.randn(3, 6, 1, 1, dtype=torch.float64)
    scale, bias = torch.rand(1, 6, 1, 1, dtype=torch.float64), torch.randn(1, 6, 1, 1,
                                                                            dtype=torch.float64)
    inputs = [t.clone().requires_grad_() for t in (x, w, scale, bias)]

    def loss(y, total, total_sq):
        return (y.sin().sum() + (total * torch.arange(3.0)).sum() + total_sq.cos().sum())

    loss(*fused_conv.conv_stats(*inputs, 1, 0)).backward()
    plain = [t.clone().requires_grad_() for t in (x, w, scale, bias)]
    y = torch.nn.functional.conv2d(torch.relu(plain[0] * plain[2] + plain[3]), plain[1])
    loss(y, y.sum((0, 2, 3)), y.square().sum((0, 2, 3))).backward()
    for a, b in zip(inputs, plain):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", [(32, 64, 56, 64, 3, 1), (32, 128, 56, 128, 3, 2),
                                   (32, 256, 14, 1024, 1, 1), (32, 256, 56, 512, 1, 2)])
def test_cudnn_graphs_match_the_reference_in_fp16(shape):
    n, c, hw, k, r, stride = shape
    cl = torch.channels_last
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.float16).to(memory_format=cl)
    w = (torch.randn(k, c, r, r, device="cuda", dtype=torch.float16) * 0.05).to(memory_format=cl)
    scale = (torch.rand(1, c, 1, 1, device="cuda") + 0.5).half()
    bias = (torch.randn(1, c, 1, 1, device="cuda") * 0.1).half()
    for s, b in ((scale, bias), (None, None)):
        y, total, total_sq = fused_conv.conv_stats(x, w, s, b, stride, r // 2)
        ref = [t.float() for t in (x, w)] + [None if t is None else t.float() for t in (s, b)]
        want, want_total, want_sq = fused_conv.conv_stats(*ref, stride, r // 2)
        torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(total, want_total, rtol=2e-2, atol=1.0)
        torch.testing.assert_close(total_sq, want_sq, rtol=2e-2, atol=1.0)
        dy = torch.randn_like(y)
        dw = fused_conv.conv_wgrad(x, dy, s, b, list(w.shape), stride, r // 2)
        want_dw = fused_conv.conv_wgrad(ref[0], dy.float(), ref[2], ref[3], list(w.shape),
                                        stride, r // 2)
        assert (dw.float() - want_dw).norm() / want_dw.norm() < 1e-2
