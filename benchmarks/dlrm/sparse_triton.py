"""The embedding rows' SGD update in two Triton kernels (``triton-sparse-sgd``): the GPU
counterpart of :func:`benchmarks.dlrm.fused_sgd.sparse_sgd_`, which stays the reference.

The reference turns the lookups' gradients into fp32 and scales them by the learning rate (two
passes over [lookups, d]), adds them into the fp32 master rows (``index_add_``), then gathers
those rows, rounds them and scatters them into the low-precision copy the lookups read: about
6 GB of traffic for the 1.4M lookups of a batch of 55,296 at d = 128. Here the first kernel
reads each gradient row in its own dtype and adds ``-lr * grad`` into its master row with
atomic adds (as ``index_add_`` does on CUDA: repeated rows accumulate, in no fixed order); the
second writes each looked-up row's copy from the updated master: about 2.2 GB. The arithmetic
of each addition is the reference's, so the result equals it up to the order in which a
repeated row's additions land (a GPU test). A third kernel updates the frequent table and its
copy in one pass (``table_sgd_``).
"""

from __future__ import annotations

import functools

import torch

LOOKUPS = 16   # gradient rows a program
BLOCK = 1024   # table values a program (table_sgd_)


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(master_ptr, rows_ptr, grads_ptr, lr_ptr, n, dim, group, group_stride,
                   LOOKUPS: tl.constexpr, DIM: tl.constexpr):
        p = tl.program_id(0).to(tl.int64) * LOOKUPS + tl.arange(0, LOOKUPS)
        d = tl.arange(0, DIM)
        row = tl.load(rows_ptr + p, mask=p < n, other=-1)
        inside = ((p < n) & (row >= 0))[:, None] & (d < dim)[None, :]
        at = (p // group) * group_stride + (p % group) * dim
        g = tl.load(grads_ptr + at[:, None] + d[None, :], mask=inside, other=0.0)
        tl.atomic_add(master_ptr + row[:, None] * dim + d[None, :],
                      g.to(tl.float32) * -tl.load(lr_ptr), mask=inside, sem="relaxed")

    @triton.jit
    def copy_kernel(master_ptr, copy_ptr, rows_ptr, n, dim, LOOKUPS: tl.constexpr,
                    DIM: tl.constexpr):
        p = tl.program_id(0).to(tl.int64) * LOOKUPS + tl.arange(0, LOOKUPS)
        d = tl.arange(0, DIM)
        row = tl.load(rows_ptr + p, mask=p < n, other=-1)
        inside = ((p < n) & (row >= 0))[:, None] & (d < dim)[None, :]
        at = row[:, None] * dim + d[None, :]
        w = tl.load(master_ptr + at, mask=inside)
        tl.store(copy_ptr + at, w.to(copy_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=inside)

    @triton.jit
    def table_kernel(master_ptr, copy_ptr, grad_ptr, lr_ptr, n, BLOCK: tl.constexpr,
                     COPY: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        w = tl.load(master_ptr + i, mask=i < n)
        w += tl.load(grad_ptr + i, mask=i < n).to(tl.float32) * -tl.load(lr_ptr)
        tl.store(master_ptr + i, w, mask=i < n)
        if COPY:
            tl.store(copy_ptr + i, w.to(copy_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
                     mask=i < n)

    return add_kernel, copy_kernel, table_kernel


def vector_groups(grads: torch.Tensor) -> torch.Tensor:
    """The ``[n, d]`` or ``[B, T, d]`` gradient vectors as ``[groups, group, d]`` with each
    group's vectors consecutive (``stride(1) == d``, ``stride(2) == 1``), groups ``stride(0)``
    apart: ``grads`` itself where it is laid out so (as the embeddings' slice of the
    interaction's gradient is), else a contiguous copy. Vector ``p`` starts at element
    ``(p // group) * stride(0) + (p % group) * d``."""
    dim = grads.shape[-1]
    if grads.dim() == 3 and grads.stride(2) == 1 and grads.stride(1) == dim:
        return grads
    return grads.reshape(-1, 1, dim).contiguous()


@torch.no_grad()
def sparse_sgd_(master: torch.Tensor, copy: torch.Tensor | None, rows: torch.Tensor,
                grads: torch.Tensor, lr: torch.Tensor) -> None:
    """``fused_sgd.sparse_sgd_`` (``master[rows] -= lr * grads``, repeats accumulating, then
    ``copy[rows] = master[rows]``) in Triton kernels; ``master`` fp32, ``grads`` [n, d] or
    [B, T, d] (read in place where :func:`vector_groups` can) of any float dtype, all on one
    device. Unlike the reference, a negative row is skipped (with its gradient):
    ``fused-lookups`` passes every lookup's, frequent ones as -1."""
    import triton

    n, dim = rows.numel(), grads.shape[-1]
    if not n:
        return
    add, refresh, _ = _kernels()
    grid = (triton.cdiv(n, LOOKUPS),)
    rows, grads = rows.contiguous(), vector_groups(grads)
    block = dict(LOOKUPS=LOOKUPS, DIM=triton.next_power_of_2(dim))
    add[grid](master, rows, grads, lr, n, dim, grads.shape[1], grads.stride(0), **block)
    if copy is not None:
        refresh[grid](master, copy, rows, n, dim, **block)


@torch.no_grad()
def table_sgd_(master: torch.Tensor, copy: torch.Tensor | None, grad: torch.Tensor,
               lr: torch.Tensor) -> None:
    """``fused_sgd.table_sgd_`` (the frequent table's dense update and its low-precision copy)
    in one pass: the reference reads the updated master again to write the copy."""
    import triton

    if not all(t is None or t.is_contiguous() for t in (master, copy, grad)):
        raise ValueError("table_sgd_ needs contiguous tables and gradient")
    if n := master.numel():
        _kernels()[2][(triton.cdiv(n, BLOCK),)](master, master if copy is None else copy, grad,
                                                lr, n, BLOCK=BLOCK, COPY=copy is not None)
