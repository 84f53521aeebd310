"""Hybrid embeddings' lookups and frequent-row gradient in Triton kernels (``fused-lookups``),
applied to a :class:`benchmarks.dlrm.hybrid.HybridEmbedding`, whose methods stay the reference.

The reference gathers the frequent and the rare vectors apart, then scatters both into a
zeroed [lookups, d] output (``index_copy``, which clones it twice); backward gathers the output's
gradient back at both sets of positions and adds the frequent ones into their rows with atomic
``index_add_``, where a power-law batch sends thousands of lookups to its hottest rows. Here:

- the index plan carries ``code``, one int per lookup position: a frequent row ``r >= 0``, or
  ``-1 - j``: rare vector ``j`` (on one rank the rare table's row, on several the received
  vector), so one kernel writes each output row once from wherever it lives;
- backward keeps the output's gradient as it is, [B, T, d] with any batch stride: the
  interaction's backward hands over a slice of its [B, T + 1 (+ padding), d] gradient, which
  a flat [B * T, d] view would copy (0.21 ms of a 3.4 ms two-rank step). On one rank the rare
  update (``triton-sparse-sgd``) reads it in place through every lookup's rare row (-1 where
  frequent); the frequent gradient is summed by a kernel over the frequent lookups sorted by
  row, cut into chunks of at most ``CHUNK`` of one row, one atomic add a chunk and dimension
  (a test against the reference; fp32 sums in another order).

Every tensor of the plan has a size fixed by the batch (the chunks padded to
:func:`chunk_capacity`), and the step has no host sync: it may be one CUDA graph
(``cuda-graph``). On several ranks the rare vectors travel by all-to-alls of equal splits:
each pair of ranks exchanges :func:`exchange_capacity` rows, the batch's largest pair count
rounded up a ladder of 8 sizes a doubling (at most 9% padding), the same on every rank (each
plans the whole global batch); a padded row is served as zeros (never read back) and its
gradient, sent home with the rest, is skipped by ``triton-sparse-sgd``. A run
meets a few capacities, one graph each; the reference's all-to-alls send only what is
looked up, in sizes that change with every batch.
"""

from __future__ import annotations

import functools
import math
import types

import torch
import torch.distributed as dist

from benchmarks.dlrm.hybrid import HybridEmbedding
from benchmarks.dlrm.sparse_triton import vector_groups

LOOKUPS = 16   # output rows a program
CHUNK = 32     # sorted frequent lookups a program at most (one row's)
LADDER = 8     # exchange capacities a doubling


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

    # launched with one warp: a chunk's [CHUNK, DIM] sum then needs no reduction across warps
    # (0.10 ms against four warps' 0.34 ms at 27,648 samples on an H200)
    @triton.jit
    def chunk_sum_kernel(grad_ptr, out_grad_ptr, order_ptr, starts_ptr, rows_ptr, dim, group,
                         group_stride, CHUNK: tl.constexpr, DIM: tl.constexpr):
        c = tl.program_id(0)
        start, stop = tl.load(starts_ptr + c), tl.load(starts_ptr + c + 1)   # empty: padding
        k = start + tl.arange(0, CHUNK)
        d = tl.arange(0, DIM)
        pos = tl.load(order_ptr + k, mask=k < stop, other=0).to(tl.int64)
        at = (pos // group) * group_stride + (pos % group) * dim   # sparse_triton.vector_groups
        g = tl.load(out_grad_ptr + at[:, None] + d[None, :],
                    mask=(k < stop)[:, None] & (d < dim)[None, :], other=0.0)
        row = tl.load(rows_ptr + c).to(tl.int64)
        tl.atomic_add(grad_ptr + row * dim + d, tl.sum(g.to(tl.float32), axis=0),
                      mask=(d < dim) & (d * 0 + start < stop), sem="relaxed")

    @triton.jit
    def gather_kernel(out_ptr, src_ptr, idx_ptr, n, dim, group, group_stride,
                      LOOKUPS: tl.constexpr, DIM: tl.constexpr):
        p = tl.program_id(0).to(tl.int64) * LOOKUPS + tl.arange(0, LOOKUPS)
        d = tl.arange(0, DIM)
        i = tl.load(idx_ptr + p, mask=p < n, other=-1).to(tl.int64)
        at = (i // group) * group_stride + (i % group) * dim   # sparse_triton.vector_groups
        v = tl.load(src_ptr + at[:, None] + d[None, :],
                    mask=(i >= 0)[:, None] & (d < dim)[None, :], other=0.0)
        tl.store(out_ptr + p[:, None] * dim + d[None, :], v,
                 mask=(p < n)[:, None] & (d < dim)[None, :])

    return lookup_kernel, chunk_sum_kernel, gather_kernel


def chunk_capacity(frequent_rows: int, lookups: int) -> int:
    """The most chunks ``lookups`` frequent lookups over ``frequent_rows`` rows can make: a
    row's run of L lookups is ceil(L / CHUNK) <= L / CHUNK + 1 chunks."""
    return min(lookups, frequent_rows + -(-lookups // CHUNK))


def gather_vectors(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``src``'s vectors at ``idx`` as [n, d], zeros where ``idx`` < 0: ``src`` a [rows, d]
    table or a [B, T, d] gradient read in place (:func:`vector_groups`' positions). The
    exchange's gathers, where ATen's indexing took 0.06 and 0.05 ms of a two-rank step."""
    import triton

    src = vector_groups(src)
    n, dim = idx.numel(), src.shape[-1]
    out = src.new_empty(n, dim)
    if n:
        _kernels()[2][(triton.cdiv(n, LOOKUPS),)](
            out, src, idx, n, dim, src.shape[1], src.stride(0), LOOKUPS=LOOKUPS,
            DIM=triton.next_power_of_2(dim))
    return out


def run_starts(new_row: torch.Tensor) -> torch.Tensor:
    """For each position of a sorted sequence (``new_row``: where a run of equal values
    begins, True at 0), the position its run begins at: ``cummax`` of the starts, as the
    starts' positions indexed by a cumulative sum (ATen's cummax over int64 is a slow
    single-pass scan: 1.31 ms for a batch's 1.4M lookups on an H200; a scatter with ``amax``
    took 0.18 ms). ``nonzero`` waits for the device, as the plan's caller already does."""
    return torch.nonzero(new_row).squeeze(1)[torch.cumsum(new_row, 0) - 1]


def _sorted(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``keys`` (table rows: below 2^31, as ``apply`` checks) sorted (stable) as int32, their
    positions, and where each value's run begins. A 32-bit radix sort makes half the passes
    of a 64-bit one: a one-rank plan's kernels at 55,296 took 0.33 ms on an H200, 0.43 ms with
    int64 keys (the sort 0.16 ms of them)."""
    rows, order = torch.sort(keys.int(), stable=True)
    new_row = torch.ones_like(rows, dtype=torch.bool)
    new_row[1:] = rows[1:] != rows[:-1]
    return rows, order, new_row


def _padded(first: torch.Tensor, rows: torch.Tensor, cap: int, end
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs beginning at sorted positions ``first`` (at most ``cap``), padded to ``cap`` with
    empty ones: each one's first position, then ``end`` (an int or a 0-dim tensor) to the
    last of ``cap + 1``; and each one's row of ``rows``, 0 for padding."""
    starts = first.new_empty(cap + 1).fill_(end)
    starts[:first.numel()] = first
    padded_rows = rows.new_zeros(cap)
    padded_rows[:first.numel()] = rows[first]
    return starts, padded_rows


def _chunks(code: torch.Tensor, frequent_rows: int, runs: bool = False
            ) -> dict[str, torch.Tensor]:
    """The chunks of ``code``'s frequent lookups, padded to :func:`chunk_capacity` (empty
    chunks): ``freq_order`` (positions sorted by row, the rare ones last; with ``runs`` by
    ``-1 - code``), ``chunk_starts`` (each chunk's first index into it, then the frequent
    count) and ``chunk_rows``; with ``runs`` (one rank, ``bf16-tables``) the rare rows'
    :func:`_runs`."""
    n = code.numel()
    rare_key = frequent_rows - 1 - code if runs else frequent_rows   # runs: by rare row
    rows, order, new_row = _sorted(torch.where(code >= 0, code, rare_key))
    k = torch.arange(n, device=rows.device)
    run_start = run_starts(new_row)
    first = torch.nonzero((new_row | ((k - run_start) % CHUNK == 0))
                          & (rows < frequent_rows)).squeeze(1)
    starts, chunk_rows = _padded(first, rows, chunk_capacity(frequent_rows, n),
                                 end=(rows < frequent_rows).sum())   # the frequent count
    out = {"freq_order": order, "chunk_starts": starts, "chunk_rows": chunk_rows}
    if runs:   # a rare lookup's row, -1 - code, is its key less the frequent rows
        out |= _runs(rows - frequent_rows, order, new_row)
    return out


def _runs(rows: torch.Tensor, order: torch.Tensor, new_row: torch.Tensor
          ) -> dict[str, torch.Tensor]:
    """The runs of equal rows >= 0 in sorted ``rows`` (negatives first; ``order``: their
    positions, ``new_row``: where a value begins), padded to one a position (empty runs):
    ``run_order``, ``run_starts`` (each run's first index into it, then the end) and
    ``run_rows`` (``bf16_tables.run_sgd_``'s)."""
    n = rows.numel()
    starts, run_rows = _padded(torch.nonzero(new_row & (rows >= 0)).squeeze(1), rows, n, end=n)
    return {"run_order": order, "run_starts": starts, "run_rows": run_rows}


def one_rank_plan(emb: HybridEmbedding, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """One rank's plan for ids [B, T] on the tables' device, every tensor's size fixed by B
    (so a step may be one CUDA graph): ``code`` (see the module doc: a rare lookup's row is its
    global row), ``rare_rows`` (each lookup's rare row, -1 for a frequent one) and the
    frequent lookups' chunks (:func:`_chunks`)."""
    flat = (ids.to(emb.freq_map.device, non_blocking=True) + emb.offsets).reshape(-1)
    row = emb.freq_map[flat].long()
    frequent = row >= 0
    code = torch.where(frequent, row, -1 - flat)
    return {"code": code, "rare_rows": torch.where(frequent, -1, flat),
            **_chunks(code, emb.freq_weight.shape[0], runs=getattr(emb, "plan_runs", False))}


def exchange_capacity(count: int) -> int:
    """The rows each pair of ranks exchanges for a batch whose largest pair sends ``count``:
    the next size of the ladder 8 * ceil(2^(k / LADDER) / 8)."""
    if count <= 8:
        return 8
    size = 2 ** (math.ceil(LADDER * math.log2(count) - 1e-9) / LADDER)
    return 8 * math.ceil(size / 8)


def several_rank_plan(emb: HybridEmbedding, ids: torch.Tensor, bounds: list[int]
                      ) -> dict[str, torch.Tensor]:
    """On several ranks, this rank's plan for the global batch ids [B, T], every size fixed by
    its slice and the exchange's capacity C (:func:`exchange_capacity`): ``code`` (a rare
    lookup's is its slot in the received [world * C] vectors: owner * C + its order among the
    owner's lookups for this rank), ``slot_pos`` (each slot's lookup position, 0 where
    padding), ``serve_rows`` (the shard row each slot sent to rank slot // C asks for, -1
    where padding) and the frequent lookups' chunks. The capacity comes to the host (the
    plan is computed ahead of the step)."""
    dev, world, rank, T = emb.freq_map.device, emb.world, emb.rank, len(emb.sizes)
    flat = (ids.to(dev, non_blocking=True) + emb.offsets).reshape(-1)   # global rows
    row = emb.freq_map[flat].long()
    rare = torch.nonzero(row < 0).squeeze(1)                            # positions, ascending
    dest = torch.searchsorted(torch.tensor(bounds[1:], device=dev) * T, rare, right=True)
    pair = (flat[rare] % world) * world + dest                          # owner * world + dest
    counts = torch.bincount(pair, minlength=world * world)
    cap = exchange_capacity(int(counts.max()))
    order = torch.argsort(pair, stable=True)
    pos, pair = rare[order], pair[order]
    nth = torch.arange(pos.numel(), device=dev) - (torch.cumsum(counts, 0) - counts)[pair]
    start, stop = bounds[rank] * T, bounds[rank + 1] * T
    code = row[start:stop].clone()
    mine = pair % world == rank
    slot, local = (pair[mine] // world) * cap + nth[mine], pos[mine] - start
    code[local] = -1 - slot
    slot_pos = torch.zeros(world * cap, dtype=torch.int64, device=dev)
    slot_pos[slot] = local
    served = pair // world == rank
    serve_rows = torch.full((world * cap,), -1, dtype=torch.int64, device=dev)
    serve_rows[(pair[served] % world) * cap + nth[served]] = flat[pos[served]] // world
    plan = {"code": code, "slot_pos": slot_pos, "serve_rows": serve_rows,
            **_chunks(code, emb.freq_weight.shape[0])}
    if getattr(emb, "plan_runs", False):   # the served rows' runs (bf16-tables), padding first
        plan |= _runs(*_sorted(serve_rows))
    return plan


class _Lookup(torch.autograd.Function):
    """The [B, T, d] output from ``code``; backward hands the output's gradient to ``owner``
    as it comes (and on several ranks starts sending the rare vectors' gradients home).
    ``anchor``, an empty leaf that requires grad, links the output into autograd; it gets no
    gradient."""

    @staticmethod
    def forward(ctx, anchor, code, freq_src, rare_src, owner):
        import triton

        ctx.owner = owner
        n, dim, tables = code.numel(), freq_src.shape[1], len(owner.sizes)
        out = freq_src.new_empty(n // tables, tables, dim)
        if n:
            _kernels()[0][(triton.cdiv(n, LOOKUPS),)](
                out, code, freq_src, rare_src, n, dim, LOOKUPS=LOOKUPS,
                DIM=triton.next_power_of_2(dim))
        return out

    @staticmethod
    def backward(ctx, grad):
        owner = ctx.owner
        owner._out_grad = grad = vector_groups(grad)   # in place where it can be
        if owner.world > 1:   # the received vectors' gradients, home to their owners
            sent = gather_vectors(grad, owner._plan["slot_pos"])
            home = torch.empty_like(sent)
            owner._returning = home, dist.all_to_all_single(home, sent, async_op=True)
        return None, None, None, None, None


def _plan(self, sparse: torch.Tensor, bounds: list[int]):
    if self.world == 1:
        return one_rank_plan(self, sparse)
    return several_rank_plan(self, sparse, bounds)


def _forward(self, plan, overlap=None):
    freq_src = self.freq_weight if self.freq_lp is None else self.freq_lp
    rare_src = self.rare_weight if self.rare_lp is None else self.rare_lp
    work = None
    if self.world > 1:
        send = gather_vectors(rare_src, plan["serve_rows"])   # padding (-1): zeros
        rare_src = torch.empty_like(send)
        work = dist.all_to_all_single(rare_src, send, async_op=True)
    extra = overlap() if overlap is not None else None
    if work is not None:
        work.wait()
    self._plan, self._out_grad, self._returning = plan, None, None
    return _Lookup.apply(self._anchor, plan["code"], freq_src, rare_src, self), extra


def _frequent_grad(self) -> torch.Tensor:
    import triton

    grad = torch.zeros_like(self.freq_weight)
    chunks = self._plan
    if chunks["chunk_rows"].numel():
        out_grad = self._out_grad   # vector_groups'
        _kernels()[1][(chunks["chunk_rows"].numel(),)](
            grad, out_grad, chunks["freq_order"], chunks["chunk_starts"],
            chunks["chunk_rows"], self.dim, out_grad.shape[1], out_grad.stride(0), CHUNK=CHUNK,
            DIM=triton.next_power_of_2(self.dim), num_warps=1)
    return grad


def _rare_rows(self, plan) -> torch.Tensor:
    """One rank: every lookup's rare row (-1 where frequent, which ``triton-sparse-sgd``
    skips); several: each served slot's row (-1 where padding)."""
    return plan["rare_rows"] if self.world == 1 else plan["serve_rows"]


def _rare_grad(self):
    """:func:`_rare_rows` and, on one rank, the output's gradient as it is; on several, the
    gradient sent home for each slot."""
    if self.world == 1:
        return self.rare_rows(self._plan), self._out_grad
    return self.rare_rows(self._plan), self.returned()


def apply(emb: HybridEmbedding) -> None:
    """Give ``emb`` the fused plan, lookups and gradients (see the module doc)."""
    if emb.freq_weight.shape[0] + sum(emb.sizes) >= 2**31:
        raise ValueError("fused-lookups sorts table rows as int32: tables of 2^31 rows or more")
    emb._anchor = torch.empty(0, device=emb.freq_weight.device, requires_grad=True)
    emb._out_grad, emb.plan_runs = None, False   # plan_runs: bf16-tables sets it
    for name, fn in (("plan", _plan), ("forward", _forward), ("frequent_grad", _frequent_grad),
                     ("rare_rows", _rare_rows), ("rare_grad", _rare_grad)):
        setattr(emb, name, types.MethodType(fn, emb))
