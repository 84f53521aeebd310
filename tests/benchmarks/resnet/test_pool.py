"""The stem's max-pool with the gather-free backward (``--cudnn-fusion``) against ATen's."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.resnet.pool import max_pool_3x3_s2


def _both(x: torch.Tensor, grad_fn):
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = max_pool_3x3_s2(a), F.max_pool2d(b, 3, 2, 1)
    g = grad_fn(want)
    got.backward(g)
    want.backward(g)
    return got, want, a.grad, b.grad


@pytest.mark.parametrize("shape", [(2, 3, 20, 20), (2, 4, 7, 9), (1, 2, 8, 5), (1, 1, 1, 1)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_equals_aten_max_pool(shape, channels_last):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    got, want, grad, want_grad = _both(x, torch.randn_like)
    assert torch.equal(got, want)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    if min(shape[1:]) > 1:  # otherwise both layouts describe the same strides
        assert grad.is_contiguous(memory_format=torch.channels_last) == channels_last


def test_ties_route_the_gradient_to_the_first_maximum():
    """Small integers make most windows tie: each must send its gradient where ATen does."""
    torch.manual_seed(0)
    x = torch.randint(-2, 3, (2, 3, 13, 12)).double()
    got, want, grad, want_grad = _both(x, lambda y: torch.randint(1, 9, y.shape).double())
    assert torch.equal(got, want)
    assert torch.equal(grad, want_grad)


def test_nan_wins_its_window():
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 2, 3] = x[0, 1, 1, 1] = x[0, 1, 1, 2] = float("nan")
    got, want, grad, want_grad = _both(x, torch.randn_like)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    torch.testing.assert_close(grad, want_grad)


def test_compiled_matches_eager():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, 16, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    fn = torch.compile(lambda t: max_pool_3x3_s2(t * 2).relu().sum())
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    fn(a).backward()
    F.max_pool2d(b * 2, 3, 2, 1).relu().sum().backward()
    torch.testing.assert_close(a.grad, b.grad)
