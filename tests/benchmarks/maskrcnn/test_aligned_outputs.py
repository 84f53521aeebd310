"""``benchmarks.maskrcnn.aligned_outputs``: layers stacked into one GEMM or 1x1 convolution
of aligned outputs give each layer's own outputs and gradients; each output starts at a
multiple of 8."""

import pytest
import torch
from torch import nn

from benchmarks.maskrcnn import aligned_outputs


def _grads(tensors):
    return [t.grad.clone() for t in tensors]


def _check(x, layers, stacked, plain):
    params = [p for layer in layers for p in layer.parameters()]
    outs = plain(x, layers)
    upstream = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, upstream)
    want_x, want_params = x.grad.clone(), _grads(params)
    x.grad = None
    for p in params:
        p.grad = None
    got = stacked(x, layers)
    assert [o.shape for o in got] == [o.shape for o in outs]
    for g, o in zip(got, outs, strict=True):
        torch.testing.assert_close(g, o, rtol=1e-5, atol=1e-6)
        assert g.storage_offset() % aligned_outputs.MULTIPLE == 0
    torch.autograd.backward(got, upstream)
    torch.testing.assert_close(x.grad, want_x, rtol=1e-5, atol=1e-6)
    for g, w in zip(_grads(params), want_params, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def device(request):
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        # fp32 arithmetic on both paths, whichever kernels they take
        old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        yield request.param
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old
    else:
        yield request.param


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("outs", [(81, 324), (3, 12), (8, 5, 16)])
def test_linear_layers_as_one_gemm(outs, device):
    torch.manual_seed(0)
    layers = [nn.Linear(24, n).to(device) for n in outs]
    x = torch.randn(10, 24, device=device, requires_grad=True)
    _check(x, layers, aligned_outputs.linear, lambda x, ls: [layer(x) for layer in ls])


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("outs", [(3, 12), (81,)])
def test_1x1_convolutions_as_one(outs, memory_format, device):
    torch.manual_seed(0)
    layers = [nn.Conv2d(16, n, 1).to(device, memory_format=memory_format) for n in outs]
    x = torch.randn(2, 16, 5, 7, device=device).to(memory_format=memory_format)
    x.requires_grad_()
    _check(x, layers, aligned_outputs.conv1x1, lambda x, ls: [layer(x) for layer in ls])


def test_stacked_weight_is_padded_with_zero_rows():
    layers = [nn.Linear(4, 3), nn.Linear(4, 12)]
    x = torch.randn(2, 4)
    scores, deltas = aligned_outputs.linear(x, layers)
    # both are views of one [2, 8 + 16] output: the rows between them are the padding's
    whole = scores.as_strided((2, 24), (24, 1), scores.storage_offset())
    torch.testing.assert_close(whole[:, 3:8], torch.zeros(2, 5))
    torch.testing.assert_close(whole[:, 8:20], deltas)


def test_refuses_what_is_not_a_plain_1x1_convolution():
    with pytest.raises(ValueError, match="not a plain 1x1 convolution"):
        aligned_outputs.conv1x1(torch.randn(1, 4, 5, 5), [nn.Conv2d(4, 3, 3, padding=1)])
    with pytest.raises(ValueError, match="all have a bias"):
        aligned_outputs.linear(torch.randn(1, 4), [nn.Linear(4, 3), nn.Linear(4, 3, bias=False)])
