"""The image caches' batched colour jitter as four compiled passes (optimisation
``fused-jitter``).

``data.apply_color_jitter``, the reference, runs each of the jitter's four steps as up to
four gathered sub-batches, one op each, written back: measured on a batch of 128 at 300x300,
8.36 ms of GPU time of the 11.90 ms augmentation (docs/performance.md, SSD). Here each
step computes all four ops on every sample and keeps, per sample, the one its order names
(``torch.where``); under ``torch.compile`` a step becomes the contrast's per-image mean and
one fused elementwise pass, the batch read and written once, with no gathers. The ops are
``data.jitter_op``'s, so the result equals the reference's to float rounding (a test)."""

from __future__ import annotations

import torch

from benchmarks.ssd.data import jitter_op


def jitter_steps(x: torch.Tensor, factors: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Float [B, 3, H, W] in 0..1 through the four steps: at step ``k`` sample ``b`` takes op
    ``order[b, k]`` with factor ``factors[b, op]`` (factors [B, 4, 1, 1, 1], order [B, 4]
    on ``x``'s device)."""
    for k in range(4):
        op = order[:, k].view(-1, 1, 1, 1)
        out = jitter_op(3, x, factors[:, 3])
        for o in (2, 1, 0):
            out = torch.where(op == o, jitter_op(o, x, factors[:, o]), out)
        x = out
    return x


_compiled = torch.compile(jitter_steps, dynamic=False)     # built on first use


def apply_color_jitter(x: torch.Tensor, factors: torch.Tensor, order: torch.Tensor
                       ) -> torch.Tensor:
    """``data.apply_color_jitter``'s contract (factors [B, 4] and order [B, 4] on the CPU)
    through the compiled :func:`jitter_steps`."""
    f = factors.to(x.device, x.dtype, non_blocking=True).view(-1, 4, 1, 1, 1)
    return _compiled(x, f, order.to(x.device, non_blocking=True))


def warm_up(batch_size: int, size: int, device: torch.device) -> None:
    """Build the compiled passes for batches of ``batch_size`` float [3, size, size] images on
    ``device`` from a zero batch (identity factors), so that they compile before the clock."""
    x = torch.zeros(batch_size, 3, size, size, device=device)
    apply_color_jitter(x, torch.ones(batch_size, 4), torch.arange(4).repeat(batch_size, 1))


def apply(loader) -> None:
    """The image cache's ``loader`` (``image_cache.CachedLoader``) jittering by
    :func:`apply_color_jitter`, its compiled passes built for the loader's batches before the
    clock (:func:`warm_up`)."""
    loader.cache.jitter = apply_color_jitter
    warm_up(loader.plans.batch_size, loader.plans.dataset.size, loader.cache.device)
