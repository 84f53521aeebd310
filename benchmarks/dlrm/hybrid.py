"""Hybrid-parallel embeddings (NVIDIA's HugeCTR scheme for MLPerf DLRM, here in PyTorch).

All 26 tables are numbered as one global row space (``offset[t] + id``). Category statistics
pick the *frequent* rows: replicated on every rank, looked up locally and trained data-parallel
(their gradient is summed with the MLP's). Every other row is *rare*: row ``g`` lives only on
rank ``g % world`` (local row ``g // world``). Every rank reads the whole global batch's
category ids (as HugeCTR's readers do), so it knows without any communication which rare rows
it must serve to which rank: that index plan is computed ahead of the step (``compute_plan``),
and one all-to-all per direction moves the looked-up vectors forward and their gradients back.
Threshold 0 makes every row frequent (pure data parallel), ``inf`` every row rare (pure model
parallel). Gradients are those of the *sum* of all ranks' losses: rare-row gradients arrive at
their owner from every rank; frequent-row gradients must be all-reduced.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.distributed as dist

from benchmarks.dlrm.model import table_chunks


@dataclass
class Plan:
    """Which rows this rank looks up, serves and receives for one global batch."""

    local_batch: int
    freq_pos: torch.Tensor     # flat (sample * T + table) positions of local frequent lookups
    freq_rows: torch.Tensor    # their rows in the frequent table
    recv_pos: torch.Tensor     # local rare positions, grouped by owner rank (then position)
    recv_counts: list[int]     # rare vectors received from each rank
    serve_rows: torch.Tensor   # rows of this rank's shard to send, grouped by destination rank
    send_counts: list[int]     # vectors sent to each rank

    def to(self, device, non_blocking: bool = False) -> Plan:
        move = dict(device=device, non_blocking=non_blocking)
        return self._map(lambda t: t.to(**move))

    def pin_memory(self) -> Plan:
        return self._map(torch.Tensor.pin_memory)

    def tensors(self) -> list[torch.Tensor]:
        return [self.freq_pos, self.freq_rows, self.recv_pos, self.serve_rows]

    def _map(self, fn) -> Plan:
        freq_pos, freq_rows, recv_pos, serve_rows = map(fn, self.tensors())
        return Plan(self.local_batch, freq_pos, freq_rows, recv_pos, self.recv_counts,
                    serve_rows, self.send_counts)


def frequent_rows(sparse: torch.Tensor, sizes: list[int], threshold: float) -> torch.Tensor:
    """Global rows whose id occurs at least ``threshold`` times in ``sparse`` [N, T]."""
    offsets = table_offsets(sizes)
    picked = []
    for t, n in enumerate(sizes):
        counts = torch.bincount(sparse[:, t], minlength=n)
        picked.append(torch.nonzero(counts >= threshold).squeeze(1) + offsets[t])
    return torch.cat(picked)


def table_offsets(sizes: list[int]) -> list[int]:
    """Each table's first row in the global row space."""
    return [0, *accumulate(sizes[:-1])]


def compute_plan(sparse: torch.Tensor, bounds: list[int], rank: int, world: int,
                 offsets: torch.Tensor, freq_map: torch.Tensor) -> Plan:
    """The index plan of one global batch ``sparse`` [B, T], vectorised, on the device of
    ``sparse``, ``offsets`` and ``freq_map`` (the counts come back to the host).

    ``bounds`` are the sample offsets of each rank's slice; ``freq_map`` maps a
    global row to its frequent-table row or -1.
    """
    T = sparse.shape[1]
    flat_g = (sparse + offsets).reshape(-1)
    flat_f = freq_map[flat_g].long()
    s, e = bounds[rank] * T, bounds[rank + 1] * T
    local_f, local_g = flat_f[s:e], flat_g[s:e]
    freq_pos = torch.nonzero(local_f >= 0).squeeze(1)
    rare_pos = torch.nonzero(local_f < 0).squeeze(1)
    owner = local_g[rare_pos] % world
    recv_pos = rare_pos[torch.argsort(owner, stable=True)]
    rare_all = torch.nonzero(flat_f < 0).squeeze(1)          # ascending: grouped by destination
    mine = rare_all[flat_g[rare_all] % world == rank]
    dest = torch.searchsorted(torch.tensor(bounds[1:], device=mine.device) * T, mine,
                              right=True)
    return Plan(local_batch=bounds[rank + 1] - bounds[rank],
                freq_pos=freq_pos, freq_rows=local_f[freq_pos],
                recv_pos=recv_pos, recv_counts=torch.bincount(owner, minlength=world).tolist(),
                serve_rows=flat_g[mine] // world,
                send_counts=torch.bincount(dest, minlength=world).tolist())


class _Exchange(torch.autograd.Function):
    """Links the (already received) forward all-to-all into autograd; backward starts sending
    the gradients home and hands the exchange to ``owner`` (``HybridEmbedding``), so the rest
    of backward runs while it is in flight. ``send`` gets no ``.grad``: ``rare_grad`` waits."""

    @staticmethod
    def forward(ctx, send, received, send_counts, recv_counts, owner):
        ctx.counts, ctx.owner = (send_counts, recv_counts), owner
        return received

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts = ctx.counts
        out = grad.new_empty(sum(send_counts), grad.shape[1])
        work = dist.all_to_all_single(out, grad.contiguous(), send_counts, recv_counts,
                                      async_op=True)
        ctx.owner._returning = out, work
        return None, None, None, None, None


class HybridEmbedding(torch.nn.Module):
    """Frequent rows replicated, rare rows sharded by ``row % world``; see the module doc."""

    def __init__(self, sizes: list[int], dim: int, frequent: torch.Tensor, rank: int,
                 world: int, seed: int, device, chunks=table_chunks,
                 rare_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.sizes, self.dim, self.rank, self.world = list(sizes), dim, rank, world
        total = sum(sizes)
        self.offsets = torch.tensor(table_offsets(sizes))
        self.freq_map = torch.full((total,), -1, dtype=torch.int32)
        self.freq_map[frequent] = torch.arange(frequent.numel(), dtype=torch.int32)
        self.freq_weight = torch.zeros(frequent.numel(), dim, device=device)
        # rare_dtype bf16 (bf16-tables): the rows rounded as they are written, so no fp32
        # table of them is ever held
        self.rare_weight = torch.zeros(-(-(total - rank) // world), dim, device=device,
                                       dtype=rare_dtype)
        for t, n in enumerate(sizes):
            for start, rows in chunks(t, n, dim, seed, device):
                g = torch.arange(start, start + rows.shape[0]) + self.offsets[t]
                f = self.freq_map[g].long()
                keep = f >= 0
                self.freq_weight[f[keep].to(device)] = rows[keep.to(device)]
                own = (g % world) == rank
                self.rare_weight[(g[own] // world).to(device)] = rows[own.to(device)].to(
                    rare_dtype)
        # the index plans are computed where the tables are: about 1 ms a global batch of
        # 55,296 on a GPU, where one host thread takes tens of ms (gathers and sorts)
        self.offsets, self.freq_map = self.offsets.to(device), self.freq_map.to(device)
        self.freq_lp = self.rare_lp = None
        self._freq_vals = self._send = self._plan = self._returning = None

    def keep_low_precision(self, dtype: torch.dtype) -> None:
        """Lookups read a ``dtype`` copy of both tables from now on; the fp32 tables stay the
        masters, and whoever updates them refreshes the copy (``fused_sgd``). A table built in
        ``dtype`` (``rare_dtype``) is its own copy."""
        self.freq_lp, self.rare_lp = self.freq_weight.to(dtype), self.rare_weight.to(dtype)

    def plan(self, sparse: torch.Tensor, bounds: list[int]) -> Plan:
        """The plan of global batch ``sparse`` [B, T], on the tables' device (``sparse`` is
        moved there)."""
        return compute_plan(sparse.to(self.freq_map.device, non_blocking=True), bounds,
                            self.rank, self.world, self.offsets, self.freq_map)

    def forward(self, plan: Plan, overlap=None):
        """This rank's [b, T, d] lookups; ``overlap()`` and the frequent rows' lookups run
        while the all-to-all is in flight.

        Returns ``(lookups, overlap())``.
        """
        freq_src = self.freq_weight if self.freq_lp is None else self.freq_lp
        rare_src = self.rare_weight if self.rare_lp is None else self.rare_lp
        send = rare_src[plan.serve_rows].requires_grad_(torch.is_grad_enabled())
        received, work = send.detach(), None
        if self.world > 1:
            received = send.new_empty(sum(plan.recv_counts), self.dim)
            work = dist.all_to_all_single(received, send.detach(), plan.recv_counts,
                                          plan.send_counts, async_op=True)
        extra = overlap() if overlap is not None else None
        freq = freq_src[plan.freq_rows].requires_grad_(torch.is_grad_enabled())
        T = len(self.sizes)
        out = send.new_zeros(plan.local_batch * T, self.dim).index_copy(0, plan.freq_pos, freq)
        self._freq_vals, self._send, self._plan, self._returning = freq, send, plan, None
        if work is not None:
            work.wait()
            rare = _Exchange.apply(send, received, plan.send_counts, plan.recv_counts, self)
        else:
            rare = send
        out = out.index_copy(0, plan.recv_pos, rare)
        return out.view(plan.local_batch, T, self.dim), extra

    def frequent_grad(self) -> torch.Tensor:
        """This rank's fp32 gradient of the frequent table (to be summed over ranks)."""
        grad = torch.zeros_like(self.freq_weight)
        return grad.index_add_(0, self._plan.freq_rows, self._freq_vals.grad.float())

    def rare_rows(self, plan: Plan) -> torch.Tensor:
        """The rows of this rank's shard that a step on ``plan`` updates, one per served lookup
        (rows may repeat; negative ones are none)."""
        return plan.serve_rows

    def rare_grad(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, grads)`` of this rank's shard (:meth:`rare_rows`), the grads in the lookups'
        dtype; on several ranks, once backward's all-to-all has brought them home."""
        if self._returning is None:
            return self.rare_rows(self._plan), self._send.grad
        return self.rare_rows(self._plan), self.returned()

    def returned(self) -> torch.Tensor:
        """The rare rows' gradients that backward's all-to-all brought home."""
        grads, work = self._returning
        work.wait()
        self._returning = None
        return grads
