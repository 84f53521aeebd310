"""Mask R-CNN R50-FPN modules against the MLPerf 1.1 reference (mlcommons/training
``object_detection/pytorch/maskrcnn_benchmark/modeling``) and the 1.1.0 ruleset's
``closed_maskrcnn.yaml``; torchvision's ``resnet50`` layout is written out by hand."""

import ast
import math
from pathlib import Path

import mlperf_logging
import pytest
import torch
import yaml
from torch import nn

from benchmarks.maskrcnn.aligned_outputs import align
from benchmarks.maskrcnn.anchors import fpn_anchors
from benchmarks.maskrcnn.frozen_bn import fold
from benchmarks.maskrcnn.model import (
    FrozenBatchNorm2d,
    MaskRCNN,
    ResNet50,
    load_torchvision_backbone,
    mllog_tensor_modules,
    mllog_tensor_names,
    upsample_nearest_2x,
)
from benchmarks.maskrcnn.roi_align import rois_from_boxes
from common.errors import UserError

RULES = (Path(mlperf_logging.__file__).parent / "compliance_checker" / "training_1.1.0"
         / "closed_maskrcnn.yaml")
BOXES = [torch.tensor([[0.0, 0.0, 31.0, 31.0], [8.0, 4.0, 63.0, 47.0]]),
         torch.tensor([[20.0, 10.0, 40.0, 60.0]])]


@pytest.fixture
def model() -> MaskRCNN:
    torch.manual_seed(0)
    return MaskRCNN()


def torchvision_resnet50_state_dict() -> dict[str, torch.Tensor]:
    """Random tensors under the names and shapes of torchvision's ``resnet50().state_dict()``:
    stem ``conv1``/``bn1``; ``layer1``..``layer4`` of 3, 4, 6, 3 bottlenecks of width 64 to
    512 (``conv1`` 1x1, ``conv2`` 3x3, ``conv3`` 1x1 to 4x width, each with ``bnK``; block 0
    adds ``downsample.0`` conv and ``downsample.1`` BN); ``fc`` 2048 -> 1000."""
    g = torch.Generator().manual_seed(1)
    state = {}

    def conv(name, cout, cin, k):
        state[f"{name}.weight"] = torch.randn(cout, cin, k, k, generator=g)

    def bn(name, c):
        state[f"{name}.weight"] = torch.rand(c, generator=g)
        state[f"{name}.bias"] = torch.randn(c, generator=g)
        state[f"{name}.running_mean"] = torch.randn(c, generator=g)
        state[f"{name}.running_var"] = torch.rand(c, generator=g) + 0.5
        state[f"{name}.num_batches_tracked"] = torch.tensor(1000)

    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    cin = 64
    for layer, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), 1):
        for b in range(blocks):
            prefix = f"layer{layer}.{b}"
            conv(f"{prefix}.conv1", width, cin, 1)
            bn(f"{prefix}.bn1", width)
            conv(f"{prefix}.conv2", width, width, 3)
            bn(f"{prefix}.bn2", width)
            conv(f"{prefix}.conv3", 4 * width, width, 1)
            bn(f"{prefix}.bn3", 4 * width)
            if b == 0:
                conv(f"{prefix}.downsample.0", 4 * width, cin, 1)
                bn(f"{prefix}.downsample.1", 4 * width)
            cin = 4 * width
    state["fc.weight"] = torch.randn(1000, 2048, generator=g)
    state["fc.bias"] = torch.randn(1000, generator=g)
    return state


def test_frozen_batch_norm_is_eval_batch_norm():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 5)
    bn = nn.BatchNorm2d(8).eval()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2)
        bn.bias.normal_()
        bn.running_mean.normal_()
        bn.running_var.uniform_(1e-4, 1e-3)     # small enough for eps to matter
    state = {k: v for k, v in bn.state_dict().items() if k != "num_batches_tracked"}
    outputs = {}
    for eps in (1e-5, 0.0):
        frozen = FrozenBatchNorm2d(8, eps=eps)
        frozen.load_state_dict(state)
        assert list(frozen.parameters()) == []
        bn.eps = eps
        outputs[eps] = frozen(x)
        torch.testing.assert_close(outputs[eps], bn(x), rtol=1e-5, atol=1e-5)
    # eps = 0 is the reference's weight * rsqrt(running_var); 1e-5 scales by up to
    # 1 / sqrt(1 + 1e-5 / 1e-4), about 5 % less
    assert not torch.allclose(outputs[0.0], outputs[1e-5], rtol=1e-2)


def test_fpn_levels_and_rpn_outputs(model):
    images = torch.randn(2, 3, 96, 128)
    with torch.no_grad():
        c = model.backbone(images)
        p = model.fpn(c)
        logits, deltas = model.rpn(p)
    assert [tuple(x.shape[1:]) for x in c] == [(256, 24, 32), (512, 12, 16), (1024, 6, 8),
                                               (2048, 3, 4)]
    sizes = [(24, 32), (12, 16), (6, 8), (3, 4), (2, 2)]     # strides 4, 8, 16, 32, 64
    assert [tuple(x.shape) for x in p] == [(2, 256, h, w) for h, w in sizes]
    assert torch.equal(p[4], p[3][..., ::2, ::2])
    assert [tuple(x.shape) for x in logits] == [(2, 3, h, w) for h, w in sizes]
    assert [tuple(x.shape) for x in deltas] == [(2, 12, h, w) for h, w in sizes]
    assert [x[0].numel() for x in logits] == [len(a) for a in fpn_anchors(sizes)]


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_upsampling_is_interpolate_forward_and_backward(memory_format):
    x = torch.randn(2, 5, 3, 4).to(memory_format=memory_format).requires_grad_()
    grad = torch.randn(2, 5, 6, 8)
    up = upsample_nearest_2x(x)
    assert up.is_contiguous(memory_format=memory_format)
    (up * grad).sum().backward()
    mine, x.grad = x.grad, None
    reference = torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest")
    (reference * grad).sum().backward()
    assert torch.equal(up, reference)
    torch.testing.assert_close(mine, x.grad)       # each 2 x 2 block's sum


def test_stride_placement():
    default, msra = ResNet50(), ResNet50(stride_in_1x1=True)
    for layer in ("layer2", "layer3", "layer4"):
        assert getattr(default, layer)[0].conv1.stride == (1, 1)
        assert getattr(default, layer)[0].conv2.stride == (2, 2)     # torchvision's
        assert getattr(msra, layer)[0].conv1.stride == (2, 2)        # the reference's default
        assert getattr(msra, layer)[0].conv2.stride == (1, 1)
    assert default.layer1[0].conv1.stride == default.layer1[0].conv2.stride == (1, 1)


def test_box_and_mask_heads(model):
    rois = rois_from_boxes(BOXES)
    with torch.no_grad():
        levels = model.features(torch.randn(2, 3, 64, 64))
        box = model.box_features(levels, rois)
        scores, deltas = model.box_predictor(box)
        mask = model.mask_features(levels, rois)
        logits = model.mask_predictor(mask)
    assert box.shape == (3, 1024) and (box >= 0).all()
    assert scores.shape == (3, 81) and deltas.shape == (3, 81 * 4)
    assert mask.shape == (3, 256, 14, 14)
    assert logits.shape == (3, 81, 28, 28)


def test_only_stem_layer1_and_batch_norm_are_frozen(model):
    levels = model.features(torch.randn(1, 3, 64, 64))
    logits, deltas = model.rpn(levels)
    rois = rois_from_boxes(BOXES[:1])
    scores, box_deltas = model.box_predictor(model.box_features(levels, rois))
    masks = model.mask_predictor(model.mask_features(levels, rois))
    loss = sum(x.sum() for x in (*logits, *deltas, scores, box_deltas, masks))
    loss.backward()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"backbone.conv1.weight"} | {
        f"backbone.layer1.{n}" for n, _ in model.backbone.layer1.named_parameters()}
    assert len(frozen) == 1 + 3 * 3 + 1                      # convs: stem, 3 per block, proj
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name
    for m in model.modules():
        if isinstance(m, FrozenBatchNorm2d):
            assert list(m.parameters()) == [] and len(list(m.buffers())) == 4
    assert sum(isinstance(m, FrozenBatchNorm2d) for m in model.modules()) == 53


def test_parameter_counts(model):
    counts = {name: sum(p.numel() for p in child.parameters() if p.requires_grad)
              for name, child in model.named_children()}
    assert counts == {
        # torchvision resnet50: 25,557,032 - fc (2048 * 1000 + 1000) - BN affine 53,120 =
        # 23,454,912 conv weights; frozen: stem 64*3*49 = 9,408 and layer1 212,992
        # (block 0: 4,096 + 36,864 + 16,384 + projection 16,384; blocks 1-2: 69,632 each)
        "backbone": 23_454_912 - 9_408 - 212_992,
        # inner 1x1: 256 * (256 + 512 + 1024 + 2048) + 4 * 256; layer 3x3: 4 * (256*256*9 + 256)
        "fpn": 256 * 3840 + 4 * 256 + 4 * 590_080,
        # conv 256*256*9 + 256, cls 256*3 + 3, bbox 256*12 + 12
        "rpn": 590_080 + 771 + 3_084,
        # fc6 256*7*7 * 1024 + 1024, fc7 1024 * 1024 + 1024
        "box_features": 12_544 * 1024 + 1024 + 1_049_600,
        # cls 1024 * 81 + 81, bbox 1024 * 324 + 324
        "box_predictor": 83_025 + 332_100,
        # four 3x3 convs 256 -> 256
        "mask_features": 4 * 590_080,
        # transposed 256*256*2*2 + 256, logits 256 * 81 + 81
        "mask_predictor": 262_400 + 20_817,
    }
    assert sum(p.numel() for p in model.backbone.parameters()) == 23_454_912


@pytest.mark.parametrize("fold_frozen_bn", [False, True])
def test_loads_torchvision_resnet50(fold_frozen_bn):
    model = MaskRCNN()
    if fold_frozen_bn:
        fold(model.backbone)
    state = torchvision_resnet50_state_dict()
    assert len(state) == 53 + 53 * 5 + 2                     # convs, BNs, fc
    load_torchvision_backbone(model, state)
    own = model.backbone.state_dict()
    for key, value in state.items():
        if key in own:
            assert torch.equal(own[key], value), key
    assert len(own) == 53 + 53 * 4
    assert not model.backbone.layer1[0].conv2.weight.requires_grad
    assert model.backbone.layer2[0].conv2.weight.requires_grad


@pytest.mark.parametrize("change", ["missing", "unexpected", "shape"])
def test_rejects_other_formats(model, change):
    state = torchvision_resnet50_state_dict()
    if change == "missing":
        del state["layer3.5.bn2.running_var"]
    elif change == "unexpected":
        state["stem.conv1.weight"] = state.pop("conv1.weight")   # the reference's naming
    else:
        state["layer4.0.downsample.0.weight"] = torch.zeros(2048, 512, 1, 1)
    before = model.backbone.layer4[0].downsample[0].weight.clone()
    with pytest.raises(UserError, match="torchvision resnet50 state dict"):
        load_torchvision_backbone(model, state)
    assert torch.equal(model.backbone.layer4[0].downsample[0].weight, before)


def test_mllog_names_are_the_rulesets(model):
    check = next(rule["END"]["CHECK"] for rule in yaml.safe_load(RULES.read_text())
                 if "END" in rule)
    start = check.index("== sorted(") + len("== sorted(")
    expected = ast.literal_eval(check[start:check.rindex(")")])
    assert len(expected) == 21
    assert mllog_tensor_names(model) == expected
    modules = mllog_tensor_modules(model)
    assert all(any(m is own for own in model.modules()) for m in modules.values())
    named = [p for m in modules.values() for p in (m.weight, m.bias)]
    heads = [p for n, p in model.named_parameters() if not n.startswith("backbone.")]
    assert len(named) == len(heads) == 42
    assert {id(p) for p in named} == {id(p) for p in heads}


def _uniform(fan_in):
    return ("uniform", math.sqrt(3 / fan_in))        # Kaiming-uniform a=1: bound sqrt(3/fan_in)


INIT = {
    **{f"FPN_inner_block{i}": _uniform(c) for i, c in enumerate((256, 512, 1024, 2048), 1)},
    **{f"FPN_layer_block{i}": _uniform(256 * 9) for i in range(1, 5)},
    "RPNHead_conv": ("normal", 0.01), "RPNHead_cls": ("normal", 0.01),
    "RPNHead_bbox": ("normal", 0.01),
    "ROI_BOX_FEATURE_EXTRACTOR_fc6": _uniform(256 * 49),
    "ROI_BOX_FEATURE_EXTRACTOR_fc7": _uniform(1024),
    "ROI_BOX_PREDICTOR_cls": ("normal", 0.01), "ROI_BOX_PREDICTOR_bbox": ("normal", 0.001),
    # Kaiming-normal fan-out: std sqrt(2 / (out channels * kernel area))
    **{f"ROI_MASK_FEATURE_EXTRACTOR_fcn{i}": ("normal", math.sqrt(2 / (256 * 9)))
       for i in range(1, 5)},
    "ROI_MASK_PREDICTOR_fcn5": ("normal", math.sqrt(2 / (256 * 4))),
    "ROI_MASK_PREDICTOR_fcn_logits": ("normal", math.sqrt(2 / 81)),
}


def test_initialisation_is_the_references(model):
    assert INIT.keys() == set(mllog_tensor_names(model))
    for name, module in mllog_tensor_modules(model).items():
        kind, scale = INIT[name]
        w = module.weight.detach()
        assert torch.count_nonzero(module.bias) == 0, name
        if kind == "uniform":
            assert w.abs().max() <= scale, name
            assert w.std() == pytest.approx(scale / math.sqrt(3), rel=0.1), name
        else:
            assert w.std() == pytest.approx(scale, rel=0.1), name
            assert w.abs().max() > 2.5 * scale, name              # tails a uniform lacks


def test_shrunken_model_runs_the_same_path(model):
    small = MaskRCNN(num_classes=6, width=8, fpn_channels=16, box_head_dim=32, mask_head_dim=8)
    assert small.backbone.out_channels == (32, 64, 128, 256)
    assert [type(m) for m in small.modules()] == [type(m) for m in model.modules()]
    assert mllog_tensor_names(small) == mllog_tensor_names(model)
    rois = rois_from_boxes(BOXES)
    with torch.no_grad():
        levels = small.features(torch.randn(2, 3, 96, 128))
        logits, deltas = small.rpn(levels)
        scores, box_deltas = small.box_predictor(small.box_features(levels, rois))
        masks = small.mask_predictor(small.mask_features(levels, rois))
    sizes = [(24, 32), (12, 16), (6, 8), (3, 4), (2, 2)]
    assert [tuple(x.shape) for x in levels] == [(2, 16, h, w) for h, w in sizes]
    assert [tuple(x.shape) for x in logits] == [(2, 3, h, w) for h, w in sizes]
    assert [tuple(x.shape) for x in deltas] == [(2, 12, h, w) for h, w in sizes]
    assert scores.shape == (3, 6) and box_deltas.shape == (3, 24)
    assert masks.shape == (3, 6, 28, 28)
    assert small.box_features.fc6.in_features == 16 * 7 * 7
    assert sum(p.numel() for p in small.parameters()) < 0.01 * sum(
        p.numel() for p in model.parameters())


def test_aligned_outputs_are_the_plain_heads():
    """``aligned-outputs``: the RPN's, box predictor's and mask predictor's outputs and their
    parameters' gradients are the plain layers', the parameters and their names the same."""
    torch.manual_seed(0)
    sizes = dict(width=8, fpn_channels=16, box_head_dim=32, mask_head_dim=8)
    plain, aligned = MaskRCNN(**sizes), MaskRCNN(**sizes)
    align(aligned)
    aligned.load_state_dict(plain.state_dict())
    assert mllog_tensor_names(aligned) == mllog_tensor_names(plain)
    with torch.no_grad():
        levels = plain.features(torch.randn(2, 3, 64, 96))
    rois = rois_from_boxes(BOXES)
    results = []
    for net in plain, aligned:
        logits, deltas = net.rpn(levels)
        scores, box_deltas = net.box_predictor(net.box_features(levels, rois))
        masks = net.mask_predictor(net.mask_features(levels, rois))
        outputs = [*logits, *deltas, scores, box_deltas, masks]
        torch.manual_seed(1)
        sum((o * torch.randn_like(o)).sum() for o in outputs).backward()
        heads = (net.rpn, net.box_predictor, net.mask_predictor)
        results.append((outputs, [p.grad for h in heads for p in h.parameters()]))
    (want, want_grads), (got, got_grads) = results
    for g, w in zip(got + got_grads, want + want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)   # to fp32 rounding
