"""SSD300's layers are the reference's (``ssd300.py``, ``base_model.py``, mlcommons/training
v1.1), its outputs have the reference's layout, and its tensor names are the ruleset's."""

import ast
import inspect
import math
from pathlib import Path

import mlperf_logging
import pytest
import torch
import yaml
from torch import nn

from benchmarks.ssd import heads, stem
from benchmarks.ssd.heads import _ChannelsLastGrad, box_major
from benchmarks.ssd.model import (
    NUM_DEFAULTS,
    SSD300,
    BasicBlock,
    ResNet34Backbone,
    mllog_parameter_names,
    mllog_tensor_names,
)

RULES = Path(mlperf_logging.__file__).parent / "compliance_checker/training_1.1.0/closed_ssd.yaml"


@pytest.fixture(scope="module")
def model():
    return SSD300()


def ruleset_tensor_names() -> list[str]:
    """The names in the ruleset's ``weights_initialization`` END check."""
    for record in yaml.safe_load(RULES.read_text()):
        if "END" in record:
            check = record["END"]["CHECK"]
            return ast.literal_eval(check[check.index("sorted([") + 7: check.rindex(")")])
    raise AssertionError(f"no END check in {RULES}")


def test_full_model_shapes(model):
    """One 300x300 image: 38x38x256 from the backbone, then 19, 10, 5, 3, 1 maps."""
    shapes = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: shapes.append(tuple(out.shape)))
             for m in [model.backbone, *model.additional_blocks]]
    with torch.no_grad():
        locs, confs = model(torch.randn(1, 3, 300, 300))
    for h in hooks:
        h.remove()
    assert shapes == [(1, 256, 38, 38), (1, 512, 19, 19), (1, 512, 10, 10),
                      (1, 256, 5, 5), (1, 256, 3, 3), (1, 256, 1, 1)]
    assert locs.shape == (1, 4, 8732) and confs.shape == (1, 81, 8732)


def test_parameter_count_from_the_reference_layers(model):
    def conv(cin, cout, k, bias=True):
        return cin * cout * k * k + (cout if bias else 0)

    def block(cin, cout, projection):   # torchvision BasicBlock, BN = 2 per channel
        n = conv(cin, cout, 3, False) + conv(cout, cout, 3, False) + 4 * cout
        return n + (conv(cin, cout, 1, False) + 2 * cout if projection else 0)

    backbone = conv(3, 64, 7, False) + 2 * 64 + 3 * block(64, 64, False)
    backbone += block(64, 128, True) + 3 * block(128, 128, False)
    backbone += block(128, 256, True) + 5 * block(256, 256, False)
    chans = [256, 512, 512, 256, 256, 256]
    extra = sum(conv(cin, mid, 1) + conv(mid, cout, 3)
                for cin, mid, cout in zip(chans, [256, 256, 128, 128, 128], chans[1:]))
    heads = sum(conv(c, nd * 4, 3) + conv(c, nd * 81, 3) for c, nd in zip(chans, NUM_DEFAULTS))
    assert (backbone, extra, heads) == (8_170_304, 3_574_400, 8_227_830)
    assert sum(p.numel() for p in model.parameters()) == backbone + extra + heads == 19_972_534


def test_reference_layers(model):
    layer3 = model.backbone.layer3[0]
    assert layer3.conv1.stride == (1, 1) and layer3.downsample[0].stride == (1, 1)
    assert model.backbone.layer2[0].conv1.stride == (2, 2)
    assert not hasattr(model.backbone, "layer4")
    for i, block in enumerate(model.additional_blocks):
        trans, conv = block[0], block[2]
        assert trans.kernel_size == (1, 1) and conv.kernel_size == (3, 3)
        assert conv.stride == ((2, 2) if i < 3 else (1, 1))
        assert conv.padding == ((1, 1) if i < 3 else (0, 0))
        assert trans.bias is not None and conv.bias is not None
        assert not any(isinstance(m, nn.BatchNorm2d) for m in block.modules())
    for layer in [*model.additional_blocks, *model.loc, *model.conf]:
        for m in layer.modules():
            if isinstance(m, nn.Conv2d):       # Xavier-uniform weights, default biases
                fan_in = m.weight[0].numel()
                fan_out = m.weight.shape[0] * m.weight[0, 0].numel()
                assert m.weight.abs().max() <= math.sqrt(6 / (fan_in + fan_out))
                assert m.bias.abs().max() <= 1 / math.sqrt(fan_in)


def test_loads_a_torchvision_resnet34_state_dict():
    backbone = SSD300(width=8).backbone
    state = {k: torch.randn_like(v.float()).to(v.dtype) for k, v in backbone.state_dict().items()}
    assert {"conv1.weight", "bn1.running_var", "layer2.3.bn2.bias",
            "layer3.0.downsample.0.weight", "layer3.5.conv2.weight"} <= state.keys()
    torchvision_only = {"layer4.0.conv1.weight": torch.zeros(1), "fc.weight": torch.zeros(1)}
    backbone.load_torchvision({**state, **torchvision_only})
    for k, v in backbone.state_dict().items():
        assert torch.equal(v, state[k])


def test_small_width_keeps_the_layout_and_trains():
    small = SSD300(num_classes=5, width=8)
    assert ([n for n, _ in small.named_parameters()]
            == [n for n, _ in SSD300(width=16).named_parameters()])
    locs, confs = small(torch.randn(2, 3, 300, 300))
    assert locs.shape == (2, 4, 8732) and confs.shape == (2, 5, 8732)
    (locs.square().mean() + confs.square().mean()).backward()
    assert all(p.grad is not None for p in small.parameters())


def test_output_order_follows_the_default_boxes():
    """Box index = map offset + (default box * H + y) * W + x, channel = coordinate * nd + box:
    the reference's ``view(N, 4, -1)`` of each head's output."""
    small = SSD300(num_classes=5, width=8).eval()
    feats = []
    small.loc[1].register_forward_hook(lambda _m, _i, out: feats.append(out))
    with torch.no_grad():
        locs, _ = small(torch.randn(1, 3, 300, 300))
    head = feats[0]                       # [1, 6 * 4, 19, 19]
    d, y, x, coord = 4, 7, 11, 2
    assert locs[0, coord, 5776 + (d * 19 + y) * 19 + x] == head[0, coord * 6 + d, y, x]


def test_tensor_names_are_the_rulesets(model):
    names = mllog_tensor_names(model)
    expected = ruleset_tensor_names()
    assert len(expected) == 119      # not 128: 29 convs + 29 BNs (x2), 20 extra, 12 predictor
    assert len(names) == len(set(names)) and sorted(names) == sorted(expected)


def test_every_trainable_parameter_has_one_name(model):
    mapping = mllog_parameter_names(model)
    assert list(mapping) == [n for n, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())
    by_name: dict[str, list[str]] = {}
    for param, name in mapping.items():
        by_name.setdefault(name, []).append(param)
    # only the two segments of a fused predictor (location and confidence) share a name
    shared = {n: ps for n, ps in by_name.items() if len(ps) > 1}
    assert shared == {f"ssd0_convpredictor{i}_conv0_{p}": [f"loc.{i}.{p}", f"conf.{i}.{p}"]
                      for i in range(6) for p in ("weight", "bias")}
    # Gluon's creation order: a first block's projection is its third conv
    shape = {name: params[ps[0]].shape for name, ps in by_name.items()}
    assert shape["ssd0_resnetmlperf0_stage2_conv2_weight"] == (128, 64, 1, 1)
    assert shape["ssd0_resnetmlperf0_stage3_conv2_weight"] == (256, 128, 1, 1)
    assert shape["ssd0_resnetmlperf0_stage3_conv12_weight"] == (256, 256, 3, 3)
    assert shape["ssd0_resnetmlperf0_stage2_batchnorm8_gamma"] == (128,)
    assert shape["ssd0_expand_trans_conv4_weight"] == (128, 256, 1, 1)
    assert shape["ssd0_expand_conv4_weight"] == (256, 128, 3, 3)


@pytest.mark.parametrize("cls", [SSD300, ResNet34Backbone, BasicBlock])
def test_the_model_takes_no_optimisation_switch(cls):
    """The reference network alone: optimisations transform the built model (stem.py,
    heads.py)."""
    allowed = {"self", "num_classes", "width", "cin", "cout", "stride", "downsample", "x"}
    for fn in (cls.__init__, cls.forward):
        assert set(inspect.signature(fn).parameters) <= allowed, fn


def _transformed(plain: SSD300, transform) -> SSD300:
    """A copy of ``plain`` (the same weights) with ``transform`` applied, state_dict keys
    unchanged."""
    model = SSD300(plain.num_classes, width=8).double()
    model.load_state_dict(plain.state_dict())
    keys = list(model.state_dict())
    transform(model)
    assert list(model.state_dict()) == keys
    return model


def test_space_to_depth_stem_gives_the_same_outputs():
    torch.manual_seed(0)
    plain = SSD300(5, width=8).double().eval()     # fp64: no rounding to tell apart
    s2d = _transformed(plain, lambda m: stem.space_to_depth(m.backbone)).eval()
    assert type(s2d.backbone.conv1) is stem.SpaceToDepthConv
    x = torch.randn(2, 3, 300, 300, dtype=torch.float64)
    with torch.no_grad():
        for a, b in zip(plain(x), s2d(x)):
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)


def test_fused_pool_gives_the_same_outputs_and_gradients():
    torch.manual_seed(0)
    plain = SSD300(5, width=8).double()         # fp64: no rounding to tell apart
    fused = _transformed(plain, lambda m: stem.fused_pool(m.backbone))
    assert type(fused.backbone.maxpool) is stem.ReluMaxPool
    x = torch.randn(2, 3, 300, 300, dtype=torch.float64)
    outs = [model(x) for model in (plain, fused)]
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)
    for locs, confs in outs:
        (locs.square().sum() + confs.sin().sum()).backward()
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-9, atol=1e-9, msg=name)


@pytest.mark.parametrize("channels_last", [False, True])
def test_class_last_heads_give_the_same_scores_and_gradients(channels_last):
    torch.manual_seed(0)
    plain = SSD300(5, width=8).double()         # fp64: no rounding to tell apart
    last = _transformed(plain, heads.apply)
    assert type(last) is heads.ClassLastSSD300
    x = torch.randn(2, 3, 300, 300, dtype=torch.float64)
    if channels_last:
        plain, last = (m.to(memory_format=torch.channels_last) for m in (plain, last))
        x = x.contiguous(memory_format=torch.channels_last)
    outs = [model(x) for model in (plain, last)]
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)
    assert outs[1][1].stride(1) == 1                # classes innermost
    assert {box_major(conv, 5)[0].shape[0] % 8 for conv in last.conf} == {0}   # 20, 30 padded
    for locs, confs in outs:
        (locs.square().sum() + confs.sin().sum()).backward()
    for (name, p), q in zip(plain.named_parameters(), last.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-9, atol=1e-9, msg=name)


def test_channels_last_grad_is_an_identity_with_a_channels_last_gradient():
    y = torch.randn(2, 8, 3, 3, requires_grad=True)
    out = _ChannelsLastGrad.apply(y)
    g = torch.randn(2, 8, 3, 3)
    (grad,) = torch.autograd.grad(out, y, g)
    assert torch.equal(out, y) and torch.equal(grad, g)
    assert grad.is_contiguous(memory_format=torch.channels_last) and not g.is_contiguous(
        memory_format=torch.channels_last)
