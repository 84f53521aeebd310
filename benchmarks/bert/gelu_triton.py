"""The ``triton-gelu`` optimisation: bias + GELU after the intermediate GEMM as one Triton
kernel each way, the backward's pass also summing the bias gradient's columns (Inductor's
``fused-gelu`` reads the input gradient a second time for that sum). erf as in
``kernels._gelu_cdf``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.bert.model import Intermediate, swap_class
from common.optimisations import Optimisation

# (rows, columns, warps) of a program's tile, forward and backward: the fastest of a sweep
# at [10240, 4096] on one H200
FORWARD = 32, 128, 4
BACKWARD = 64, 64, 4


def _kernels():
    from benchmarks.bert import kernels as k
    return k


class BiasGelu(torch.autograd.Function):
    """``gelu(z + bias)`` (erf form) over the last dimension of CUDA tensors, in ``z``'s dtype;
    the bias gradient summed in fp32 and returned in ``bias``'s dtype."""

    @staticmethod
    def forward(ctx, z, bias):
        n = z.shape[-1]
        z2 = z.reshape(-1, n).contiguous()
        h = torch.empty_like(z2)
        if z2.shape[0]:
            k = _kernels()
            k.launch(k.gelu_kernel, FORWARD, z2.shape[0], n, z2, bias, h, z2.shape[0], N=n)
        ctx.save_for_backward(z2, bias)
        ctx.shape = z.shape
        return h.view(z.shape)

    @staticmethod
    def backward(ctx, dh):
        z2, bias = ctx.saved_tensors
        rows, n = z2.shape
        k = _kernels()
        dz = torch.empty_like(z2)
        partial = torch.empty(-(-rows // BACKWARD[0]), n, dtype=torch.float32,
                              device=z2.device)
        if rows:
            k.launch(k.gelu_backward_kernel, BACKWARD, rows, n, dh.reshape(rows, n).contiguous(),
                     z2, bias, dz, partial, rows, N=n)
        return dz.view(ctx.shape), k.column_sums(partial, bias.dtype)


class TritonGeluIntermediate(Intermediate):
    def forward(self, x):
        return BiasGelu.apply(F.linear(x, self.dense.weight), self.dense.bias)


TRITON_GELU = Optimisation(
    "triton-gelu", "bias + GELU after the intermediate GEMM as one Triton kernel each way, "
    "the bias gradient's column sums in the backward's pass (gelu_triton.py)",
    apply=lambda wl, _: swap_class(wl.net, Intermediate, TritonGeluIntermediate),
    excludes=("fused-gelu",), cuda=True, compare=None,
    tested_by="tests/benchmarks/bert/test_gelu_triton.py")
