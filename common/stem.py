"""The 7x7 stride-2 stem convolution of ResNets over 2x2 pixel blocks (ResNet-50, SSD's
ResNet-34 backbone)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def space_to_depth(x: torch.Tensor, weight: torch.Tensor, channels: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The input and weight of :func:`space_to_depth_conv`'s 4x4 stride-1 convolution (no
    padding): the padded image's 2x2 space-to-depth rearrangement and the 7x7 weight's,
    zero-padded to ``channels`` input channels, in channels-last memory."""
    n, c, h, w = x.shape
    x = F.pad(x, (3, 3 + (w + 6) % 2, 3, 3 + (h + 6) % 2))
    hs, ws = x.shape[2] // 2, x.shape[3] // 2
    x = x.reshape(n, c, hs, 2, ws, 2).permute(0, 1, 3, 5, 2, 4).reshape(n, 4 * c, hs, ws)
    k = weight.shape[0]
    weight = F.pad(weight, (0, 1, 0, 1)).reshape(k, c, 4, 2, 4, 2)
    weight = weight.permute(0, 1, 3, 5, 2, 4).reshape(k, 4 * c, 4, 4)
    pad = max(channels - 4 * c, 0)
    x = F.pad(x, (0, 0, 0, 0, 0, pad)).contiguous(memory_format=torch.channels_last)
    weight = F.pad(weight, (0, 0, 0, 0, 0, pad)).contiguous(memory_format=torch.channels_last)
    return x, weight


def space_to_depth_conv(x: torch.Tensor, weight: torch.Tensor, channels: int) -> torch.Tensor:
    """The stem's 7x7 stride-2 convolution (padding 3) computed as a 4x4 stride-1 convolution
    over the 2x2 space-to-depth rearrangement of the padded image, zero-padded to ``channels``
    input channels (:func:`space_to_depth`). The result is the same; cuDNN's kernels for 3
    input channels are slow."""
    # (h + 1) // 2 x (w + 1) // 2, as the 7x7/2 convolution gives
    return F.conv2d(*space_to_depth(x, weight, channels))
