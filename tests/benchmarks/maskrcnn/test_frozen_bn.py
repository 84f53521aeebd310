"""Frozen batch norm folded into its convolution (``--fold-frozen-bn``) against the plain
convolution then batch norm: the same outputs and gradients, and bf16 kept through the
backbone and FPN under autocast."""

import pytest
import torch
from torch import nn

from benchmarks.maskrcnn.frozen_bn import conv_frozen_bn, folded_conv_frozen_bn
from benchmarks.maskrcnn.model import FrozenBatchNorm2d, MaskRCNN


def random_statistics(bn: FrozenBatchNorm2d, g: torch.Generator) -> None:
    c = len(bn.weight)
    bn.weight.copy_(torch.rand(c, generator=g) + 0.5)
    bn.bias.copy_(torch.randn(c, generator=g))
    bn.running_mean.copy_(torch.randn(c, generator=g))
    bn.running_var.copy_(torch.rand(c, generator=g) + 0.1)


@pytest.mark.parametrize("kernel, stride", [(1, 1), (1, 2), (3, 2), (7, 2)])
def test_folded_convolution_is_the_convolution_then_batch_norm(kernel, stride):
    g = torch.Generator().manual_seed(kernel + stride)
    conv = nn.Conv2d(6, 5, kernel, stride, padding=kernel // 2, bias=False)
    bn = FrozenBatchNorm2d(5)
    random_statistics(bn, g)
    x = torch.randn(2, 6, 13, 11, generator=g)
    grad_out = torch.randn_like(conv_frozen_bn(conv, bn, x))
    results = []
    for path in (conv_frozen_bn, folded_conv_frozen_bn):
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
    folded = output_dtypes(MaskRCNN(fold_frozen_bn=True, **kw), images)
    assert {"backbone", "backbone.layer4.2", "fpn"} <= folded.keys()
    assert all(d == {torch.bfloat16} for d in folded.values()), folded
    # the plain path: each frozen batch norm's fp32 buffers promote its bf16 input
    plain = output_dtypes(MaskRCNN(**kw), images)
    assert plain["backbone.layer1.0.bn1"] == {torch.float32}
    assert plain["backbone.layer4.2"] == {torch.float32}
