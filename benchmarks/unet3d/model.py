"""The MLPerf 3D U-Net (KiTS19), as the reference ``image_segmentation/pytorch`` defines it.

Input block, four down blocks and a bottleneck (``down4``), five up blocks, a
1x1x1 output convolution. Every block is conv 3x3x3 (no bias) + instance norm
(affine) + ReLU (``InstanceNormReLU``); down blocks start with a stride-2
conv, up blocks with a 2x2x2 stride-2 transposed conv (with bias) whose
output is concatenated with the skip. Module names give the ruleset's
``weights_initialization`` tensor names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.fusion import compiled

FILTERS = (32, 64, 128, 256, 320)   # the reference's channels; the bottleneck repeats the last
NUM_CLASSES = 3                     # background, kidney, tumour


def norm_sums(x: torch.Tensor) -> torch.Tensor:
    """Per (sample, channel) sum and sum of squares of ``x`` [N, C, D, H, W], fp32 [2, N, C]."""
    x = x.float()
    return torch.stack((x.sum((2, 3, 4)), x.square().sum((2, 3, 4))))


def norm_relu(x, moments, weight, bias, eps: float) -> torch.Tensor:
    """ReLU of the affine instance norm of ``x`` given ``moments`` = (mean, mean of squares)
    [2, N, C], in ``x``'s dtype (arithmetic in fp32)."""
    mean, mean_sq = moments
    scale = torch.rsqrt((mean_sq - mean.square()).clamp_min(0) + eps) * weight
    shift = bias - mean * scale
    y = torch.addcmul(shift[..., None, None, None], x.float(), scale[..., None, None, None])
    return F.relu(y).to(x.dtype)


def plain_views(*params: torch.Tensor) -> list[torch.Tensor]:
    """Parameters as plain views for compiled code: Dynamo specialises the shapes of
    Parameters, which would compile a function once per channel count."""
    return [p.view(p.shape) for p in params]


def as_channels_last_3d(x: torch.Tensor) -> torch.Tensor:
    """``x`` [N, C, D, H, W] stored channels_last_3d, with strides that say so even for one
    channel: ``contiguous(memory_format=channels_last_3d)`` keeps a one-channel image's
    NCDHW strides, and cuDNN then runs the first convolution's backward in NCDHW, which
    transposes its 32-channel gradient (3 ms a step at 128^3)."""
    n, c, d, h, w = x.shape
    strides = (c * d * h * w, 1, h * w * c, w * c, c)
    if x.stride() == strides:
        return x
    return torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device).copy_(x)


class InstanceNormReLU(nn.InstanceNorm3d):
    """Affine instance norm, then ReLU.

    ``fused``: the statistics (one reduction) and normalise+ReLU (one pass) as
    Inductor kernels that read channels_last_3d activations in place, instead
    of ``F.instance_norm``, which copies them to NCDHW and back.
    """

    def __init__(self, channels: int, fused: bool = False):
        super().__init__(channels, affine=True)
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return F.relu(super().forward(x))
        moments = compiled(norm_sums)(x) / x[0, 0].numel()
        return compiled(norm_relu)(x, moments, *plain_views(self.weight, self.bias), self.eps)


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int, name: str, stride: int = 1, fused: bool = False):
        super().__init__()
        self.name = name
        self.conv = nn.Conv3d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm = InstanceNormReLU(cout, fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))

    def tensor_names(self) -> list[str]:
        return [f"{self.name}_conv", f"{self.name}_instancenorm"]


class TwoConvs(nn.Module):
    """``<name>_block_0`` (optionally strided) then ``<name>_block_1``."""

    def __init__(self, cin: int, cout: int, name: str, stride: int = 1, fused: bool = False):
        super().__init__()
        self.block_0 = ConvBlock(cin, cout, f"{name}_block_0", stride, fused)
        self.block_1 = ConvBlock(cout, cout, f"{name}_block_1", fused=fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_1(self.block_0(x))

    def tensor_names(self) -> list[str]:
        return self.block_0.tensor_names() + self.block_1.tensor_names()


class _DenseGrad(torch.autograd.Function):
    """Identity whose gradient is made dense in ``memory_format``: the gradient of one part
    of a channel concatenation is a strided slice, which the transposed convolution's
    backward would otherwise copy with a slow generic kernel (3 ms a step at 128^3 in
    channels_last_3d); under ``torch.compile`` this copy is a fused kernel."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
        ctx.memory_format = memory_format
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.contiguous(memory_format=ctx.memory_format), None


class UpBlock(nn.Module):
    """``fused``: also the dense gradient of the transposed convolution (``_DenseGrad``)."""

    def __init__(self, cin: int, cout: int, name: str, fused: bool = False):
        super().__init__()
        self.name = name
        self.fused = fused
        self.deconv = nn.ConvTranspose3d(cin, cout, 2, stride=2, bias=True)
        self.convs = TwoConvs(2 * cout, cout, name, fused=fused)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        up = self.deconv(x)
        if self.fused:   # dense in the layout the convolutions run in, the input's
            cl = x.is_contiguous(memory_format=torch.channels_last_3d)
            up = _DenseGrad.apply(up, torch.channels_last_3d if cl else torch.contiguous_format)
        return self.convs(torch.cat((up, skip), dim=1))

    def tensor_names(self) -> list[str]:
        return [f"{self.name}_deconv"] + self.convs.tensor_names()


class Unet3D(nn.Module):
    """``fused_norm``: every instance norm + ReLU as ``InstanceNormReLU(fused=True)``, and
    dense gradients for the transposed convolutions (``_DenseGrad``)."""

    def __init__(self, filters: tuple[int, ...] = FILTERS, in_channels: int = 1,
                 num_classes: int = NUM_CLASSES, fused_norm: bool = False):
        super().__init__()
        if len(filters) != 5:
            raise ValueError(f"the 3D U-Net has 5 filter levels, got {filters}")
        self.filters = tuple(filters)
        f = fused_norm
        self.input_block = TwoConvs(in_channels, filters[0], "input", fused=f)
        self.downsample = nn.ModuleList(
            TwoConvs(i, o, f"down{n}", 2, f)
            for n, (i, o) in enumerate(zip(filters[:-1], filters[1:])))
        self.bottleneck = TwoConvs(filters[-1], filters[-1], "down4", 2, f)
        ups = [(filters[-1], filters[-1])] + list(zip(filters[:0:-1], filters[-2::-1]))
        self.upsample = nn.ModuleList(UpBlock(i, o, f"up{n}", f) for n, (i, o) in enumerate(ups))
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

    @property
    def downsampling(self) -> int:
        """Every spatial size the model sees must be a multiple of this (2**5)."""
        return 2 ** (len(self.downsample) + 1)
