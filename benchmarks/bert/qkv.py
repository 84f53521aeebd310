"""The ``fused-qkv`` optimisation: the query, key and value projections as one GEMM over the
three weights concatenated, so the backward's data gradient is one GEMM (not three summed)
and the three biases' gradients one reduction. The concatenation copies the weights each
step (6 MB a layer in bf16); their gradients come back as views of the one weight gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.bert.model import SelfAttention, mix_in
from common.optimisations import Optimisation


class FusedQkv:
    """Mixed into a :class:`SelfAttention` class: ``project`` as one GEMM."""

    def joined(self):
        """The concatenated weights and biases (query, key, value)."""
        return (torch.cat((self.query.weight, self.key.weight, self.value.weight)),
                torch.cat((self.query.bias, self.key.bias, self.value.bias)))

    def project(self, x):
        return F.linear(x, *self.joined()).chunk(3, dim=-1)


def fuse_qkv(model: torch.nn.Module) -> None:
    """Every self-attention of ``model`` (plain, ``sdpa`` or ``unpad``) projects in one GEMM."""
    mix_in(model, SelfAttention, FusedQkv)


FUSED_QKV = Optimisation(
    "fused-qkv", "the query, key and value projections as one GEMM of the concatenated "
    "weights (qkv.py)", apply=lambda wl, _: fuse_qkv(wl.net), rtol=1e-5)
