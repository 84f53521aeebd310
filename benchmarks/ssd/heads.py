"""Confidence scores with the classes innermost (optimisation ``class-last-heads``).

The reference's confidence head of a map with ``nd`` default boxes per position has output
channel ``c * nd + d`` for class ``c`` and box ``d``, and ``SSD300.scores`` reads the scores
as ``[B, C, 8732]``, boxes in ``(d, y, x)`` order. In channels-last memory that is a full
transpose of every head's output: the kernel that concatenated them took 2.85 ms of a 78.4
ms step at batch 256 on one H100, for 0.7 GB moved, and the loss's log-softmax then reduces
over a dimension of stride 8732 (docs/performance.md, SSD). Here each head runs with its
weight's output channels reordered to ``d * C + c`` (the same weights, permuted at every
call), so at each position the ``C`` scores of a box are contiguous: the scores are
gathered as ``[B, 8732, C]`` rows and returned as its ``[B, C, 8732]`` transpose, the same
values in the same order as the reference's, classes at stride 1.

The reordered weight also gets zero filters up to a multiple of 8 output channels (81 x 4
and 81 x 6 are not), whose outputs are dropped: cuDNN otherwise pads these heads' channels
itself (``nhwcAddPaddingKernel``, 1.6 ms of a 79.5 ms step at batch 256, ibid.). The
gradient that reaches a channels-last head is made channels-last in the compiled backward:
the slice's backward would hand cuDNN an NCHW gradient, which it copies (2.7 ms of a 144
ms step at batch 512).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.ssd.model import SSD300

CHANNEL_MULTIPLE = 8


class _ChannelsLastGrad(torch.autograd.Function):
    """Identity whose gradient is returned channels-last."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous(memory_format=torch.channels_last)


def box_major(conv: nn.Conv2d, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``conv``'s weight and bias with output channel ``c * nd + d`` moved to ``d * C + c``,
    then zero filters up to a multiple of :data:`CHANNEL_MULTIPLE` channels."""
    w, b = conv.weight, conv.bias
    nd = w.shape[0] // num_classes
    w = w.reshape(num_classes, nd, -1).transpose(0, 1).reshape(w.shape)
    b = b.view(num_classes, nd).t().reshape(-1)
    pad = -w.shape[0] % CHANNEL_MULTIPLE
    return F.pad(w, (0, 0, 0, 0, 0, 0, 0, pad)), F.pad(b, (0, pad))


def class_last_scores(features: list[torch.Tensor], convs: nn.ModuleList, num_classes: int
                      ) -> torch.Tensor:
    """The heads' scores ``[B, C, 8732]`` (the reference's values and order) as the transpose
    of a contiguous ``[B, 8732, C]``."""
    parts = []
    for f, conv in zip(features, convs):
        w, b = box_major(conv, num_classes)
        channels_last = f.is_contiguous(memory_format=torch.channels_last)
        if channels_last:
            w = w.contiguous(memory_format=torch.channels_last)
        y = F.conv2d(f, w, b, conv.stride, conv.padding)
        if channels_last:
            y = _ChannelsLastGrad.apply(y)
        y = y[:, :conv.out_channels]                               # [B, nd * C, H, W]
        n, _, h, width = y.shape
        y = y.permute(0, 2, 3, 1).reshape(n, h, width, -1, num_classes)
        parts.append(y.permute(0, 3, 1, 2, 4).reshape(n, -1, num_classes))
    return torch.cat(parts, 1).transpose(1, 2)


class ClassLastSSD300(SSD300):
    """SSD300 whose scores come from :func:`class_last_scores` (the same parameters)."""

    def scores(self, features: list[torch.Tensor]) -> torch.Tensor:
        return class_last_scores(features, self.conf, self.num_classes)


def apply(net: SSD300) -> None:
    net.__class__ = ClassLastSSD300
