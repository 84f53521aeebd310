"""Frozen batch norm folded into its convolution (``fold-frozen-bn``) against the plain
convolution then batch norm: the same outputs and gradients, and bf16 kept through the
backbone and FPN under autocast; ``fused-conv-relu`` and ``space-to-depth`` on the folded
backbone."""

import pytest
import torch
from torch import nn

from benchmarks.maskrcnn import conv_relu, stem
from benchmarks.maskrcnn.frozen_bn import fold, folded_conv_bn
from benchmarks.maskrcnn.model import FrozenBatchNorm2d, MaskRCNN, conv_bn


def random_statistics(bn: FrozenBatchNorm2d, g: torch.Generator, spread: float = 1.0) -> None:
    """Random affine terms and statistics, ``spread`` from the identity (at 1: scales 0.5 to
    4.7, which a deep network compounds)."""
    c = len(bn.weight)
    bn.weight.copy_(spread * torch.rand(c, generator=g) + (1 - spread / 2))
    bn.bias.copy_(spread * torch.randn(c, generator=g))
    bn.running_mean.copy_(spread * torch.randn(c, generator=g))
    bn.running_var.copy_(spread * torch.rand(c, generator=g) + (1 - 0.9 * spread))


@pytest.mark.parametrize("kernel, stride", [(1, 1), (1, 2), (3, 2), (7, 2)])
def test_folded_convolution_is_the_convolution_then_batch_norm(kernel, stride):
    g = torch.Generator().manual_seed(kernel + stride)
    conv = nn.Conv2d(6, 5, kernel, stride, padding=kernel // 2, bias=False)
    bn = FrozenBatchNorm2d(5)
    random_statistics(bn, g)
    x = torch.randn(2, 6, 13, 11, generator=g)
    grad_out = torch.randn_like(conv_bn(conv, bn, x))
    results = []
    for path in (conv_bn, folded_conv_bn):
        conv.weight.grad = None
        x_ = x.clone().requires_grad_()
        out = path(conv, bn, x_)
        out.backward(grad_out)
        results.append((out, conv.weight.grad, x_.grad))
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5)
    assert list(bn.parameters()) == []


def output_dtypes(net: MaskRCNN, images: torch.Tensor) -> dict[str, set[torch.dtype]]:
    """The dtypes of every backbone and FPN module's outputs under CPU bf16 autocast."""
    dtypes: dict[str, set[torch.dtype]] = {}

    def hook(name):
        def record(_module, _inputs, output):
            outputs = output if isinstance(output, list) else [output]
            dtypes.setdefault(name, set()).update(t.dtype for t in outputs)
        return record

    for part in ("backbone", "fpn"):
        for name, module in getattr(net, part).named_modules(prefix=part):
            module.register_forward_hook(hook(name))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        net.features(images)
    return dtypes


def test_backbone_and_fpn_stay_in_bf16_under_autocast():
    torch.manual_seed(0)
    images = torch.randn(1, 3, 64, 64)
    kw = dict(num_classes=4, width=4, fpn_channels=8, box_head_dim=16, mask_head_dim=8)
    net = MaskRCNN(**kw)
    fold(net.backbone)
    folded = output_dtypes(net, images)
    assert {"backbone", "backbone.layer4.2", "fpn"} <= folded.keys()
    assert all(d == {torch.bfloat16} for d in folded.values()), folded
    # the plain path: each frozen batch norm's fp32 buffers promote its bf16 input
    plain = output_dtypes(MaskRCNN(**kw), images)
    assert plain["backbone.layer1.0.bn1"] == {torch.float32}
    assert plain["backbone.layer4.2"] == {torch.float32}


@pytest.mark.parametrize("fused, blocks", [(True, False), (False, True), (True, True)])
def test_fused_conv_relu_and_space_to_depth_compute_the_folded_model(fused, blocks):
    """``fused-conv-relu`` and ``space-to-depth`` against the folded model: the same FPN
    levels, RPN and mask head outputs and trained weights' gradients (on the CPU the fused
    operator is the plain form, so this checks the wiring and the operator's autograd; the
    cuDNN kernels are checked in tests/benchmarks/maskrcnn/test_conv_relu.py)."""
    g = torch.Generator().manual_seed(5)
    kw = dict(num_classes=4, width=4, fpn_channels=8, box_head_dim=16, mask_head_dim=8)
    nets = [MaskRCNN(**kw), MaskRCNN(**kw)]
    for net in nets:
        fold(net.backbone)
    if fused:
        conv_relu.fuse(nets[1])
    if blocks:
        stem.over_blocks(nets[1].backbone, fused)
    for module in nets[0].modules():
        if isinstance(module, FrozenBatchNorm2d):
            random_statistics(module, g, spread=0.2)
    nets[1].load_state_dict(nets[0].state_dict())
    images = torch.randn(2, 3, 64, 96, generator=g)
    rois = torch.tensor([[0, 4.0, 6.0, 40.0, 30.0], [1, 10.0, 2.0, 90.0, 60.0]])
    results = []
    for net in nets:
        net.zero_grad()
        levels = net.features(images)
        objectness, deltas = net.rpn(levels)
        masks = net.mask_features(levels, rois)
        outputs = [*levels, *objectness, *deltas, masks]
        sum((o * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in outputs).backward()
        results.append([*outputs, *(p.grad for p in net.parameters() if p.grad is not None)])
    assert len(results[0]) == len(results[1])
    for got, expected in zip(*results[::-1]):   # the stem over pixel blocks sums in
        torch.testing.assert_close(got, expected, rtol=0,   # another order
                                   atol=1e-5 * expected.abs().max().item())
