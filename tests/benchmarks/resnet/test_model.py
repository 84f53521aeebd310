from pathlib import Path

import mlperf_logging
import pytest
import torch
import yaml

from benchmarks.resnet.model import ResNet50, mllog_tensor_names
from benchmarks.resnet.space_to_depth import SpaceToDepthConv
from common.stem import space_to_depth_conv

RULESET = Path(mlperf_logging.__file__).parent / "compliance_checker/training_1.1.0"


@pytest.fixture(scope="module")
def model():
    return ResNet50()


def test_parameter_count(model):
    assert sum(p.numel() for p in model.parameters()) == 25_557_032


def test_output_and_stage_shapes(model):
    x = torch.randn(2, 3, 224, 224)
    shapes = []
    h = model.pool0(model.relu(model.bn0(model.conv0(x))))
    shapes.append(tuple(h.shape))
    for i in range(1, 5):
        h = getattr(model, f"stage{i}")(h)
        shapes.append(tuple(h.shape))
    assert shapes == [(2, 64, 56, 56), (2, 256, 56, 56), (2, 512, 28, 28),
                      (2, 1024, 14, 14), (2, 2048, 7, 7)]
    assert model(x).shape == (2, 1000)


def test_v15_stride_on_3x3_and_zero_last_gamma(model):
    for i in range(2, 5):
        unit = getattr(model, f"stage{i}")[0]
        assert unit.conv1.stride == (1, 1)
        assert unit.conv2.stride == (2, 2)
        assert unit.conv1sc.stride == (2, 2)
    for m in model.modules():
        if hasattr(m, "bn3"):
            assert torch.all(m.bn3.weight == 0)
            assert torch.all(m.bn1.weight == 1)


def test_tensor_names_equal_the_ruleset_list(model):
    spec = yaml.safe_load((RULESET / "closed_resnet.yaml").read_text())
    end = next(r["END"]["CHECK"] for r in spec if "END" in r)
    expected = eval(end[end.index("sorted([") + len("sorted("):].rstrip().rstrip(")"))
    names = mllog_tensor_names(model)
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(expected)


@pytest.mark.parametrize("size", [224, 63])
def test_space_to_depth_stem_equals_the_7x7_convolution(size):
    """Same output and weight gradient as the stride-2 7x7 stem, even and odd image sizes."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, size, size, dtype=torch.float64).to(memory_format=torch.channels_last)
    w = torch.randn(64, 3, 7, 7, dtype=torch.float64, requires_grad=True)
    want = torch.nn.functional.conv2d(x, w, stride=2, padding=3)
    got = space_to_depth_conv(x, w, channels=16)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)
    g = torch.randn_like(want)
    grad_got, grad_want = (torch.autograd.grad(y, w, g)[0] for y in (got, want))
    torch.testing.assert_close(grad_got, grad_want)
    stem = ResNet50().conv0
    stem.__class__ = SpaceToDepthConv
    assert stem(x.float()).shape == want.shape
