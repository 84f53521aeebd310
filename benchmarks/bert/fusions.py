"""The ``fused-gelu`` and ``fused-layernorm`` optimisations: the elementwise chains after the
encoder's GEMMs as Inductor-generated kernels (``common.fusion.compiled``), the bias taken out
of the GEMM into the fused chain. Dropout inside a compiled chain is drawn by Inductor's own
generator: the same distribution, not the same mask as eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.bert.flat_lamb import layer_norm
from benchmarks.bert.model import DenseLayerNorm, Intermediate, swap_class
from common.fusion import compiled
from common.optimisations import Optimisation


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU (erf form) of ``x + bias``."""
    return F.gelu(x + bias)


def bias_dropout_add_layer_norm(x, bias, residual, weight, ln_bias, p: float, eps: float):
    """LayerNorm(dropout(x + bias) + residual)."""
    return layer_norm(F.dropout(x + bias, p) + residual, weight, ln_bias, eps)


class FusedGeluIntermediate(Intermediate):
    def forward(self, x):
        return compiled(bias_gelu)(F.linear(x, self.dense.weight), self.dense.bias)


class FusedDenseLayerNorm(DenseLayerNorm):
    def forward(self, x, residual):
        return self.after_dense(F.linear(x, self.dense.weight), residual)

    def after_dense(self, y, residual):
        p = self.dropout.p if self.training else 0.0
        return compiled(bias_dropout_add_layer_norm)(
            y, self.dense.bias, residual, self.LayerNorm.weight, self.LayerNorm.bias, p,
            self.LayerNorm.eps)


FUSED_GELU = Optimisation(
    "fused-gelu", "bias + GELU after the intermediate GEMM as one compiled kernel (fusions.py)",
    apply=lambda wl, _: swap_class(wl.net, Intermediate, FusedGeluIntermediate), rtol=1e-6)
FUSED_LAYERNORM = Optimisation(
    "fused-layernorm", "bias + dropout + residual + LayerNorm after the output GEMMs as "
    "compiled kernels (fusions.py)",
    apply=lambda wl, _: swap_class(wl.net, DenseLayerNorm, FusedDenseLayerNorm),
    rtol=3e-3)   # other dropout masks than eager's
