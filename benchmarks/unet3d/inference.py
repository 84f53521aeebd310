"""Sliding-window inference with Gaussian importance weighting, as the MLPerf reference does it.

The window steps by ``roi * (1 - overlap)``; a remainder under half a step is
cropped off symmetrically, otherwise the volume is padded symmetrically with
-2.2 (below every normalised intensity) to a whole number of steps (at least
one window). Window logits are weighted by the cube root of a 3D Gaussian
(sigma = roi / 8, peak 1) and divided by the summed weights.

Sharded: with ``rank``/``world`` the windows are dealt round-robin over the
ranks and the weighted sums are added up with one all-reduce per case.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from common import dist

PAD_VALUE = -2.2


def gaussian_kernel(roi) -> torch.Tensor:
    """The reference's importance map: cbrt of the outer product of 1D Gaussians, sigma roi/8.

    The reference has cubic windows; a non-cubic one gets each axis' own sigma.
    """
    g = [np.exp(-0.5 * ((np.arange(n) - (n - 1) / 2.0) / (0.125 * n)) ** 2) for n in roi]
    g3 = np.cbrt(np.einsum("i,j,k->ijk", *g))
    return torch.from_numpy(g3 / g3.max())


def window_plan(shape, roi, overlap: float):
    """(crop, pad, starts): per-axis (before, after) crop and pad, and each axis' window starts."""
    crops, pads, starts = [], [], []
    for size, r in zip(shape, roi):
        stride = int(r * (1 - overlap))
        rem = size % stride
        rem = rem if rem < stride // 2 else 0
        crops.append((rem // 2, rem - rem // 2))
        size -= rem
        extra = (stride - size % stride) % stride
        if size + extra < r:
            extra += stride
        pads.append((extra // 2, extra - extra // 2))
        size += extra
        starts.append(list(range(0, (size - r) // stride * stride + 1, stride)))
    return crops, pads, starts


def crop(t: torch.Tensor, crops) -> torch.Tensor:
    for axis, (lo, hi) in enumerate(crops):
        t = t.narrow(2 + axis, lo, t.shape[2 + axis] - lo - hi)
    return t


def sliding_window(model: Callable[[torch.Tensor], torch.Tensor], image: torch.Tensor, roi,
                   overlap: float, num_classes: int, batch_size: int = 1,
                   rank: int = 0, world: int = 1) -> tuple[torch.Tensor, list]:
    """Logits (1, C, *cropped shape) for a (1, 1, D, H, W) image, and the crop applied."""
    crops, pads, starts = window_plan(image.shape[2:], roi, overlap)
    x = crop(image, crops)
    cropped = x.shape[2:]
    flat_pad = [v for lo_hi in reversed(pads) for v in lo_hi]
    x = F.pad(x, flat_pad, mode="constant", value=PAD_VALUE)
    weight = gaussian_kernel(roi).to(x.device, torch.float32)
    corners = [(i, j, k) for i in starts[0] for j in starts[1] for k in starts[2]]
    result = x.new_zeros((1, num_classes, *x.shape[2:]), dtype=torch.float32)
    norm = x.new_zeros((1, 1, *x.shape[2:]), dtype=torch.float32)
    for i, j, k in corners:   # every rank builds the full weight map: cheap, no traffic
        norm[..., i:i + roi[0], j:j + roi[1], k:k + roi[2]] += weight
    mine = corners[rank::world]
    for b in range(0, len(mine), batch_size):
        batch = mine[b:b + batch_size]
        patches = torch.cat([x[..., i:i + roi[0], j:j + roi[1], k:k + roi[2]]
                             for i, j, k in batch])
        logits = model(patches).float() * weight
        for n, (i, j, k) in enumerate(batch):
            result[..., i:i + roi[0], j:j + roi[1], k:k + roi[2]] += logits[n:n + 1]
    if world > 1:
        dist.all_reduce_sum(result)
    result /= norm
    (d0, _), (h0, _), (w0, _) = pads
    return result[..., d0:d0 + cropped[0], h0:h0 + cropped[1], w0:w0 + cropped[2]], crops
