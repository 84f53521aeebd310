"""The MLPerf 3D U-Net (KiTS19), as the reference ``image_segmentation/pytorch`` defines it.

Input block, four down blocks and a bottleneck (``down4``), five up blocks, a
1x1x1 output convolution. Every block is conv 3x3x3 (no bias) + instance norm
(affine) + ReLU (``InstanceNormReLU``); down blocks start with a stride-2
conv, up blocks with a 2x2x2 stride-2 transposed conv (with bias) whose
output is concatenated with the skip. Module names give the ruleset's
``weights_initialization`` tensor names. The optimisations transform the built model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FILTERS = (32, 64, 128, 256, 320)   # the reference's channels; the bottleneck repeats the last
NUM_CLASSES = 3                     # background, kidney, tumour


class InstanceNormReLU(nn.InstanceNorm3d):
    """Affine instance norm, then ReLU."""

    def __init__(self, channels: int):
        super().__init__(channels, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(super().forward(x))


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int, name: str, stride: int = 1):
        super().__init__()
        self.name = name
        self.conv = nn.Conv3d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm = InstanceNormReLU(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))

    def tensor_names(self) -> list[str]:
        return [f"{self.name}_conv", f"{self.name}_instancenorm"]


class TwoConvs(nn.Module):
    """``<name>_block_0`` (optionally strided) then ``<name>_block_1``."""

    def __init__(self, cin: int, cout: int, name: str, stride: int = 1):
        super().__init__()
        self.block_0 = ConvBlock(cin, cout, f"{name}_block_0", stride)
        self.block_1 = ConvBlock(cout, cout, f"{name}_block_1")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_1(self.block_0(x))

    def tensor_names(self) -> list[str]:
        return self.block_0.tensor_names() + self.block_1.tensor_names()


class UpBlock(nn.Module):
    """Transposed convolution, concatenation with the skip, two convolution blocks."""

    def __init__(self, cin: int, cout: int, name: str):
        super().__init__()
        self.name = name
        self.deconv = nn.ConvTranspose3d(cin, cout, 2, stride=2, bias=True)
        self.convs = TwoConvs(2 * cout, cout, name)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.convs(torch.cat((self.deconv(x), skip), dim=1))

    def tensor_names(self) -> list[str]:
        return [f"{self.name}_deconv"] + self.convs.tensor_names()


class Unet3D(nn.Module):
    def __init__(self, filters: tuple[int, ...] = FILTERS, in_channels: int = 1,
                 num_classes: int = NUM_CLASSES):
        super().__init__()
        if len(filters) != 5:
            raise ValueError(f"the 3D U-Net has 5 filter levels, got {filters}")
        self.filters = tuple(filters)
        self.input_block = TwoConvs(in_channels, filters[0], "input")
        self.downsample = nn.ModuleList(
            TwoConvs(i, o, f"down{n}", 2)
            for n, (i, o) in enumerate(zip(filters[:-1], filters[1:])))
        self.bottleneck = TwoConvs(filters[-1], filters[-1], "down4", 2)
        ups = [(filters[-1], filters[-1])] + list(zip(filters[:0:-1], filters[-2::-1]))
        self.upsample = nn.ModuleList(UpBlock(i, o, f"up{n}") for n, (i, o) in enumerate(ups))
        self.output = nn.Conv3d(filters[0], num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.input_block(x)
        skips = [x]
        for down in self.downsample:
            x = down(x)
            skips.append(x)
        x = self.bottleneck(x)
        for up, skip in zip(self.upsample, reversed(skips)):
            x = up(x, skip)
        return self.output(x)

    def tensor_names(self) -> list[str]:
        """The mllog ``weights_initialization`` tensor names, in module order."""
        names = self.input_block.tensor_names()
        for block in [*self.downsample, self.bottleneck, *self.upsample]:
            names += block.tensor_names()
        return names + ["output_conv"]
