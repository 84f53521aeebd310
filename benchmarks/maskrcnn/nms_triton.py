"""Greedy NMS of padded rows of boxes in one Triton kernel (optimisation ``nms-triton``): the GPU
counterpart of :func:`benchmarks.maskrcnn.boxes.nms_keep`, which stays the reference.

The pure-PyTorch path forms every pair's IoU ([G, W, W], 160 M pairs for the RPN's 40 rows
of 2,000 at batch 8) and settles the suppressions in rounds, each a host synchronisation.
Here one program per row holds its boxes in registers and walks them best first: a box
still alive when its turn comes suppresses every later box whose IoU with it is above the
threshold. No IoU matrix, no host synchronisation. The IoU is the reference's arithmetic
(inclusive pixels, ``TO_REMOVE``), evaluated in the same order with float multiply-add
contraction off, so the result is the reference path's bit for bit (a GPU test). The row
width changes with the image sizes, so it is not specialised on (no variant compiled inside
a timed step when it is 1 or a multiple of 16)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from benchmarks.maskrcnn.boxes import TO_REMOVE

MAX_WIDTH = 16384       # boxes per row that one program holds in registers


@triton.jit(do_not_specialize=["width"])
def _nms_rows(boxes, valid, keep, width, threshold, EXTRA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    inside = offs < width
    base = boxes + row * width * 4
    x1 = tl.load(base + offs * 4, mask=inside, other=0.0)
    y1 = tl.load(base + offs * 4 + 1, mask=inside, other=0.0)
    x2 = tl.load(base + offs * 4 + 2, mask=inside, other=0.0)
    y2 = tl.load(base + offs * 4 + 3, mask=inside, other=0.0)
    area = (x2 - x1 + EXTRA) * (y2 - y1 + EXTRA)
    alive = tl.load(valid + row * width + offs, mask=inside, other=0) != 0
    for i in range(0, width):
        if tl.sum(tl.where((offs == i) & alive, 1, 0)) > 0:
            bx1 = tl.load(base + i * 4)
            by1 = tl.load(base + i * 4 + 1)
            bx2 = tl.load(base + i * 4 + 2)
            by2 = tl.load(base + i * 4 + 3)
            own = (bx2 - bx1 + EXTRA) * (by2 - by1 + EXTRA)
            w = tl.maximum(tl.minimum(bx2, x2) - tl.maximum(bx1, x1) + EXTRA, 0.0)
            h = tl.maximum(tl.minimum(by2, y2) - tl.maximum(by1, y1) + EXTRA, 0.0)
            inter = w * h
            iou = inter / (own + area - inter)
            alive = alive & ~((iou > threshold) & (offs > i))
    tl.store(keep + row * width + offs, alive.to(tl.int8), mask=inside)


def nms_keep(padded: torch.Tensor, valid: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """:func:`benchmarks.maskrcnn.boxes.nms_keep` on CUDA tensors: survivors [G, W] (bool)
    of boxes [G, W, 4] (float32 arithmetic), best first in each row."""
    rows, width = valid.shape
    if width > MAX_WIDTH:
        raise ValueError(f"Triton NMS holds at most {MAX_WIDTH} boxes per category, got "
                         f"{width}: lower the RPN's pre-NMS top-N or drop nms-triton")
    keep = torch.zeros(rows, width, dtype=torch.int8, device=padded.device)
    if keep.numel():
        block = max(16, triton.next_power_of_2(width))
        _nms_rows[(rows,)](padded.float().contiguous(), valid.to(torch.int8).contiguous(),
                           keep, width, float(iou_threshold), EXTRA=float(TO_REMOVE),
                           BLOCK=block, num_warps=4 if block <= 1024 else 8,
                           enable_fp_fusion=False)
    return keep.bool()
