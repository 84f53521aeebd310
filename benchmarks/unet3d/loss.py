"""Dice + cross-entropy loss and the Dice score, as the MLPerf reference computes them.

Dice per sample and foreground class (kidney, tumour; background excluded)
is ``(2 * |P.T| + 1e-6) / (|P| + |T| + 1e-6)``. The loss is
``(mean(1 - soft Dice) + cross-entropy) / 2``; the score uses the one-hot argmax.

Both are written as sums over voxels followed by a ``reduce`` of those sums,
so a volume split over ranks (``spatial.py``) passes a cross-rank reduce and
gets exactly the whole-volume value.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

SMOOTH = 1e-6
Reduce = Callable[[torch.Tensor], torch.Tensor]


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _one_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N, 1, D, H, W) integer labels -> (N, C, D, H, W) float one-hot (no host sync)."""
    classes = torch.arange(num_classes, device=labels.device).view(1, -1, 1, 1, 1)
    return (labels == classes).float()


def dice_sums(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(3, N, C-1) partial sums: intersection, target and prediction volumes, background dropped."""
    pred, target = pred[:, 1:], target[:, 1:]
    dims = (2, 3, 4)
    return torch.stack(((pred * target).sum(dims), target.sum(dims), pred.sum(dims)))


def dice_from_sums(sums: torch.Tensor) -> torch.Tensor:
    """(N, C-1) Dice coefficients from reduced ``dice_sums``."""
    inter, target, pred = sums
    return (2.0 * inter + SMOOTH) / (target + pred + SMOOTH)


def dice_ce_loss(logits: torch.Tensor, labels: torch.Tensor,
                 reduce: Reduce = _identity, total_voxels: int | None = None) -> torch.Tensor:
    """The training loss; ``total_voxels`` is the whole volume's voxel count when split."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=1)
    dice = dice_from_sums(reduce(dice_sums(probs, _one_hot(labels, logits.shape[1]))))
    ce_sum = reduce(F.cross_entropy(logits, labels[:, 0].long(), reduction="sum"))
    count = total_voxels if total_voxels is not None else labels.numel()
    return (torch.mean(1.0 - dice) + ce_sum / count) / 2


def dice_score(logits: torch.Tensor, labels: torch.Tensor,
               reduce: Reduce = _identity) -> torch.Tensor:
    """(C-1,) Dice of the argmax prediction per foreground class, averaged over the batch."""
    num_classes = logits.shape[1]
    pred = _one_hot(logits.argmax(1, keepdim=True), num_classes)
    return dice_from_sums(reduce(dice_sums(pred, _one_hot(labels, num_classes)))).mean(0)
