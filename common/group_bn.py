"""Group batch norm: BN statistics over the batch of several ranks, on any backend.

The reference path, and the CPU's: on CUDA ``common.dist.group_norm_layers`` uses
``torch.nn.SyncBatchNorm`` (fused kernels, fp16 activations kept; docs/performance.md
measures both), which runs only on GPU-like devices. ``GroupBatchNorm2d`` combines its
ranks' per-channel count, mean and sum of squared deviations (fp32, or fp64 for fp64 inputs)
with one differentiable all-reduce, so the same layer trains on gloo (CPU, tests) and NCCL
(GPU). With a group of one rank it is ``nn.BatchNorm2d``. Ranks may hold different batch
sizes: the counts travel with the statistics.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from common.collectives import summed_over_group


class GroupBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` whose training statistics span ``group``'s ranks."""

    def __init__(self, num_features: int, group=None, **kwargs):
        super().__init__(num_features, **kwargs)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.group is None or dist.get_world_size(self.group) == 1:
            return super().forward(x)
        # each rank's (count, mean, sum of squared deviations) in its own row; summing the
        # rows over the group gathers them, and Chan's formula combines them (a one-pass
        # E[x^2] - E[x]^2 loses digits to cancellation)
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        c, dims = self.num_features, (0, 2, 3)
        count = x.numel() // c
        local_mean = xf.mean(dims)
        local_m2 = (xf - local_mean.view(1, c, 1, 1)).square().sum(dims)
        rows = xf.new_zeros(dist.get_world_size(self.group), 2 * c + 1)
        rows[dist.get_rank(self.group)] = torch.cat(
            (local_mean, local_m2, local_mean.new_full((1,), count)))
        rows = summed_over_group(rows, self.group)
        means, m2s, counts = rows[:, :c], rows[:, c:2 * c], rows[:, 2 * c:]
        n = counts.sum()
        mean = (counts * means).sum(0) / n
        var = (m2s + counts * (means - mean).square()).sum(0) / n
        if self.track_running_stats:
            with torch.no_grad():
                m = self.momentum if self.momentum is not None else 0.1
                self.running_mean.lerp_(mean.detach(), m)
                self.running_var.lerp_(var.detach() * n / (n - 1).clamp(min=1), m)
                self.num_batches_tracked += 1
        shape = (1, c, 1, 1)
        y = (xf - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)


def convert(module: nn.Module, group) -> nn.Module:
    """``module`` with every ``nn.BatchNorm2d`` replaced by a ``GroupBatchNorm2d`` over
    ``group`` that holds the same parameters and running statistics."""
    if isinstance(module, nn.BatchNorm2d) and not isinstance(module, GroupBatchNorm2d):
        state = module.state_dict()
        like = next(v for v in state.values() if v.is_floating_point())
        new = GroupBatchNorm2d(module.num_features, group, eps=module.eps,
                               momentum=module.momentum, affine=module.affine,
                               track_running_stats=module.track_running_stats)
        new.to(device=like.device, dtype=like.dtype).load_state_dict(state)
        return new
    for name, child in module.named_children():
        setattr(module, name, convert(child, group))
    return module
