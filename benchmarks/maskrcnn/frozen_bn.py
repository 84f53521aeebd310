"""Frozen batch norm folded into the convolution before it (optimisation ``fold-frozen-bn``).

The plain path, :func:`benchmarks.maskrcnn.model.conv_bn`, runs ``bn(conv(x))``: the batch
norm multiplies each feature map by fp32 buffers, so under autocast every bf16 map of the
backbone becomes fp32 (one more pass to write it, one to cast it back for the next
convolution). Folded (:func:`folded_conv_bn`), it is one convolution with weight
``conv.weight * scale`` and bias ``shift``, made at each forward from the buffers: autograd
gives ``conv.weight`` its exact gradient, the output stays in the autocast dtype, and module
names, state dict and checkpoint loading are the plain model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.maskrcnn.model import Bottleneck, FrozenBatchNorm2d, ResNet50


def folded(conv: nn.Conv2d, bn: FrozenBatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias of ``bn(conv(x))`` as one convolution (``conv`` without bias)."""
    scale, shift = bn.scale_shift()
    return conv.weight * scale[:, None, None, None], shift


def folded_conv_bn(conv: nn.Conv2d, bn: FrozenBatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``bn(conv(x))`` as one convolution (``conv`` without bias)."""
    return F.conv2d(x, *folded(conv, bn), conv.stride, conv.padding, conv.dilation,
                    conv.groups)


def folded_conv_bn_relu(conv: nn.Conv2d, bn: FrozenBatchNorm2d, x: torch.Tensor,
                        residual: torch.Tensor | None = None) -> torch.Tensor:
    """``relu(bn(conv(x)) [+ residual])`` with the folded convolution."""
    y = folded_conv_bn(conv, bn, x)
    return F.relu(y if residual is None else y + residual)


def fold(backbone: ResNet50) -> None:
    """The backbone's convolutions and batch norms (stem, bottlenecks) as folded ones."""
    for m in backbone.modules():
        if isinstance(m, (ResNet50, Bottleneck)):
            m.conv_bn, m.conv_bn_relu = folded_conv_bn, folded_conv_bn_relu
