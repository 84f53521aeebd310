"""The ``space-to-depth`` optimisation: the stem's 7x7 stride-2 convolution computed as a 4x4
convolution over 2x2 pixel blocks (``common.stem``): the same result, faster cuDNN kernels."""

from __future__ import annotations

from torch import Tensor, nn

from common.stem import space_to_depth_conv


class SpaceToDepthConv(nn.Conv2d):
    def forward(self, x: Tensor) -> Tensor:
        return space_to_depth_conv(x, self.weight, channels=16)


def apply(wl, _) -> None:
    wl.net.conv0.__class__ = SpaceToDepthConv
