"""The ``bf16-weights`` optimisation under amp-bf16: the flat buffer's model weights and
gradients in bf16 (no per-step weight casts, half the gradient traffic), the fp32 master
weights and moments inside LAMB (``common.flat_params``), and every LayerNorm's output in bf16
(statistics still in fp32) instead of autocast's fp32, so the residual stream stays bf16 from
layer to layer. With several micro-batches their gradients add up in bf16, as NVIDIA's fp16
BERT adds them in fp16."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.bert.model import swap_class
from common.optimisations import Optimisation


def layer_norm(x, weight, bias, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension, its output in the weights' dtype when they are in
    low precision (autocast would return fp32)."""
    if weight is None or weight.dtype == torch.float32:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    with torch.autocast(x.device.type, enabled=False):
        return F.layer_norm(x.to(weight.dtype), (x.shape[-1],), weight, bias, eps)


class LowPrecisionLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)


def _select(wl, _) -> None:
    wl.impl.weight_dtype = torch.bfloat16


OPTIMISATION = Optimisation(
    "bf16-weights", "bf16 model weights and gradients in the flat buffer over fp32 master "
    "weights in LAMB, LayerNorm outputs in bf16 (bf16_weights.py)", select=_select,
    apply=lambda wl, _: swap_class(wl.net, nn.LayerNorm, LowPrecisionLayerNorm),
    requires=("flat-params",), precisions=("amp-bf16",), compare=None,
    tested_by="tests/benchmarks/bert/test_bf16_weights.py")
