"""Rare embedding rows kept in bf16 only (``bf16-tables``): no fp32 masters, so the sharded
tables take a third of the memory that fp32 masters with a bf16 copy take (the reference's
40M-capped tables: 48 GB in place of 144 GB).

SGD's update of a bf16 row would vanish whenever ``lr * grad`` is below half a bf16 step of the
weight, so each updated row is rounded stochastically: the fp32 result ``w - lr * sum(grads)``
becomes one of its two bf16 neighbours with the probabilities that make the rounding unbiased
(16 random bits added below bf16's mantissa, then truncation). That needs each row's gradients
summed before the row is written once, not added row by row as ``sparse_sgd_`` adds them.

- :func:`sparse_sgd_sr_` is the reference (PyTorch: ``torch.unique``, ``index_add_``, random bits
  from a ``torch.Generator``), on any device.
- :func:`run_sgd_` does the same in one Triton kernel from the runs the index plan of
  ``fused-lookups`` sorts out ahead of the step (``lookups_triton``: ``run_order``,
  ``run_starts``, ``run_rows``), with Philox bits from a seed on the device that each step
  advances, so the step stays one CUDA graph.
"""

from __future__ import annotations

import functools

import torch

RUNS = 16    # runs (rows) a program: most rare rows have one or two lookups a batch


def stochastic_round(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """fp32 ``x`` to bf16, rounded up with probability (x - down) / (up - down): 16 uniform
    random bits added to the fp32 bit pattern below bf16's mantissa, then those bits cut."""
    bits = x.float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, generator=generator, device=x.device,
                          dtype=torch.int32)
    return ((bits + noise) & -(1 << 16)).view(torch.float32).to(torch.bfloat16)


@torch.no_grad()
def sparse_sgd_sr_(table: torch.Tensor, copy: None, rows: torch.Tensor, grads: torch.Tensor,
                   lr: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """``fused_sgd.sparse_sgd_``'s contract for a bf16 ``table`` without a copy: each distinct
    row ``r >= 0`` of ``rows`` becomes ``stochastic_round(table[r] - lr * sum(its grads))``,
    the sum in fp32; negative rows are skipped with their gradients."""
    if copy is not None:
        raise ValueError("bf16 tables have no low-precision copy")
    keep = rows >= 0
    distinct, which = torch.unique(rows[keep], return_inverse=True)
    flat = grads.reshape(-1, grads.shape[-1])[keep]
    total = torch.zeros(distinct.numel(), flat.shape[1], device=flat.device)
    total.index_add_(0, which, flat.float())
    table[distinct] = stochastic_round(table[distinct].float() - lr * total, generator)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def run_sgd_kernel(table_ptr, grad_ptr, order_ptr, starts_ptr, rows_ptr, lr_ptr, seed_ptr,
                       runs, dim, group, group_stride, RUNS: tl.constexpr, DIM: tl.constexpr):
        r = tl.program_id(0) * RUNS + tl.arange(0, RUNS)
        start = tl.load(starts_ptr + r, mask=r < runs, other=0)
        length = tl.load(starts_ptr + r + 1, mask=r < runs, other=0) - start   # 0: padding
        if tl.max(length) > 0:   # padding's blocks (most of them: one run a lookup) stop here
            d = tl.arange(0, DIM)
            total = tl.zeros([RUNS, DIM], dtype=tl.float32)
            for j in range(0, tl.max(length)):   # the block's runs side by side, a lookup each
                pos = tl.load(order_ptr + start + j, mask=j < length, other=0).to(tl.int64)
                at = (pos // group) * group_stride + (pos % group) * dim   # vector_groups'
                g = tl.load(grad_ptr + at[:, None] + d[None, :],
                            mask=(j < length)[:, None] & (d < dim)[None, :], other=0.0)
                total += g.to(tl.float32)
            inside = (length > 0)[:, None] & (d < dim)[None, :]
            row = tl.load(rows_ptr + r, mask=r < runs, other=0).to(tl.int64)
            at = row[:, None] * dim + d[None, :]
            w = tl.load(table_ptr + at, mask=inside, other=0.0).to(tl.float32)
            new = w - tl.load(lr_ptr) * total
            # Philox gives four 32-bit words a call: 16 bits of each rounds one value
            q = r[:, None] * (DIM // 4) + tl.arange(0, DIM // 4)[None, :]
            b0, b1, b2, b3 = tl.randint4x(tl.load(seed_ptr), q)
            noise = tl.reshape(tl.join(tl.join(b0, b1), tl.join(b2, b3)), [RUNS, DIM]) & 0xFFFF
            bits = ((new.to(tl.uint32, bitcast=True) + noise) >> 16) << 16
            tl.store(table_ptr + at, bits.to(tl.float32, bitcast=True).to(tl.bfloat16),
                     mask=inside)

    return run_sgd_kernel


@torch.no_grad()
def run_sgd_(table: torch.Tensor, grads: torch.Tensor, plan: dict[str, torch.Tensor],
             lr: torch.Tensor, seed: torch.Tensor) -> None:
    """:func:`sparse_sgd_sr_` over the plan's runs (each a distinct row of ``table`` and the
    positions of its gradients in ``grads``, read where :func:`sparse_triton.vector_groups`
    can), the random bits Philox's at ``seed`` (a device int64, advanced by one here)."""
    import triton

    from benchmarks.dlrm.sparse_triton import vector_groups

    runs, dim = plan["run_rows"].numel(), table.shape[1]
    DIM = max(4, triton.next_power_of_2(dim))   # randint4x: four values a call
    if runs * DIM >= 2**31:
        raise ValueError(f"{runs} runs of {dim} values exceed Philox's 32-bit offsets")
    if runs:
        grads = vector_groups(grads)
        _kernel()[(triton.cdiv(runs, RUNS),)](
            table, grads, plan["run_order"], plan["run_starts"], plan["run_rows"], lr, seed,
            runs, dim, grads.shape[1], grads.stride(0), RUNS=RUNS, DIM=DIM)
    seed.add_(1)
