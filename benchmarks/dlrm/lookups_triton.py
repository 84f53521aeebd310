"""Hybrid embeddings' lookups and frequent-row gradient in Triton kernels (``fused-lookups``),
applied to a :class:`benchmarks.dlrm.hybrid.HybridEmbedding`, whose methods stay the reference.

The reference gathers the frequent and the rare vectors apart, then scatters both into a
zeroed [lookups, d] output (``index_copy``, which clones it twice); backward gathers the output's
gradient back at both sets of positions and adds the frequent ones into their rows with atomic
``index_add_``, where a power-law batch sends thousands of lookups to its hottest rows. Here:

- the index plan carries ``code``, one int per lookup position: a frequent row ``r >= 0``, or
  ``-1 - j``: rare vector ``j`` (on one rank the rare table's row, on several the received
  vector), so one kernel writes each output row once from wherever it lives;
- backward keeps the output's gradient as it is: the rare update reads its rows in place
  (``rare_grad``'s ``at``), and the frequent gradient is summed by a kernel over the frequent
  lookups sorted by row, cut into chunks of at most ``CHUNK`` of one row, one atomic add a chunk
  and dimension (a GPU test against the reference; fp32 sums in another order).

On several ranks the rare vectors still travel by the reference's all-to-alls.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.distributed as dist

from benchmarks.dlrm.hybrid import HybridEmbedding, Plan

LOOKUPS = 16   # output rows a program
CHUNK = 32     # sorted frequent lookups a program at most (one row's)


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def lookup_kernel(out_ptr, code_ptr, freq_ptr, rare_ptr, n, dim, LOOKUPS: tl.constexpr,
                      DIM: tl.constexpr):
        p = tl.program_id(0).to(tl.int64) * LOOKUPS + tl.arange(0, LOOKUPS)
        d = tl.arange(0, DIM)
        inside = (p < n)[:, None] & (d < dim)[None, :]
        code = tl.load(code_ptr + p, mask=p < n, other=0).to(tl.int64)
        frequent = (code >= 0)[:, None]
        f = tl.load(freq_ptr + code[:, None] * dim + d[None, :], mask=inside & frequent)
        r = tl.load(rare_ptr + (-1 - code)[:, None] * dim + d[None, :],
                    mask=inside & ~frequent)
        tl.store(out_ptr + p[:, None] * dim + d[None, :], tl.where(frequent, f, r), mask=inside)

    @triton.jit
    def chunk_sum_kernel(grad_ptr, out_grad_ptr, order_ptr, starts_ptr, rows_ptr, dim,
                         CHUNK: tl.constexpr, DIM: tl.constexpr):
        c = tl.program_id(0)
        start, stop = tl.load(starts_ptr + c), tl.load(starts_ptr + c + 1)
        k = start + tl.arange(0, CHUNK)
        d = tl.arange(0, DIM)
        pos = tl.load(order_ptr + k, mask=k < stop, other=0).to(tl.int64)
        g = tl.load(out_grad_ptr + pos[:, None] * dim + d[None, :],
                    mask=(k < stop)[:, None] & (d < dim)[None, :], other=0.0)
        row = tl.load(rows_ptr + c).to(tl.int64)
        tl.atomic_add(grad_ptr + row * dim + d, tl.sum(g.to(tl.float32), axis=0),
                      mask=d < dim, sem="relaxed")

    return lookup_kernel, chunk_sum_kernel


def plan_extra(plan: Plan, world: int) -> dict[str, torch.Tensor]:
    """``code`` (see the module doc) and the frequent lookups' chunks: ``freq_order`` (their
    positions sorted by row), ``chunk_starts`` (each chunk's first index into it, then the
    count) and ``chunk_rows``."""
    n = plan.freq_pos.numel() + plan.recv_pos.numel()   # every lookup is one or the other
    dev = plan.freq_pos.device
    code = torch.empty(n, dtype=torch.int64, device=dev)
    code[plan.freq_pos] = plan.freq_rows
    rare = plan.serve_rows if world == 1 else torch.arange(plan.recv_pos.numel(), device=dev)
    code[plan.recv_pos] = -1 - rare
    rows, perm = torch.sort(plan.freq_rows, stable=True)
    k = torch.arange(rows.numel(), device=dev)
    new_row = torch.ones_like(rows, dtype=torch.bool)
    new_row[1:] = rows[1:] != rows[:-1]
    run_start = torch.cummax(torch.where(new_row, k, 0), 0).values
    starts = torch.nonzero(new_row | ((k - run_start) % CHUNK == 0)).squeeze(1)
    return {"code": code, "freq_order": plan.freq_pos[perm],
            "chunk_starts": torch.cat([starts, k.new_tensor([rows.numel()])]),
            "chunk_rows": rows[starts]}


class _Lookup(torch.autograd.Function):
    """The output from ``code``; backward hands the output's gradient to ``owner`` (and on
    several ranks starts sending the rare vectors' gradients home). ``anchor``, an empty leaf
    that requires grad, links the output into autograd; it gets no gradient."""

    @staticmethod
    def forward(ctx, anchor, code, freq_src, rare_src, owner):
        import triton

        ctx.owner = owner
        n, dim = code.numel(), freq_src.shape[1]
        out = freq_src.new_empty(n, dim)
        if n:
            _kernels()[0][(triton.cdiv(n, LOOKUPS),)](
                out, code, freq_src, rare_src, n, dim, LOOKUPS=LOOKUPS,
                DIM=triton.next_power_of_2(dim))
        return out

    @staticmethod
    def backward(ctx, grad):
        owner = ctx.owner
        owner._out_grad = grad = grad.contiguous()
        if owner.world > 1:
            plan = owner._plan
            home = grad.new_empty(sum(plan.send_counts), grad.shape[1])
            work = dist.all_to_all_single(home, grad[plan.recv_pos], plan.send_counts,
                                          plan.recv_counts, async_op=True)
            owner._returning = home, work
        return None, None, None, None, None


def _plan(self, sparse: torch.Tensor, bounds: list[int]) -> Plan:
    plan = HybridEmbedding.plan(self, sparse, bounds)
    plan.extra.update(plan_extra(plan, self.world))
    return plan


def _forward(self, plan: Plan, overlap=None):
    freq_src = self.freq_weight if self.freq_lp is None else self.freq_lp
    rare_src = self.rare_weight if self.rare_lp is None else self.rare_lp
    work = None
    if self.world > 1:
        send = rare_src[plan.serve_rows]
        rare_src = send.new_empty(sum(plan.recv_counts), self.dim)
        work = dist.all_to_all_single(rare_src, send, plan.recv_counts, plan.send_counts,
                                      async_op=True)
    extra = overlap() if overlap is not None else None
    if work is not None:
        work.wait()
    self._plan, self._out_grad, self._returning = plan, None, None
    out = _Lookup.apply(self._anchor, plan.extra["code"], freq_src, rare_src.contiguous(), self)
    return out.view(plan.local_batch, len(self.sizes), self.dim), extra


def _frequent_grad(self) -> torch.Tensor:
    import triton

    grad = torch.zeros_like(self.freq_weight)
    extra, dim = self._plan.extra, self.dim
    chunks = extra["chunk_rows"].numel()
    if chunks:
        _kernels()[1][(chunks,)](grad, self._out_grad, extra["freq_order"],
                                 extra["chunk_starts"], extra["chunk_rows"], dim,
                                 CHUNK=CHUNK, DIM=triton.next_power_of_2(dim))
    return grad


def _rare_grad(self):
    if self._returning is None:
        return self._plan.serve_rows, self._out_grad, self._plan.recv_pos
    return self._plan.serve_rows, self.returned(), None


def apply(emb: HybridEmbedding) -> None:
    """Give ``emb`` the fused plan, lookups and gradients (see the module doc)."""
    emb._anchor = torch.empty(0, device=emb.freq_weight.device, requires_grad=True)
    emb._out_grad = None
    for name, fn in (("plan", _plan), ("forward", _forward), ("frequent_grad", _frequent_grad),
                     ("rare_grad", _rare_grad)):
        setattr(emb, name, types.MethodType(fn, emb))
