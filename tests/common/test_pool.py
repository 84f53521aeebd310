"""The stem's ReLU + max-pool op with the gather-free backward (``--cudnn-fusion``) against
ATen's, alone and inside the compiled ResNet-50."""

import pytest
import torch
import torch.nn.functional as F

from benchmarks.resnet import residual
from benchmarks.resnet.model import ResNet50
from common.pool import relu_max_pool_3x3_s2


def _both(x: torch.Tensor, grad_fn):
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = relu_max_pool_3x3_s2(a), F.max_pool2d(F.relu(b), 3, 2, 1)
    g = grad_fn(want)
    got.backward(g)
    want.backward(g)
    return got, want, a.grad, b.grad


@pytest.mark.parametrize("shape", [(2, 3, 20, 20), (2, 4, 7, 9), (1, 2, 8, 5), (1, 1, 1, 1)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_equals_aten_relu_and_max_pool(shape, channels_last):
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
    """Small integers make most windows tie (zeros too, after the ReLU): each must send its
    gradient where ATen does."""
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
    fn = torch.compile(lambda t: relu_max_pool_3x3_s2(t * 2).square().sum())
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    fn(a).backward()
    F.max_pool2d(F.relu(b * 2), 3, 2, 1).square().sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def _stem_gradients(device: str, dtype: torch.dtype):
    """conv0's weight gradient in the plain model and in the compiled ``cudnn_fusion`` one,
    from the same weights."""
    torch.manual_seed(0)
    plain, fused = ResNet50(10), ResNet50(10)
    residual.fuse(fused)
    for m in plain.modules():  # no zero-init gammas: every branch passes a gradient
        if isinstance(m, torch.nn.BatchNorm2d):
            torch.nn.init.ones_(m.weight)
    fused.load_state_dict(plain.state_dict())
    x = torch.randn(4, 3, 64, 64, device=device, dtype=dtype)
    for model in (plain, torch.compile(fused)):
        model.to(device, dtype, memory_format=torch.channels_last)
        model(x.contiguous(memory_format=torch.channels_last)).square().sum().backward()
    return plain.conv0.weight.grad, fused.conv0.weight.grad


def test_compiled_fused_model_trains_its_stem():
    """The stem's weights get the same gradient through the compiled fused model as through
    the plain one."""
    want, got = _stem_gradients("cpu", torch.float64)
    assert want.abs().sum() > 0
    torch.testing.assert_close(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_fused_model_trains_its_stem_on_the_gpu(monkeypatch):
    """The same on CUDA, where the pool runs compiled kernels. In fp32 (TF32 off): this
    model's stem gradient is too sensitive to fp16 rounding to compare (fp16 against fp64
    on the CPU: cosine 0.64 for the plain model)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    want, got = _stem_gradients("cuda", torch.float32)
    cos = F.cosine_similarity(got.flatten().double(), want.flatten().double(), dim=0)
    assert cos > 0.99, f"stem gradient cosine {cos:.4f}"
