"""The MLPerf BERT reference learning rate, and its evaluation schedule by samples."""

from __future__ import annotations

import math

import torch


def bert_lr(step, base_lr: float, train_steps: int, warmup_steps: int, start_warmup_step: int,
            power: float = 1.0):
    """Learning rate for 0-based ``step`` (a number, or a device tensor for graph capture).

    As the reference: polynomial decay ``base_lr * (1 - min(step, train_steps) /
    train_steps) ** power`` to 0, and while ``step - start_warmup_step <
    warmup_steps`` the linear warm-up ``base_lr * (step - start_warmup_step) /
    warmup_steps`` instead (a negative ``start_warmup_step`` shortens it).
    """
    if isinstance(step, torch.Tensor):
        step = step.float()
        decay = base_lr * (1 - step.clamp(max=train_steps) / train_steps) ** power
        if not warmup_steps:
            return decay
        warm_step = step - start_warmup_step
        return torch.where(warm_step < warmup_steps, base_lr * warm_step / warmup_steps, decay)
    decay = base_lr * (1 - min(step, train_steps) / train_steps) ** power
    if warmup_steps and step - start_warmup_step < warmup_steps:
        return base_lr * (step - start_warmup_step) / warmup_steps
    return decay


def eval_interval_samples(global_batch_size: int) -> int:
    """MLPerf 1.1 BERT rule: evaluate every floor(0.05 * (230.23 * B + 3e6), 25000) samples."""
    return int(0.05 * (230.23 * global_batch_size + 3_000_000) // 25_000 * 25_000)


def eval_steps(global_batch_size: int, first_samples: int, every_samples: int,
               max_steps: int) -> list[int]:
    """Step counts after which to evaluate: the first step reaching ``first_samples``
    trained, then every ``every_samples`` more, and at ``max_steps``."""
    out, target = [], first_samples
    while True:
        step = math.ceil(target / global_batch_size)
        if step >= max_steps:
            return out + [max_steps]
        if step >= 1 and (not out or step > out[-1]):
            out.append(step)
        target += every_samples
