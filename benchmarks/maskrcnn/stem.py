"""The folded backbone's stem over 2x2 pixel blocks (optimisation ``space-to-depth``): its 7x7
stride-2 convolution as a 4x4 one over the image's space-to-depth rearrangement
(:mod:`common.stem`), the same result; cuDNN's kernels for 3 input channels are slow. With
``fused-conv-relu`` the shift and ReLU are in the convolution's epilogue."""

from __future__ import annotations

import functools

import torch

from benchmarks.maskrcnn.conv_relu import conv_bias_relu, plain_conv_bias_relu
from benchmarks.maskrcnn.frozen_bn import folded
from benchmarks.maskrcnn.model import ResNet50
from common.stem import space_to_depth

CHANNELS = 16       # the stem's 12 input channels padded


def stem(backbone: ResNet50, bias_relu, x: torch.Tensor) -> torch.Tensor:
    """``relu(bn1(conv1(x)))`` over 2x2 pixel blocks, ``bias_relu`` the convolution, shift and
    ReLU."""
    weight, shift = folded(backbone.conv1, backbone.bn1)
    return bias_relu(*space_to_depth(x, weight, CHANNELS), shift)


def over_blocks(backbone: ResNet50, fused: bool) -> None:
    """The folded ``backbone``'s stem over pixel blocks, as one kernel if ``fused``."""
    backbone.stem = functools.partial(stem, backbone,
                                      conv_bias_relu if fused else plain_conv_bias_relu)
