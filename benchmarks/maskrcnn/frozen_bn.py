"""Frozen batch norm folded into the convolution before it (``--fold-frozen-bn``).

The plain path, :func:`conv_frozen_bn`, runs ``bn(conv(x))``: the batch norm multiplies each
feature map by fp32 buffers, so under autocast every bf16 map of the backbone becomes fp32
(one more pass to write it, one to cast it back for the next convolution). Folded
(:func:`folded_conv_frozen_bn`), it is one convolution with weight ``conv.weight * scale``
and bias ``shift``, made at each forward from the buffers: autograd gives ``conv.weight`` its
exact gradient, the output stays in the autocast dtype, and module names, state dict and
checkpoint loading are the plain model's.

With ``--fused-conv-relu`` a folded convolution, its shift, the residual and the ReLU after
it are one cuDNN kernel (:func:`fused_conv_frozen_bn_relu`, :mod:`common.conv_relu`); the
plain and folded paths add and apply the ReLU after the convolution
(:func:`conv_frozen_bn_relu`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from common.conv_relu import conv_bias_relu

if TYPE_CHECKING:
    from collections.abc import Callable

    from benchmarks.maskrcnn.model import FrozenBatchNorm2d


def conv_frozen_bn(conv: nn.Conv2d, bn: FrozenBatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """The plain path: the convolution, then the frozen batch norm."""
    return bn(conv(x))


def folded(conv: nn.Conv2d, bn: FrozenBatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias of ``bn(conv(x))`` as one convolution (``conv`` without bias)."""
    scale, shift = bn.scale_shift()
    return conv.weight * scale[:, None, None, None], shift


def folded_conv_frozen_bn(conv: nn.Conv2d, bn: FrozenBatchNorm2d, x: torch.Tensor
                          ) -> torch.Tensor:
    """``bn(conv(x))`` as one convolution (``conv`` without bias)."""
    return F.conv2d(x, *folded(conv, bn), conv.stride, conv.padding, conv.dilation,
                    conv.groups)


def conv_frozen_bn_relu(conv_bn: Callable, conv: nn.Conv2d, bn: FrozenBatchNorm2d,
                        x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``relu(conv_bn(conv, bn, x) [+ residual])`` for the plain or folded ``conv_bn``."""
    y = conv_bn(conv, bn, x)
    return F.relu(y if residual is None else y + residual)


def fused_conv_frozen_bn_relu(conv: nn.Conv2d, bn: FrozenBatchNorm2d, x: torch.Tensor,
                              residual: torch.Tensor | None = None) -> torch.Tensor:
    """The folded convolution, its shift, ``residual`` and the ReLU as one cuDNN kernel."""
    return conv_bias_relu(x, *folded(conv, bn), residual, conv.stride[0], conv.padding[0])
