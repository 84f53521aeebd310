"""The ``fused-norm`` optimisation: the built U-Net's instance norms + ReLU as two Inductor
kernels, the statistics (``norm_sums``) and normalise + ReLU (``norm_relu``), which read either
layout in place (``F.instance_norm`` copies channels_last_3d to NCDHW and back), and dense
output gradients for its transposed convolutions. ``fuse`` swaps the built modules' classes, so
parameter names and state_dict keys (the mllog tensor names) stay the plain model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.unet3d.model import InstanceNormReLU
from common.fusion import compiled


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


class FusedInstanceNormReLU(InstanceNormReLU):
    """``InstanceNormReLU`` as two compiled kernels over the same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        moments = compiled(norm_sums)(x) / x[0, 0].numel()
        return compiled(norm_relu)(x, moments, *plain_views(self.weight, self.bias), self.eps)


class _DenseGrad(torch.autograd.Function):
    """Identity whose gradient is made dense in ``memory_format``: the gradient of one part of
    a channel concatenation is a strided slice, which the transposed convolution's backward
    would copy with a slow generic kernel (3 ms a step at 128^3 in channels_last_3d)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
        ctx.memory_format = memory_format
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.contiguous(memory_format=ctx.memory_format), None


class DenseGradConvTranspose3d(nn.ConvTranspose3d):
    """Its output gradient dense in the layout of its input, the one convolutions run in."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cl = x.is_contiguous(memory_format=torch.channels_last_3d)
        return _DenseGrad.apply(super().forward(x),
                                torch.channels_last_3d if cl else torch.contiguous_format)


FUSED = {InstanceNormReLU: FusedInstanceNormReLU, nn.ConvTranspose3d: DenseGradConvTranspose3d}


def fuse(*models: nn.Module, swaps: dict[type, type] = FUSED) -> None:
    """Each module of ``models`` whose class is a key of ``swaps`` becomes its value, in place."""
    for m in (m for model in models for m in model.modules()):
        if type(m) in swaps:
            m.__class__ = swaps[type(m)]
