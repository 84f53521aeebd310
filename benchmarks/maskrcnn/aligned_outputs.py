"""Several linear layers (or 1x1 convolutions) on one input as one GEMM whose output count is
a multiple of 8 (optimisation ``aligned-outputs``: the RPN head's two 1x1 convolutions as one,
the box predictor's two linears as one, and the mask logits).

A layer whose output count is not a multiple of 8 (81 classes, 3 anchors, 81 x 4 deltas in
bf16) sends cuBLAS and cuDNN to their unaligned tensor-core kernels, which on an H100 took
0.2-0.3 ms for the forward or backward of a 1x1 convolution that needs a few microseconds of
arithmetic (docs/performance.md, Mask R-CNN). Here the layers' weight rows go one
after another, each layer's rows followed by zero rows up to a multiple of 8, into one weight
(and bias); one call computes every output, and each layer's output is a view of it that
starts at a multiple of 8. Zero rows add nothing to any output and get no use in the
gradients, so the outputs and the gradients are the layers' own, to rounding.

The layers keep their own parameters (their names, state dict and initialisation are
unchanged); the stacked weight is built in every call, a few kilobytes, and its gradient flows
back to each layer through the concatenation. The optimisation gives the three heads the
forwards below (the same modules, a class whose forward computes them so).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.maskrcnn.model import BoxPredictor, MaskPredictor, MaskRCNN, RPNHead

MULTIPLE = 8        # bf16 elements in 16 bytes: the alignment tensor-core kernels take


def _padded(t: torch.Tensor, multiple: int) -> torch.Tensor:
    """``t`` with zero rows after its own, up to a multiple of ``multiple`` rows."""
    pad = -t.shape[0] % multiple
    return t if pad == 0 else torch.cat((t, t.new_zeros((pad, *t.shape[1:]))))


def _stacked(layers: Sequence[nn.Module], multiple: int
             ) -> tuple[torch.Tensor, torch.Tensor | None, list[tuple[int, int]]]:
    """The layers' weights (and biases) stacked, each padded; each layer's (start, rows)."""
    if any((layer.bias is None) != (layers[0].bias is None) for layer in layers):
        raise ValueError("the layers must all have a bias or all have none")
    weights, biases, spans, start = [], [], [], 0
    for layer in layers:
        rows = layer.weight.shape[0]
        weights.append(_padded(layer.weight, multiple))
        if layer.bias is not None:
            biases.append(_padded(layer.bias, multiple))
        spans.append((start, rows))
        start += weights[-1].shape[0]
    return torch.cat(weights), (torch.cat(biases) if biases else None), spans


def linear(x: torch.Tensor, layers: Sequence[nn.Linear],
           multiple: int = MULTIPLE) -> list[torch.Tensor]:
    """``[layer(x) for layer in layers]``, as one GEMM: each output ``[..., out_i]`` a view."""
    weight, bias, spans = _stacked(layers, multiple)
    y = F.linear(x, weight, bias)
    return [y.narrow(-1, start, rows) for start, rows in spans]


def conv1x1(x: torch.Tensor, layers: Sequence[nn.Conv2d],
            multiple: int = MULTIPLE) -> list[torch.Tensor]:
    """``[layer(x) for layer in layers]`` for 1x1 convolutions of stride 1 without padding
    or groups, as one convolution: each output ``[N, out_i, H, W]`` a view of its channels."""
    for layer in layers:
        if (layer.kernel_size != (1, 1) or layer.stride != (1, 1) or layer.padding != (0, 0)
                or layer.dilation != (1, 1) or layer.groups != 1):
            raise ValueError(f"{layer} is not a plain 1x1 convolution")
    weight, bias, spans = _stacked(layers, multiple)
    y = F.conv2d(x, weight, bias)
    return [y.narrow(1, start, rows) for start, rows in spans]


class AlignedRPNHead(RPNHead):
    def forward(self, levels: list[torch.Tensor]
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        hidden = [self.conv_relu(self.conv, x) for x in levels]
        outputs = [conv1x1(h, (self.cls_logits, self.bbox_pred)) for h in hidden]
        return [o[0] for o in outputs], [o[1] for o in outputs]


class AlignedBoxPredictor(BoxPredictor):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(linear(x, (self.cls_score, self.bbox_pred)))


class AlignedMaskPredictor(MaskPredictor):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv5_mask(x))
        return conv1x1(x, (self.mask_fcn_logits,))[0]


def align(net: MaskRCNN) -> None:
    """The RPN head's, box predictor's and mask predictor's outputs aligned."""
    for module, aligned in ((net.rpn, AlignedRPNHead), (net.box_predictor, AlignedBoxPredictor),
                            (net.mask_predictor, AlignedMaskPredictor)):
        module.__class__ = aligned
