"""The split-stream Linear and an MLP split by it (split-linear) == nn.Linear / the plain MLP."""

import contextlib
import copy

import pytest
import torch

from benchmarks.dlrm import split_linear
from benchmarks.dlrm.model import MLP

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in module.named_parameters()}


@pytest.mark.parametrize("shape", [(6, 5), (2, 3, 5)])
def test_split_linear_equals_nn_linear_with_accumulation(shape):
    torch.manual_seed(0)
    ref = torch.nn.Linear(5, 4)
    lin = copy.deepcopy(ref)
    split_linear.split(lin)
    x = torch.randn(shape, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    for seed in (1, 2):                       # the second backward accumulates into .grad
        dy = torch.randn(*shape[:-1], 4, generator=torch.Generator().manual_seed(seed))
        y = lin(x)
        y_ref = ref(x_ref)
        torch.testing.assert_close(y, y_ref)
        y.backward(dy)
        y_ref.backward(dy)
        split_linear.wait_for_weight_grads()
        torch.testing.assert_close(x.grad, x_ref.grad)
        torch.testing.assert_close(_grads(lin), _grads(ref))


def _mlp_pair(device):
    torch.manual_seed(0)
    plain = MLP([7, 16, 8, 1], last_relu=False).to(device)
    split = copy.deepcopy(plain)
    split_linear.split(split)
    assert all(type(m) is not torch.nn.Linear for m in split.modules())
    return plain, split


def _train_twice(mlp, x, autocast_dtype):
    """Output of the second of two forward/backward passes (grads accumulate)."""
    ctx = (torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype
           else contextlib.nullcontext())
    x = x.clone().requires_grad_()
    for _ in range(2):
        with ctx:
            y = mlp(x)
        y.float().square().sum().backward()
    split_linear.wait_for_weight_grads()
    return y, x.grad


def _assert_same_training(device, autocast_dtype):
    plain, split = _mlp_pair(device)
    x = torch.randn(32, 7, device=device)
    y_ref, dx_ref = _train_twice(plain, x, autocast_dtype)
    y, dx = _train_twice(split, x, autocast_dtype)
    assert y.dtype == y_ref.dtype and dx.dtype == dx_ref.dtype == torch.float32
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(dx, dx_ref)
    for name, g in _grads(split).items():
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, _grads(plain)[name], msg=name)


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
def test_split_mlp_equals_plain_mlp_on_cpu(autocast_dtype):
    _assert_same_training("cpu", autocast_dtype)


@pytest.mark.gpu
@needs_cuda
def test_split_mlp_equals_plain_mlp_on_gpu():
    _assert_same_training("cuda", torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
def test_side_stream_inside_cuda_graph_capture():
    plain, split = _mlp_pair("cuda")
    x = torch.randn(32, 7, device="cuda")
    plain(x).square().sum().backward()
    warm = torch.cuda.Stream()                # capture needs a warmed-up, side-stream start
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        split(x).square().sum().backward()
        split_linear.wait_for_weight_grads()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        split(x).square().sum().backward()
        split_linear.wait_for_weight_grads()
    for p in split.parameters():
        p.grad.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for name, g in _grads(split).items():
        torch.testing.assert_close(g, _grads(plain)[name], msg=name)
