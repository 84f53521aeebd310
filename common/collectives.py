"""Differentiable collectives: autograd functions over ``torch.distributed``.

Kept apart from ``common.dist`` (process-group set-up, which converts a model's batch norms
with ``common.group_bn``), so that ``common.group_bn`` can use them without an import circle.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        out = t.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def summed_over_group(t: torch.Tensor, group=None) -> torch.Tensor:
    """The sum of ``t`` over ``group``'s ranks, differentiable for consumers that differ per
    rank: the backward sums every rank's output gradient into each rank's input gradient."""
    return _AllReduceSum.apply(t, group)
