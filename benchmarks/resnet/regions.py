"""The ``resize-on-device`` optimisation (over ``turbo``): the loader processes send each
crop's decoded pixels as they are, packed one after another in one buffer per slice, and
the training process resizes a whole batch of them at once.

The resize to the training size was 17-24% of a loader process's work per image, measured
alone on one thread (docs/performance.md); on the GPU it is one kernel for the batch.
It is the filter of the plain path (torch's antialiased bilinear, ``F.interpolate(...,
antialias=True)``), computed in float32 where the plain path rounds to uint8 after each of
its two passes: within a level of the plain path's pixels (a CPU test).

A packed batch is a uint8 buffer and ``meta``, int64 [n, 6], one row per image: the byte
offset of its region in the buffer, the region's row length in pixels (its pitch: RGB,
3 bytes a pixel), the crop's first column in the row, the crop's width and height, and
whether it is mirrored. ``resize`` runs the Triton kernel (``regions_triton.py``) on a CUDA
device and ``resize_reference`` (this file, pure PyTorch, one image at a time) elsewhere;
the reference is what the GPU test compares the kernel to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.resnet import data

FIELDS = 6   # offset, pitch, skip, width, height, flip


def region(packed: torch.Tensor, row) -> torch.Tensor:
    """uint8 [h, w, 3]: the crop that one ``meta`` row (a sequence of 6 ints) describes."""
    offset, pitch, skip, width, height, _ = (int(v) for v in row)
    return packed[offset:offset + height * pitch * 3].view(height, pitch, 3)[:, skip:skip + width]


def resize_reference(packed: torch.Tensor, meta: torch.Tensor, size: int) -> torch.Tensor:
    """Each crop resized to ``size`` x ``size`` by ``F.interpolate``'s antialiased bilinear
    filter in float32, mirrored where flagged, normalised: float32 NCHW, as
    ``data.normalize_on_device`` hands batches out."""
    crops = []
    for row in meta.tolist():
        x = region(packed, row).permute(2, 0, 1)[None].float()
        y = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True,
                          align_corners=False)
        crops.append(y.flip(3) if row[5] else y)
    return data.normalize(torch.cat(crops) if crops
                          else torch.empty(0, 3, size, size, device=packed.device))


def resize(packed: torch.Tensor, meta: torch.Tensor, size: int) -> torch.Tensor:
    """``resize_reference``'s result: one Triton kernel on a CUDA device, the reference
    elsewhere."""
    if packed.device.type == "cuda":
        from benchmarks.resnet import regions_triton  # Triton: GPU machines only
        return regions_triton.resize(packed, meta, size)
    return resize_reference(packed, meta, size)


def select(wl, _) -> None:
    wl.impl.options["resize_on_device"] = True
