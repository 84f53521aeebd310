"""``BalancedPositiveNegativeSampler`` of the MLPerf Training 1.1 Mask R-CNN (mlcommons/training
``object_detection/pytorch/maskrcnn_benchmark/modeling/balanced_positive_negative_sampler.py``)
over a padded batch at once, for the RPN's anchors and the RoI heads' proposals.

The reference draws, per image, ``randperm`` prefixes of its positives and negatives. Here
every candidate gets one uniform random key and each row keeps the candidates of the highest
keys (one ``topk``): the same distribution (a uniform random subset of the same size), other
random numbers, and no host synchronisation.
"""

from __future__ import annotations

import torch


def _random_subset(members: torch.Tensor, priority: torch.Tensor, most: int,
                   limit: torch.Tensor | None = None) -> torch.Tensor:
    """Mask [B, N] of ``min(count, most, limit)`` members of each row of ``members`` [B, N],
    those of highest random ``priority`` [B, N] in [0, 1): a uniform random subset."""
    most = min(most, members.shape[1])
    top, index = torch.where(members, priority, -1.0).topk(most, dim=1)
    take = top >= 0
    if limit is not None:
        take &= torch.arange(most, device=members.device) < limit[:, None]
    return torch.zeros_like(members).scatter(1, index, take)


def balanced_sample(positive: torch.Tensor, negative: torch.Tensor, batch_size_per_image: int,
                    positive_fraction: float, generator: torch.Generator | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks [B, N] of the sampled ``positive`` and ``negative`` candidates [B, N]: per row up
    to ``int(batch_size_per_image * positive_fraction)`` positives, then negatives up to
    ``batch_size_per_image`` in all, each a uniform random subset drawn from ``generator``
    (on the candidates' device) or the global generator."""
    priority = torch.rand(positive.shape, generator=generator, device=positive.device)
    positive = _random_subset(positive, priority, int(batch_size_per_image * positive_fraction))
    negative = _random_subset(negative, priority, batch_size_per_image,
                              limit=batch_size_per_image - positive.sum(dim=1))
    return positive, negative
