from pathlib import Path

import mlperf_logging
import pytest
import torch
import yaml

from benchmarks.resnet.model import ResNet50, mllog_tensor_names

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


def test_fused_bn_matches_the_eager_model():
    """``--fused-bn``: the same outputs, input and parameter gradients and running statistics
    as the eager BatchNorm2d + add + ReLU modules, in training and in eval (channels-last).
    In fp64: 53 batch norms, the last ones over 8 values per channel, amplify fp32 rounding
    differences by orders of magnitude."""
    torch.manual_seed(0)
    eager = ResNet50(10).double()
    for m in eager.modules():       # non-trivial affine parameters and running statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
            torch.nn.init.uniform_(m.bias, -0.2, 0.2)
    fused = ResNet50(10, fused_bn=True).double()
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last)
    results = []
    for m in (eager, fused):
        m.to(memory_format=torch.channels_last)
        xi = x.clone().requires_grad_(True)
        out = m(xi)
        out.square().sum().backward()
        m.eval()
        with torch.no_grad():
            results.append((out, xi.grad, m(x), m.state_dict(),
                            {n: p.grad for n, p in m.named_parameters()}))
    (out_e, gx_e, ev_e, sd_e, g_e), (out_f, gx_f, ev_f, sd_f, g_f) = results
    for got, want in [(out_f, out_e), (gx_f, gx_e), (ev_f, ev_e)]:
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)
    for name in sd_e:
        torch.testing.assert_close(sd_f[name], sd_e[name], rtol=1e-7, atol=1e-9, msg=name)
    for name in g_e:
        torch.testing.assert_close(g_f[name], g_e[name], rtol=1e-7, atol=1e-9, msg=name)
