"""The backbone stem's two optimisations, each the reference's result by other kernels:
``space-to-depth``, the 7x7 stride-2 convolution as a 4x4 one over 2x2 pixel blocks
(``common.stem``: cuDNN is slow on 3 input channels), and ``fused-pool``, the ReLU and
max-pool as one op with a gather-free backward (``common.pool``)."""

from __future__ import annotations

from torch import Tensor, nn

from benchmarks.ssd.model import ResNet34Backbone
from common import pool
from common.stem import space_to_depth_conv

CHANNELS = 16       # the 12 input channels of the 2x2 blocks, padded


class SpaceToDepthConv(nn.Conv2d):
    def forward(self, x: Tensor) -> Tensor:
        return space_to_depth_conv(x, self.weight, CHANNELS)


class ReluMaxPool(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return pool.relu_max_pool_3x3_s2(x)


def space_to_depth(backbone: ResNet34Backbone) -> None:
    backbone.conv1.__class__ = SpaceToDepthConv


def fused_pool(backbone: ResNet34Backbone) -> None:
    """The stem's ReLU folded into its max-pool (the pool's module: the two as one op)."""
    backbone.relu, backbone.maxpool = nn.Identity(), ReluMaxPool()
