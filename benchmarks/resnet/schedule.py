"""MLPerf ResNet learning rate: linear warm-up, then polynomial decay to the end rate."""

from __future__ import annotations

import torch


def poly_warmup_lr(step, base_lr: float, end_lr: float, warmup_steps: int, decay_steps: int,
                   power: float = 2.0):
    """Learning rate for 0-based ``step`` (a number, or a device tensor for graph capture).

    Warm-up: ``base_lr * (step + 1) / warmup_steps`` for the first ``warmup_steps``.
    Then ``end_lr + (base_lr - end_lr) * (1 - p) ** power`` with
    ``p = (step - warmup_steps) / (decay_steps - warmup_steps)`` clamped to [0, 1];
    ``decay_steps`` is the whole schedule length in steps, warm-up included (the
    value logged as ``lars_opt_learning_rate_decay_steps``).
    """
    if decay_steps <= warmup_steps:
        raise ValueError(f"decay_steps ({decay_steps}) must exceed warmup_steps ({warmup_steps})")
    span = decay_steps - warmup_steps
    if isinstance(step, torch.Tensor):
        step = step.float()
        warm = base_lr * (step + 1) / max(warmup_steps, 1)
        p = ((step - warmup_steps) / span).clamp(0.0, 1.0)
        decay = end_lr + (base_lr - end_lr) * (1 - p) ** power
        return torch.where(step < warmup_steps, warm, decay)
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    p = min(max((step - warmup_steps) / span, 0.0), 1.0)
    return end_lr + (base_lr - end_lr) * (1 - p) ** power
