"""The ``triton-gelu`` optimisation: bias + GELU after the intermediate GEMM as one Triton
kernel forward and one backward, the backward writing the bias gradient's column sums in the
same pass (Inductor's ``fused-gelu`` reads the gradient again to sum it). The forward keeps
the GEMM's output; the backward recomputes ``z + bias`` from it, in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.bert.model import Intermediate, swap_class
from common.optimisations import Optimisation

BM, BN = 16, 256   # a program's tile
ROWS = 128         # rows a backward program sums its columns over
WARPS = 4


def _kernels():
    from benchmarks.bert import kernels as k
    return k.gelu_forward_kernel, k.gelu_backward_kernel, k.column_sums


class BiasGelu(torch.autograd.Function):
    """``gelu(z + bias)`` (erf form) of CUDA tensors, ``bias`` over the last dimension."""

    @staticmethod
    def forward(ctx, z, bias):
        n = z.shape[-1]
        z2 = z.reshape(-1, n).contiguous()
        rows = z2.shape[0]
        forward_kernel, _, _ = _kernels()
        y = torch.empty_like(z2)
        if rows:
            forward_kernel[(-(-rows // BM), -(-n // BN))](z2, bias, y, rows, n, BM=BM, BN=BN,
                                                         num_warps=WARPS)
        ctx.save_for_backward(z2, bias)
        ctx.shape = z.shape
        return y.view(z.shape)

    @staticmethod
    def backward(ctx, dy):
        z2, bias = ctx.saved_tensors
        rows, n = z2.shape
        _, backward_kernel, column_sums = _kernels()
        dy2 = dy.reshape(rows, n).contiguous()
        dz = torch.empty_like(z2)
        programs = -(-rows // ROWS)
        partial = torch.empty(programs, n, dtype=torch.float32, device=dz.device)
        if rows:
            backward_kernel[(programs, -(-n // BN))](dy2, z2, bias, dz, partial, rows, n, BM=BM,
                                                     BN=BN, ROWS=ROWS, num_warps=WARPS)
        return dz.view(ctx.shape), column_sums(partial).to(bias.dtype)


class TritonGeluIntermediate(Intermediate):
    def forward(self, x):
        return BiasGelu.apply(F.linear(x, self.dense.weight), self.dense.bias)


TRITON_GELU = Optimisation(
    "triton-gelu", "bias + GELU after the intermediate GEMM as one Triton kernel each way, the "
    "bias gradient's column sums in the backward's pass (gelu_triton.py)",
    apply=lambda wl, _: swap_class(wl.net, Intermediate, TritonGeluIntermediate),
    excludes=("fused-gelu",), cuda=True, precisions=("amp-bf16",), compare=None,
    tested_by="tests/benchmarks/bert/test_gelu_triton.py")
