"""The ``flat-params``, ``sharded-optimizer``, ``fused-lamb`` and ``bf16-weights`` optimisations.

Every parameter and gradient a view of one buffer (``common.flat_params``) and LAMB on it
(``common.lamb.ShardedLamb``) in place of DDP and per-tensor LAMB, selected before ``build()``:
the parameters must be views of the buffer before anything wraps them. ``fused-lamb``: that
LAMB's update in two Triton kernels (``common.fused_lamb``). bf16 weights: the buffer
in bf16 (no per-step weight casts, half the gradient traffic) over fp32 masters and moments,
LayerNorm outputs in bf16 (statistics in fp32) so the residual stream stays bf16; micro-batch
gradients then add up in bf16, as NVIDIA's fp16 BERT adds them in fp16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.bert.model import swap_class
from common.flat_params import FlatParameters
from common.fused_lamb import FusedLamb
from common.lamb import LambHyper, ShardedLamb
from common.optimisations import Optimisation


def flat_lamb(wl, hyper: LambHyper, decay: list[bool]):
    """``(model, optimizer)`` of ``wl.net`` on one flat buffer (of ``wl.impl.weight_dtype``)."""
    env, sharded = wl.env, wl.impl.sharded
    flat = FlatParameters(wl.net, env.world_size if sharded else 1, wl.impl.weight_dtype)
    if env.distributed:
        flat.broadcast(0)   # the same initial weights everywhere
    lamb = FusedLamb if wl.impl.fused_lamb else ShardedLamb
    return wl.net, lamb(flat, decay, hyper, env.rank, env.world_size, sharded)


FLAT_PARAMS = Optimisation(
    "flat-params", "parameters and gradients in one buffer, LAMB on it with whole-buffer and "
    "multi-tensor kernels and one gradient all-reduce (flat_lamb.py)",
    select=lambda wl, _: setattr(wl.impl, "data_parallel", flat_lamb), rtol=1e-6)
SHARDED_OPTIMIZER = Optimisation(
    "sharded-optimizer", "each rank updates its shard of the flat buffer after one gradient "
    "reduce-scatter, then one all-gather of the weights (flat_lamb.py)",
    select=lambda wl, _: setattr(wl.impl, "sharded", True), requires=("flat-params",),
    rtol=1e-6)
FUSED_LAMB = Optimisation(
    "fused-lamb", "LAMB's update on the flat buffer in two Triton kernels: moments and the "
    "norms' partial sums, then the weights and their model copy (common/fused_lamb.py)",
    select=lambda wl, _: setattr(wl.impl, "fused_lamb", True), requires=("flat-params",),
    cuda=True, compare=None, tested_by="tests/common/test_fused_lamb.py")


def layer_norm(x, weight, bias, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension, in low-precision weights' dtype (autocast's: fp32)."""
    if weight is None or weight.dtype == torch.float32:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    with torch.autocast(x.device.type, enabled=False):
        return F.layer_norm(x.to(weight.dtype), (x.shape[-1],), weight, bias, eps)


class LowPrecisionLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)


BF16_WEIGHTS = Optimisation(
    "bf16-weights", "bf16 model weights and gradients in the flat buffer over fp32 master "
    "weights in LAMB, LayerNorm outputs in bf16 (flat_lamb.py)",
    select=lambda wl, _: setattr(wl.impl, "weight_dtype", torch.bfloat16),
    apply=lambda wl, _: swap_class(wl.net, nn.LayerNorm, LowPrecisionLayerNorm),
    requires=("flat-params",), precisions=("amp-bf16",), compare=None,
    tested_by="tests/benchmarks/bert/test_bf16_weights.py")
