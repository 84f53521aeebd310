"""The transducer loss's lattice recursion in one Triton kernel (``triton-lattice``): the
GPU counterpart of :func:`benchmarks.rnnt.loss.lattice`, which stays the reference.

The reference walks the lattice's anti-diagonals from the host, two kernels each (about 600
launches a step at 206 encoder steps and 100 labels, the GPU waiting on the host:
docs/performance.md, RNN-T). Here one program per lattice walks every diagonal itself:
each cell of diagonal ``d`` is computed from its two neighbours on diagonal ``d - 1``,
written to the output, and a barrier makes the diagonal visible to the program's threads
before the next. The arithmetic is the reference's, an fp32 add per move and
``torch.logaddexp``'s formula with libdevice's ``exp`` and ``log1p``, so the result is
the reference path's bit for bit (a GPU test).

Every batch has its own lengths, so the sizes are not specialised on (Triton would compile
a variant the first time ``T`` or ``U + 1`` is 1 or a multiple of 16, inside a timed
step: a 520 ms step that every rank of a 4-GPU run waited for), and the block is at least the
program's 128 threads, so one compiled kernel serves every batch of up to 127 labels."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from common.optimisations import Optimisation


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["T", "U1"])
    def lattice_kernel(wt, wu, init, out, T, U1, BLOCK_U: tl.constexpr):
        base = tl.program_id(0).to(tl.int64) * T * U1
        u = tl.arange(0, BLOCK_U)
        tl.store(out + base, tl.load(init + tl.program_id(0)))
        tl.debug_barrier()
        for d in range(1, T + U1 - 1):
            t = d - u
            cell = (u < U1) & (t >= 0) & (t < T)
            at = base + t * U1 + u
            from_t = (tl.load(out + at - U1, mask=cell & (t > 0), other=float("-inf"))
                      + tl.load(wt + at, mask=cell, other=float("-inf")))
            from_u = (tl.load(out + at - 1, mask=cell & (u > 0), other=float("-inf"))
                      + tl.load(wu + at, mask=cell, other=float("-inf")))
            # torch.logaddexp: an infinite pair equal to each other is its own sum
            top = tl.maximum(from_t, from_u)
            both = top + tl.extra.libdevice.log1p(tl.extra.libdevice.exp(-tl.abs(from_t - from_u)))
            same_inf = (from_t == from_u) & (tl.abs(from_t) == float("inf"))
            tl.store(out + at, tl.where(same_inf, from_t, both), mask=cell)
            tl.debug_barrier()

    return lattice_kernel


@torch.library.custom_op("rnnt::lattice", mutates_args=())
def lattice(wt: Tensor, wu: Tensor, init: Tensor) -> Tensor:
    """:func:`benchmarks.rnnt.loss.lattice` on CUDA tensors (fp32 or fp64), in one launch."""
    import triton

    wt, wu = wt.contiguous(), wu.contiguous()
    B, T, U1 = wt.shape
    out = torch.empty_like(wt)
    if out.numel():
        _kernel()[(B,)](wt, wu, init.to(wt.dtype).contiguous(), out, T, U1,
                        BLOCK_U=max(128, triton.next_power_of_2(U1)), num_warps=4,
                        enable_fp_fusion=False)
    return out


@lattice.register_fake
def _(wt, wu, init):
    return torch.empty_like(wt)


def apply(wl, _) -> None:
    wl.train_loss.walk = lattice


OPTIMISATION = Optimisation(
    "triton-lattice", "the loss's lattice recursion as one Triton kernel, not two kernels per "
    "anti-diagonal launched from the host (benchmarks/rnnt/lattice_triton.py)", apply=apply,
    cuda=True, rtol=1e-6)
