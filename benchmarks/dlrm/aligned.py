"""The DLRM's dense part on aligned GEMM shapes (``aligned-dense``).

cuBLAS takes its fast Hopper kernels only for rows that are multiples of 16 bytes; three of the
reference's shapes are not: the 13 dense features (the bottom MLP's input), the 27 vectors of
the dot interaction (its batched products) and the 479 features after it (the top MLP's
input). In a profile of the config step on one H200 (12.4 ms of kernels), old CUTLASS kernels
took 3.4 ms: three ``wmma ... 32x32 ... align1`` ones 2.0 ms (by their shape, the
interaction's batched products and their gradients) and three ``tensorop ... align1`` ones
1.4 ms (likely the top MLP's first layer); which GEMM ran which kernel was not traced. Here
each width is padded with zeros to a multiple of 8 elements: zero features, zero vectors, and
zero weight columns padded afresh from the unpadded weights each step, so the parameters,
their gradients and the optimizer are the reference's. Zeros add nothing: the outputs equal
the plain path's up to the GEMMs' order of summation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.dlrm.model import DenseArch, lower_dots

ALIGN = 8   # elements: 16 bytes of bf16


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def aligned_interaction(bottom: torch.Tensor, emb: torch.Tensor, pair_dots=lower_dots
                        ) -> torch.Tensor:
    """``model.dot_interaction`` with the vectors padded to ``aligned(T + 1)`` by zero vectors
    and the output to ``aligned(d + (T+1)T/2)`` columns by zero columns."""
    batch, dim = bottom.shape
    n = emb.shape[1] + 1
    z = torch.cat([bottom.unsqueeze(1), emb, bottom.new_zeros(batch, aligned(n) - n, dim)],
                  dim=1)
    width = dim + n * (n - 1) // 2
    return torch.cat([bottom, pair_dots(z, n), bottom.new_zeros(batch, aligned(width) - width)],
                     dim=1)


class AlignedLinear(nn.Linear):
    """``nn.Linear`` on inputs padded to ``aligned(in_features)`` columns (zeros, added here
    where the input is narrower), its weight padded with zero columns to match."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = aligned(self.in_features)
        if x.shape[-1] < width:
            x = F.pad(x, (0, width - x.shape[-1]))
        return F.linear(x, F.pad(self.weight, (0, width - self.in_features)), self.bias)


class AlignedDenseArch(DenseArch):
    """``DenseArch`` whose interaction's output arrives padded at the top MLP's first layer."""

    def forward(self, bottom_out: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.top_mlp(aligned_interaction(bottom_out, emb, self.pair_dots)).squeeze(1)


def apply(dense: DenseArch) -> None:
    """``dense`` (its parameters kept) on aligned shapes, in place."""
    dense.__class__ = AlignedDenseArch
    for layer in (dense.bottom_mlp[0], dense.top_mlp[0]):
        layer.__class__ = AlignedLinear
