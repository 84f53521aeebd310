"""The ``triton-layernorm`` optimisation: ``LayerNorm(dropout(x + bias) + residual)`` after the
attention-output and output GEMMs as one Triton kernel forward and one backward.

The dropout mask is drawn in the forward kernel from a hash of each element's index and the
call's seed (``kernels._kept``) and redrawn by the backward, so no mask is kept. The forward
keeps the row statistics; the backward recomputes the sum in fp32 from the inputs, and with
LayerNorm's input gradient (the residual's, and through the mask the dense output's) writes
each block of rows' column sums for the three bias-like gradients (the dense bias,
LayerNorm's weight and bias), which a small kernel adds up. The mask's seed is drawn on the
device (``seeds.py``: one draw a forward pass for all calls), so a captured step draws new
masks each replay.

A block's output feeds two consumers, the next GEMM and the next block's residual: it goes
to the GEMM, and an alias of it (a second output of the same autograd node, ``fork``) to the
residual, so that the two gradients reach the backward kernel apart and are summed as it
loads them, not by a separate add of autograd's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.bert.model import DenseLayerNorm, swap_class
from benchmarks.bert.seeds import draw, number, seed_of
from common.optimisations import Optimisation

# the fastest of 8-64 rows a backward program and 1-4 warps a forward program on one H200
ROWS = 16      # rows a backward program sums its columns over
WARPS = 1, 2   # the forward's and the backward's


def _kernels():
    from benchmarks.bert import kernels as k
    return (k.next_power_of_2, k.layer_norm_forward_kernel, k.layer_norm_backward_kernel,
            k.column_sums)


class DropoutAddLayerNorm(torch.autograd.Function):
    """``layer_norm(dropout(x + bias, p) + residual, weight, ln_bias, eps)`` over the last
    dimension (a multiple of 4) of CUDA tensors; the output in ``weight``'s dtype, and an
    alias of it whose gradient the backward adds to the output's. ``seed``: the mask's
    (an int64 [1] on the device; drawn here if None)."""

    @staticmethod
    def forward(ctx, x, bias, residual, weight, ln_bias, p: float, eps: float, seed=None):
        h = x.shape[-1]
        if h % 4:
            raise ValueError(f"triton-layernorm needs a hidden size divisible by 4, not {h}")
        x2, res2 = x.reshape(-1, h).contiguous(), residual.reshape(-1, h).contiguous()
        rows = x2.shape[0]
        next_pow2, forward_kernel, _, _ = _kernels()
        y = torch.empty(rows, h, dtype=weight.dtype, device=x.device)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        if seed is None:
            seed = draw(1, x.device) if p > 0 else mean
        threshold = round(p * 2**24)   # of a word's top 24 bits: kept with probability 1 - p
        scale = 1.0 / (1.0 - p) if p < 1 else 0.0
        if rows:
            forward_kernel[(rows,)](x2, bias, res2, weight, ln_bias, y, mean, rstd, seed,
                                    threshold, scale, eps, H=h, Q=next_pow2(h // 4),
                                    DROPOUT=p > 0, num_warps=WARPS[0])
        ctx.save_for_backward(x2, bias, res2, weight, seed, mean, rstd)
        ctx.p, ctx.threshold, ctx.scale = p, threshold, scale
        ctx.shapes = x.shape, residual.dtype
        ctx.set_materialize_grads(False)   # an unused output's gradient: None, not zeros
        y = y.view(x.shape[:-1] + (h,))
        return y, y.view_as(y)

    @staticmethod
    def backward(ctx, dy, dfork):
        x2, bias, res2, weight, seed, mean, rstd = ctx.saved_tensors
        shape, res_dtype = ctx.shapes
        rows, h = x2.shape
        next_pow2, _, backward_kernel, column_sums = _kernels()
        if dy is None:
            dy, dfork = dfork, None
        if dy is None:
            dy = torch.zeros(rows, h, dtype=weight.dtype, device=x2.device)
        dy2 = dy.reshape(rows, h).contiguous()
        df2 = dy2 if dfork is None else dfork.reshape(rows, h).contiguous()
        dres = torch.empty(rows, h, dtype=res_dtype, device=dy.device)
        dx = torch.empty_like(x2)
        programs = -(-rows // ROWS)
        partial = torch.empty(programs, 3, h, dtype=torch.float32, device=dy.device)
        if rows:
            backward_kernel[(programs,)](dy2, df2, x2, bias, res2, weight, seed, mean, rstd,
                                         dres, dx, partial, rows, ctx.threshold, ctx.scale, H=h,
                                         Q=next_pow2(h // 4), ROWS=ROWS, DROPOUT=ctx.p > 0,
                                         FORKED=dfork is not None, num_warps=WARPS[1])
        dbias, dweight, dln_bias = column_sums(partial.view(programs, 3 * h),
                                               weight.dtype).view(3, h)
        return (dx.view(shape), dbias.to(bias.dtype), dres.view(shape), dweight, dln_bias,
                None, None, None)


class TritonDenseLayerNorm(DenseLayerNorm):
    def forward(self, x, residual):
        return self.after_dense(F.linear(x, self.dense.weight), residual)

    def after_dense(self, y, residual):
        """The output carries its ``fork``, which a later block takes as its residual."""
        p = self.dropout.p if self.training else 0.0
        ln = self.LayerNorm
        out, out.fork = DropoutAddLayerNorm.apply(y, self.dense.bias,
                                                  getattr(residual, "fork", residual),
                                                  ln.weight, ln.bias, p, ln.eps, seed_of(self))
        return out


def triton_layernorm(net: torch.nn.Module) -> None:
    """Every plain :class:`DenseLayerNorm` of ``net`` as a :class:`TritonDenseLayerNorm`, its
    seed from ``net``'s one draw a forward pass."""
    swap_class(net, DenseLayerNorm, TritonDenseLayerNorm)
    number(net, TritonDenseLayerNorm)


TRITON_LAYERNORM = Optimisation(
    "triton-layernorm", "bias + dropout + residual + LayerNorm after the output GEMMs as one "
    "Triton kernel each way, the dropout mask drawn in the kernel, the bias and LayerNorm "
    "gradients' column sums and the residual branch's gradient in the backward's pass "
    "(layernorm_triton.py)",
    apply=lambda wl, _: triton_layernorm(wl.net),
    excludes=("fused-layernorm",), cuda=True, precisions=("amp-bf16",), compare=None,
    tested_by="tests/benchmarks/bert/test_layernorm_triton.py")
