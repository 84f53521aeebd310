"""The matching's overlaps in one Triton kernel (``--fused-match``): the GPU counterpart of
:func:`benchmarks.ssd.boxes.dense_overlaps`, which stays the reference.

The reference path forms every ground truth's IoU with every default box, a [B, M, A]
matrix (7.2 GB in fp32 at batch 1024 with 200 padded boxes per image), writes it and
reduces it twice. Here one program holds a block of default boxes in registers and walks
the image's ground truths, skipping the padding: it keeps each default box's best ground
truth, and offers each ground truth its best default box of the block through an atomic
max over (IoU bits, reversed index), so the first of equal maxima wins, as ``argmax``'s.
The IoU is :func:`benchmarks.ssd.boxes.box_iou`'s arithmetic, in the same order, with
multiply-add contraction off and round-to-nearest division, so the result is the reference
path's bit for bit (a GPU test). The padded ground-truth count changes with every batch,
so it is not specialised on (no variant compiled inside a timed step when it is 1 or a
multiple of 16)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

BLOCK = 1024                      # default boxes per program
LOW = (1 << 31) - 1               # the packed key holds LOW - index in its low 32 bits


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["num_gt"])
    def overlaps_kernel(gt, valid, dboxes, best_iou, best_idx, packed, num_dboxes, num_gt,
                        LOW: tl.constexpr, BLOCK: tl.constexpr):
        img = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < num_dboxes
        x1 = tl.load(dboxes + offs * 4, mask=inside, other=0.0)
        y1 = tl.load(dboxes + offs * 4 + 1, mask=inside, other=0.0)
        x2 = tl.load(dboxes + offs * 4 + 2, mask=inside, other=1.0)
        y2 = tl.load(dboxes + offs * 4 + 3, mask=inside, other=1.0)
        area = (x2 - x1) * (y2 - y1)
        best = tl.full([BLOCK], -1.0, tl.float32)
        idx = tl.zeros([BLOCK], tl.int64)
        row = img.to(tl.int64) * num_gt
        for g in range(0, num_gt):
            if tl.load(valid + row + g) != 0:
                gx1 = tl.load(gt + (row + g) * 4)
                gy1 = tl.load(gt + (row + g) * 4 + 1)
                gx2 = tl.load(gt + (row + g) * 4 + 2)
                gy2 = tl.load(gt + (row + g) * 4 + 3)
                w = tl.maximum(tl.minimum(gx2, x2) - tl.maximum(gx1, x1), 0.0)
                h = tl.maximum(tl.minimum(gy2, y2) - tl.maximum(gy1, y1), 0.0)
                inter = w * h
                own = (gx2 - gx1) * (gy2 - gy1)
                iou = tl.math.div_rn(inter, own + area - inter)
                better = iou > best
                best = tl.where(better, iou, best)
                idx = tl.where(better, g, idx)
                top = tl.max(tl.where(inside, iou, -1.0), 0)
                first = tl.min(tl.where(inside & (iou == top), offs, num_dboxes), 0)
                key = (top.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (LOW - first)
                tl.atomic_max(packed + row + g, key)
        out = img.to(tl.int64) * num_dboxes + offs
        tl.store(best_iou + out, best, mask=inside)
        tl.store(best_idx + out, idx, mask=inside)

    return overlaps_kernel


@torch.library.custom_op("ssd::fused_overlaps", mutates_args=())
def fused_overlaps(gt_boxes: Tensor, gt_valid: Tensor,
                   dboxes_ltrb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`benchmarks.ssd.boxes.dense_overlaps` on CUDA tensors, without the IoU matrix."""
    import triton

    batch, num_gt, _ = gt_boxes.shape
    num_dboxes = dboxes_ltrb.shape[0]
    best_iou = gt_boxes.new_empty(batch, num_dboxes, dtype=torch.float32)
    best_idx = gt_boxes.new_empty(batch, num_dboxes, dtype=torch.int64)
    packed = gt_boxes.new_zeros(batch, num_gt, dtype=torch.int64)
    if best_iou.numel():
        _kernel()[(batch, triton.cdiv(num_dboxes, BLOCK))](
            gt_boxes.float().contiguous(), gt_valid.to(torch.int8).contiguous(),
            dboxes_ltrb.float().contiguous(), best_iou, best_idx, packed, num_dboxes, num_gt,
            LOW=LOW, BLOCK=BLOCK, num_warps=4, enable_fp_fusion=False)
    best_gt_dbox = torch.where(gt_valid, LOW - (packed & 0xFFFFFFFF), 0)
    return best_iou, best_idx, best_gt_dbox


@fused_overlaps.register_fake
def _(gt_boxes, gt_valid, dboxes_ltrb):
    batch, num_gt, _ = gt_boxes.shape
    num_dboxes = dboxes_ltrb.shape[0]
    return (gt_boxes.new_empty(batch, num_dboxes, dtype=torch.float32),
            gt_boxes.new_empty(batch, num_dboxes, dtype=torch.int64),
            gt_boxes.new_empty(batch, num_gt, dtype=torch.int64))
