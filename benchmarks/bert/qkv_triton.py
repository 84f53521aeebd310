"""The ``triton-qkv`` optimisation: ``fused-qkv``'s backward joins the query, key and value
gradients into the projection's output gradient and sums the bias gradient in one Triton
pass, where autograd takes two (the split's backward concatenates, then the linear's
backward reduces the [tokens, 3 * hidden] gradient again for the bias); gradients already
side by side (``triton-attention``'s) are only summed. The data and weight gradients stay two
cuBLAS GEMMs."""

from __future__ import annotations

import torch

from benchmarks.bert.model import SelfAttention, mix_in
from common.optimisations import Optimisation

# a join program's rows (in tiles of TILE_ROWS) and columns (up to COLUMNS, dividing the
# hidden size): at [10240, 3072] the fastest of 12 tiles on one H200, 21.9 us with the column
# sums against 31.2 for the former 64-row programs (docs/performance.md)
ROWS, TILE_ROWS, COLUMNS, WARPS = 512, 32, 256, 4


def _kernels():
    from benchmarks.bert import kernels as k
    return k.join_kernel, k.column_sums


class ProjectQkv(torch.autograd.Function):
    """``(x @ w.T + b).chunk(3, -1)`` for ``w`` [3 * hidden, hidden], ``b`` [3 * hidden] and
    ``x`` [..., hidden] on CUDA, under autocast in its dtype."""

    @staticmethod
    def forward(ctx, x, w, b):
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
            x, w, b = x.to(dtype), w.to(dtype), b.to(dtype)
        h = x.shape[-1]
        x2 = x.reshape(-1, h)
        y = torch.addmm(b, x2, w.t())
        ctx.save_for_backward(x2, w)
        ctx.shape = x.shape
        return tuple(t.view(x.shape[:-1] + (h,)) for t in y.chunk(3, dim=-1))

    @staticmethod
    def backward(ctx, dq, dk, dv):
        x2, w = ctx.saved_tensors
        rows, h = x2.shape
        join_kernel, column_sums = _kernels()
        parts = [g.reshape(rows, h) for g in (dq, dk, dv)]
        parts = [g if g.stride(-1) == 1 else g.contiguous() for g in parts]
        joined = _side_by_side(parts)
        dy = (parts[0].as_strided((rows, 3 * h), (3 * h, 1)) if joined else
              torch.empty(rows, 3 * h, dtype=x2.dtype, device=x2.device))
        blocks = -(-rows // ROWS)
        partial = torch.empty(blocks, 3 * h, dtype=torch.float32, device=x2.device)
        cols = min(COLUMNS, h & -h)
        if rows:
            join_kernel[(blocks, 3 * h // cols)](*parts, dy, partial, rows,
                                                 *(g.stride(0) for g in parts), H=h, RP=ROWS,
                                                 BR=TILE_ROWS, BC=cols, COPY=not joined,
                                                 num_warps=WARPS)
        db = column_sums(partial, w.dtype) if rows else partial.sum(0).to(w.dtype)
        return (dy.mm(w).view(ctx.shape), dy.t().mm(x2), db)


def _side_by_side(parts: list[torch.Tensor]) -> bool:
    """Whether the three [rows, h] gradients are the thirds of one [rows, 3h] matrix (as
    ``triton-attention`` writes them): then they need no join."""
    q, k, v = parts
    h = q.shape[1]
    step = h * q.element_size()
    return (all(g.stride() == (3 * h, 1) and g.dtype == q.dtype for g in parts)
            and k.data_ptr() == q.data_ptr() + step and v.data_ptr() == q.data_ptr() + 2 * step)


class TritonQkv:
    """Mixed into a ``fused-qkv`` self-attention class: ``project`` as :class:`ProjectQkv`."""

    def project(self, x):
        return ProjectQkv.apply(x, *self.joined())


def triton_qkv(model: torch.nn.Module) -> None:
    """Every (``fused-qkv``) self-attention of ``model`` projects with :class:`ProjectQkv`."""
    mix_in(model, SelfAttention, TritonQkv)


TRITON_QKV = Optimisation(
    "triton-qkv", "fused-qkv's backward: the three attention gradients joined and the bias "
    "gradient summed in one Triton pass (qkv_triton.py)", apply=lambda wl, _: triton_qkv(wl.net),
    requires=("fused-qkv",), cuda=True, compare=None,
    tested_by="tests/benchmarks/bert/test_qkv_triton.py")
