"""Spatial parallelism: one sample's volume split along depth over a group of ranks.

Each rank of a group holds a contiguous slab of depth slices of every
activation. ``spatial_parallel(model, group)`` returns a model that shares
the plain model's parameters and replaces

- every 3x3x3 convolution by ``HaloConv3d``: the neighbours' boundary slices
  (halos) are exchanged with point-to-point sends while the interior slices,
  which need no halo, are convolved; the boundary slices follow once the
  halos arrive. Backward sends the halos' gradients back the same way and
  overlaps that exchange with the weight-gradient convolution;
- every instance norm (+ ReLU) by ``SpatialInstanceNormReLU``: the per-channel
  mean and variance are reduced over the group, so they are the whole volume's.

Transposed 2x2x2 and 1x1x1 convolutions and the skip concatenation are
local. ``spatial_loss`` reduces the partial Dice sums and cross-entropy
terms over the group, which gives exactly the single-rank loss on every
rank. Each rank's parameter gradients are then its slab's share: their sum
over the group is the whole-volume gradient.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchmarks.unet3d import fused_norm
from benchmarks.unet3d import loss as losses
from benchmarks.unet3d.fused_norm import norm_relu, norm_sums, plain_views
from benchmarks.unet3d.model import InstanceNormReLU
from common.dist import summed_over_group
from common.fusion import compiled

DEPTH = 2  # the split axis of (N, C, D, H, W)


@dataclass(frozen=True)
class SpatialGroup:
    """The ranks that share one sample; ``index`` is this rank's slab (0 holds the front)."""

    group: dist.ProcessGroup | None
    ranks: tuple[int, ...]
    index: int

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def prev(self) -> int | None:
        return self.ranks[self.index - 1] if self.index > 0 else None

    @property
    def next(self) -> int | None:
        return self.ranks[self.index + 1] if self.index + 1 < self.size else None

    def slab(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's depth slab of a whole-volume tensor."""
        depth = t.shape[DEPTH]
        if depth % self.size:
            raise ValueError(f"depth {depth} does not split over {self.size} ranks")
        n = depth // self.size
        return t.narrow(DEPTH, self.index * n, n)


def new_spatial_group(size: int) -> SpatialGroup:
    """Groups of ``size`` consecutive ranks (collective: every rank must call it)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"spatial group size {size} does not divide {world} ranks")
    group, _ = dist.new_subgroups(group_size=size)
    first = rank - rank % size
    return SpatialGroup(group, tuple(range(first, first + size)), rank % size)


# -- collectives with the gradients the split needs -------------------------------------------
class _AllReduceReplicated(torch.autograd.Function):
    """Sum over the group whose consumers are identical on every rank (the loss): each rank's
    partial gets that one gradient, so backward is the identity."""

    @staticmethod
    def forward(ctx, t, group):
        out = t.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _exchange(sg: SpatialGroup, to_prev: torch.Tensor | None, to_next: torch.Tensor | None,
              from_prev: torch.Tensor | None, from_next: torch.Tensor | None) -> list:
    """Start the sends and receives with both neighbours; returns the requests to wait on.
    Messages travel as raw memory, so each is sent in the layout its receive buffer has."""
    ops = []
    if sg.prev is not None:
        if to_prev is not None and to_prev.shape[DEPTH]:
            ops.append(dist.P2POp(dist.isend, _packed(to_prev), sg.prev))
        if from_prev is not None and from_prev.shape[DEPTH]:
            ops.append(dist.P2POp(dist.irecv, from_prev, sg.prev))
    if sg.next is not None:
        if to_next is not None and to_next.shape[DEPTH]:
            ops.append(dist.P2POp(dist.isend, _packed(to_next), sg.next))
        if from_next is not None and from_next.shape[DEPTH]:
            ops.append(dist.P2POp(dist.irecv, from_next, sg.next))
    return dist.batch_isend_irecv(ops) if ops else []


def _wait(reqs: list) -> None:
    for r in reqs:
        r.wait()


def _layout(x: torch.Tensor) -> torch.memory_format:
    """channels_last_3d for an activation stored that way (its slices too: channels are the
    innermost dimension), else contiguous."""
    cl = x.shape[1] > 1 and x.stride(1) == 1
    return torch.channels_last_3d if cl else torch.contiguous_format


def _packed(x: torch.Tensor) -> torch.Tensor:
    """``x`` (a slab's edge slices) dense in its layout, as a message."""
    return x.contiguous(memory_format=_layout(x))


def _halo_like(x: torch.Tensor, n: int, neighbour: int | None) -> torch.Tensor:
    """``n`` depth slices shaped and laid out like ``x``: zeros (the padding) at a volume end,
    else an uninitialised buffer that the neighbour's message fills."""
    shape = list(x.shape)
    shape[DEPTH] = n
    out = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=_layout(x))
    return out.zero_() if neighbour is None else out


class _HaloConv(torch.autograd.Function):
    """3D convolution of a depth slab; kernel k, stride s, padding p on every axis.

    Halo widths: ``p`` slices before the slab and ``k - s - p`` after it, so the
    slab of L slices gives L / s output slices (zeros stand in at the volume ends).
    """

    @staticmethod
    def forward(ctx, x, weight, sg: SpatialGroup, k: int, s: int, p: int):
        dtype = torch.get_autocast_dtype(x.device.type) \
            if torch.is_autocast_enabled(x.device.type) else x.dtype
        ctx.in_dtypes = (x.dtype, weight.dtype)
        x, weight = x.to(dtype), weight.to(dtype)
        lo_w, hi_w = p, k - s - p
        length = x.shape[DEPTH]
        lo, hi = _halo_like(x, lo_w, sg.prev), _halo_like(x, hi_w, sg.next)
        reqs = _exchange(sg, x[:, :, :hi_w], x[:, :, length - lo_w:], lo, hi)

        def conv(t):
            return F.conv3d(t, weight, None, s, (0, p, p))

        n_out = (lo_w + length + hi_w - k) // s + 1
        first = math.ceil(lo_w / s)               # first output that needs no halo
        last = (length - k + lo_w) // s           # last output that needs no halo
        with torch.autocast(x.device.type, enabled=False):
            if first <= last:
                interior = conv(x[:, :, s * first - lo_w: s * last + k - lo_w])
                _wait(reqs)
                parts = [interior]
                if first > 0:
                    parts.insert(0, conv(torch.cat((lo, x[:, :, :s * (first - 1) + k - lo_w]),
                                                   DEPTH)))
                if last < n_out - 1:
                    parts.append(conv(torch.cat((x[:, :, s * (last + 1) - lo_w:], hi), DEPTH)))
                out = torch.cat(parts, DEPTH) if len(parts) > 1 else interior
            else:
                _wait(reqs)
                out = conv(torch.cat((lo, x, hi), DEPTH))
        ctx.save_for_backward(x, weight, lo, hi)
        ctx.sg, ctx.geometry = sg, (k, s, p)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, lo, hi = ctx.saved_tensors
        sg, (k, s, p) = ctx.sg, ctx.geometry
        lo_w, hi_w, length = p, k - s - p, x.shape[DEPTH]
        padded = torch.cat((lo, x, hi), DEPTH)
        grad = grad.to(x.dtype)
        args = (grad, padded, weight, None, [s] * 3, [0, p, p], [1] * 3, False, [0] * 3, 1)
        g_padded = torch.ops.aten.convolution_backward(*args, [True, False, False])[0]
        # The halos' gradients belong to the neighbours' edge slices.
        from_next = _halo_like(x, lo_w, sg.next)   # for my last lo_w slices
        from_prev = _halo_like(x, hi_w, sg.prev)   # for my first hi_w slices
        reqs = _exchange(sg, g_padded[:, :, :lo_w], g_padded[:, :, lo_w + length:],
                         from_prev, from_next)
        g_weight = torch.ops.aten.convolution_backward(*args, [False, True, False])[1]
        _wait(reqs)
        g_x = g_padded[:, :, lo_w:lo_w + length]
        if sg.next is not None and lo_w:
            g_x[:, :, length - lo_w:] += from_next
        if sg.prev is not None and hi_w:
            g_x[:, :, :hi_w] += from_prev
        x_dtype, w_dtype = ctx.in_dtypes
        return g_x.to(x_dtype), g_weight.to(w_dtype), None, None, None, None


class HaloConv3d(nn.Module):
    """A bias-free cubic ``nn.Conv3d`` on depth slabs; shares the plain module's weight."""

    def __init__(self, conv: nn.Conv3d, sg: SpatialGroup):
        super().__init__()
        k, s, p = conv.kernel_size[0], conv.stride[0], conv.padding[0]
        if conv.bias is not None or len({*conv.kernel_size}) > 1 or k - s - p < 0:
            raise ValueError(f"unsupported convolution for spatial parallelism: {conv}")
        self.weight = conv.weight
        self.sg, self.geometry = sg, (k, s, p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _HaloConv.apply(x, self.weight, self.sg, *self.geometry)


class SpatialInstanceNormReLU(nn.Module):
    """``InstanceNormReLU`` whose statistics cover the whole volume (equal slabs on every
    rank): one all-reduce of the per-channel sums and sums of squares."""

    kernel = staticmethod(lambda fn: fn)   # fused-norm's variant (FUSED): compiled

    def __init__(self, norm: InstanceNormReLU, sg: SpatialGroup):
        super().__init__()
        self.weight, self.bias, self.eps, self.sg = norm.weight, norm.bias, norm.eps, sg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x[0, 0].numel() * self.sg.size
        moments = summed_over_group(self.kernel(norm_sums)(x), self.sg.group) / n
        return self.kernel(norm_relu)(x, moments, *plain_views(self.weight, self.bias), self.eps)


class FusedSpatialInstanceNormReLU(SpatialInstanceNormReLU):
    kernel = staticmethod(compiled)


FUSED = {**fused_norm.FUSED, SpatialInstanceNormReLU: FusedSpatialInstanceNormReLU}


def spatial_parallel(module: nn.Module, sg: SpatialGroup) -> nn.Module:
    """A copy of ``module``'s structure that runs on depth slabs, sharing its parameters."""
    if isinstance(module, nn.Conv3d) and max(module.kernel_size) > 1:
        return HaloConv3d(module, sg)
    if isinstance(module, InstanceNormReLU):
        return SpatialInstanceNormReLU(module, sg)
    clone = copy.copy(module)
    clone._modules = {name: spatial_parallel(child, sg) if child is not None else None
                      for name, child in module._modules.items()}
    return clone


def spatial_loss(logits: torch.Tensor, labels: torch.Tensor, sg: SpatialGroup) -> torch.Tensor:
    """The whole-volume Dice + cross-entropy loss from this rank's slab (same on every rank)."""
    def reduce(t):
        return _AllReduceReplicated.apply(t, sg.group)
    return losses.dice_ce_loss(logits, labels, reduce, labels.numel() * sg.size)


def spatial_dice_score(logits: torch.Tensor, labels: torch.Tensor,
                       sg: SpatialGroup) -> torch.Tensor:
    def reduce(t):
        return _AllReduceReplicated.apply(t, sg.group)
    return losses.dice_score(logits, labels, reduce)
