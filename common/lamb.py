"""LAMB (You et al., 2019) as the MLPerf BERT reference runs it, plain and sharded.

Per step: gradients clipped by their global norm (``max_grad_norm``), Adam
moments with bias correction, update ``u = m_hat / (sqrt(v_hat) + eps) + wd * w``,
and for weight-decayed tensors the layer-wise trust ratio ``|w| / |u|``
(1 when either norm is 0, and for the tensors excluded from weight decay).

``Lamb`` is the plain per-tensor reference. ``ShardedLamb`` runs the same
maths on a ``FlatParameters`` buffer: one gradient reduce-scatter (the
1/world_size folded into the collective), each rank updating only its shard
of the fp32 master weights with whole-shard and multi-tensor
(``torch._foreach_*``) kernels, per-tensor norms completed by one small
all-reduce, then one all-gather of the model's (possibly bf16) weights.
Learning rate and step count are device tensors, so a step is CUDA-graph
capturable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.flat_params import FlatParameters
from common.norms import stacked_norms


@dataclass(frozen=True)
class LambHyper:
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0


def clip_coef(sq_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The factor that clips gradients of squared global norm ``sq_norm`` to ``max_norm``;
    1 for ``max_norm`` inf (no clipping)."""
    if math.isinf(max_norm):
        return torch.ones_like(sq_norm)
    return max_norm / sq_norm.sqrt().clamp(min=max_norm)


class Lamb:
    """The reference: one tensor at a time, gradients already averaged across ranks."""

    def __init__(self, params: list[torch.Tensor], decay: list[bool], h: LambHyper):
        self.params, self.decay, self.h = params, decay, h
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = torch.zeros((), device=params[0].device)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, lr: torch.Tensor) -> None:
        h = self.h
        self.t += 1
        bc1, bc2 = 1 - h.beta1 ** self.t, 1 - h.beta2 ** self.t
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        clip = clip_coef(sum(g.float().pow(2).sum() for g in grads), h.max_grad_norm)
        for p, g, m, v, decay in zip(self.params, grads, self.m, self.v, self.decay):
            g = g * clip
            m.mul_(h.beta1).add_(g, alpha=1 - h.beta1)
            v.mul_(h.beta2).addcmul_(g, g, value=1 - h.beta2)
            u = (m / bc1) / ((v / bc2).sqrt() + h.eps)
            ratio = torch.ones((), device=p.device)
            if decay:
                u = u + h.weight_decay * p
                wn, un = p.norm(), u.norm()
                ratio = torch.where((wn > 0) & (un > 0), wn / un, ratio)
            p.sub_(lr * ratio * u)


class ShardedLamb:
    """LAMB on this rank's shard of a flat buffer (ZeRO stage 1/2 style).

    ``flat`` must have been built with ``world_size`` = the number of shards
    (``world_size`` when ``sharded``, else 1: every rank then updates the whole
    buffer after one gradient all-reduce).
    """

    def __init__(self, flat: FlatParameters, decay: list[bool], h: LambHyper,
                 rank: int = 0, world_size: int = 1, sharded: bool = True):
        shards = world_size if sharded else 1
        if flat.world_size != shards:
            raise ValueError(f"flat buffer has {flat.world_size} shards, LAMB needs {shards}")
        self.flat, self.h = flat, h
        self.world_size, self.sharded = world_size, sharded and world_size > 1
        self.rank = rank if sharded else 0
        dev = flat.data.device
        pieces = flat.pieces(self.rank)
        lengths = [p.length for p in pieces]
        owner = [p.param for p in pieces]
        pad = flat.shard_size - sum(lengths)
        if pad:  # the zero padding at the end of the buffer: a pseudo-tensor with no decay
            lengths.append(pad)
            owner.append(len(flat.params))
        self.lengths = lengths
        self.owner = torch.tensor(owner, device=dev)
        self.decay = torch.tensor(list(decay) + [False], device=dev)
        self.m = torch.zeros(flat.shard_size, device=dev)
        self.v = torch.zeros(flat.shard_size, device=dev)
        self.t = torch.zeros((), device=dev)
        self.grad_shard = (torch.zeros(flat.shard_size, dtype=flat.grad.dtype, device=dev)
                           if self.sharded else None)
        self._nccl = dist.is_initialized() and dist.get_backend() == "nccl"
        self._prepare_update()

    def _prepare_update(self) -> None:
        """What ``_update`` needs beside the state: each element's weight decay."""
        self.wd = (self.decay[self.owner].float() * self.h.weight_decay).repeat_interleave(
            torch.tensor(self.lengths, device=self.m.device), output_size=self.flat.shard_size)

    def zero_grad(self) -> None:
        self.flat.zero_grad()

    def _reduce_gradients(self) -> torch.Tensor:
        """Average the local gradients across ranks; returns this rank's shard of the mean."""
        g = self.flat.grad
        if self.world_size == 1:
            return g
        if self._nccl:
            op = dist.ReduceOp.AVG  # NCCL folds the 1/world_size into the reduction
        else:
            g.mul_(1.0 / self.world_size)  # gloo has no averaging reduction
            op = dist.ReduceOp.SUM
        if not self.sharded:
            dist.all_reduce(g, op=op)
            return g
        if self._nccl:
            dist.reduce_scatter_tensor(self.grad_shard, g, op=op)
        else:  # gloo lacks reduce-scatter: reduce everything, keep this rank's part
            dist.all_reduce(g, op=op)
            self.grad_shard.copy_(self.flat.shard(g, self.rank))
        return self.grad_shard

    @torch.no_grad()
    def step(self, lr: torch.Tensor) -> None:
        g = self._reduce_gradients()
        w = self.flat.shard(self.flat.master, self.rank)   # fp32
        sq = torch.linalg.vector_norm(g, dtype=torch.float32).square()
        if self.sharded:
            dist.all_reduce(sq)
        self.t += 1
        self._update(g, w, clip_coef(sq, self.h.max_grad_norm), lr)
        if self.sharded:
            mine = self.flat.shard(self.flat.data, self.rank)
            src = mine if self._nccl else mine.clone()  # NCCL gathers in place
            dist.all_gather_into_tensor(self.flat.data, src)

    def _update(self, g: torch.Tensor, w: torch.Tensor, clip: torch.Tensor,
                lr: torch.Tensor) -> None:
        """Moments and the fp32 master shard ``w`` from the gradient shard ``g``, then the
        model's copy of the shard."""
        h = self.h
        g = g.float() * clip
        bc1, bc2 = 1 - h.beta1 ** self.t, 1 - h.beta2 ** self.t
        self.m.mul_(h.beta1).add_(g, alpha=1 - h.beta1)
        self.v.mul_(h.beta2).addcmul_(g, g, value=1 - h.beta2)
        u = (self.m / bc1).div_((self.v / bc2).sqrt_().add_(h.eps)).addcmul_(self.wd, w)
        norms = torch.stack([stacked_norms(list(x.split(self.lengths))) for x in (w, u)], 1).pow(2)
        # each piece of u times its tensor's lr * trust ratio (device scalars), then one update
        torch._foreach_mul_(u.split(self.lengths),
                            list((self._trust_ratios(norms)[self.owner] * lr).unbind()))
        w.sub_(u)
        mine = self.flat.shard(self.flat.data, self.rank)
        if self.flat.data is not self.flat.master:
            mine.copy_(w)   # the model's low-precision copy of the updated shard

    def _trust_ratios(self, pieces: torch.Tensor) -> torch.Tensor:
        """Each tensor's ``|w| / |u|`` (1 where either is 0 or without weight decay) from the
        sums of squares of this shard's pieces, ``[pieces, 2]``, completed over the shards."""
        sums = torch.zeros(len(self.decay), 2, device=pieces.device).index_add_(
            0, self.owner, pieces)
        if self.sharded:
            dist.all_reduce(sums)
        wn, un = sums.sqrt().unbind(1)
        return torch.where(self.decay & (wn > 0) & (un > 0), wn / un, 1.0)
