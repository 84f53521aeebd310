"""A batch of packed crops (``regions.py``) resized, mirrored and normalised by one Triton
kernel: the GPU counterpart of :func:`benchmarks.resnet.regions.resize_reference`.

One program per output row of one image. The crops differ in size, so each program reads
its crop's geometry from ``meta`` and computes the antialiased bilinear filter's taps as
torch does (``_upsample_bilinear2d_aa``, align_corners off): for scale s = input/output, the
output pixel i centred at s (i + 0.5) reads the inputs within max(s, 1) of it, weighted by
the triangle 1 - |d| / max(s, 1) and normalised per axis. Both axes' taps are applied at
once (each output pixel reads its rows x columns of taps from the uint8 crop), in float32
as torch computes them (IEEE division, no fused multiply-add), and the result goes out
normalised in channels-last order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from benchmarks.resnet import data


@triton.jit
def _triangle(d):
    return tl.maximum(1.0 - tl.abs(d), 0.0)


@triton.jit(do_not_specialize=["size"])
def _resize_rows(src, meta, out, size, mean0, mean1, mean2, rstd0, rstd1, rstd2,
                 FIELDS: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.program_id(0)
    oy = tl.program_id(1)
    row = meta + n * FIELDS
    base = tl.load(row)
    pitch = tl.load(row + 1)
    skip = tl.load(row + 2)
    width = tl.load(row + 3).to(tl.int32)
    height = tl.load(row + 4).to(tl.int32)
    flip = tl.load(row + 5)
    # this program's output row: its input rows y0 .. y1 - 1 (torch's float32 arithmetic:
    # IEEE division, where Triton's "/" is approximate and moves the centres by up to 1e-4)
    sy = tl.div_rn(height.to(tl.float32), size.to(tl.float32))
    support_y = tl.maximum(sy, 1.0)
    inv_y = tl.div_rn(1.0, support_y)
    cy = sy * (oy + 0.5)
    y0 = tl.maximum((cy - support_y + 0.5).to(tl.int32), 0)
    y1 = tl.minimum((cy + support_y + 0.5).to(tl.int32), height)
    # every output column's input columns x0 .. x1 - 1 (of the mirrored column where flipped)
    ox = tl.arange(0, BLOCK)
    inside = ox < size
    col_out = tl.where(flip != 0, size - 1 - ox, ox)
    sx = tl.div_rn(width.to(tl.float32), size.to(tl.float32))
    support_x = tl.maximum(sx, 1.0)
    inv_x = tl.div_rn(1.0, support_x)
    cx = sx * (col_out.to(tl.float32) + 0.5)
    x0 = tl.maximum((cx - support_x + 0.5).to(tl.int32), 0)
    x1 = tl.minimum((cx + support_x + 0.5).to(tl.int32), width)
    taps_x = (2.0 * support_x).to(tl.int32) + 2   # at least x1 - x0 in every column
    total_y = 0.0
    for y in range(y0, y1):
        total_y += _triangle((y - cy + 0.5) * inv_y)
    total_x = tl.zeros([BLOCK], dtype=tl.float32)
    for b in range(0, taps_x):
        col = x0 + b
        total_x += tl.where(col < x1, _triangle((col - cx + 0.5) * inv_x), 0.0)
    acc0 = tl.zeros([BLOCK], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK], dtype=tl.float32)
    for y in range(y0, y1):
        wy = _triangle((y - cy + 0.5) * inv_y)
        line = src + base + (y * pitch + skip) * 3
        r0 = tl.zeros([BLOCK], dtype=tl.float32)
        r1 = tl.zeros([BLOCK], dtype=tl.float32)
        r2 = tl.zeros([BLOCK], dtype=tl.float32)
        for b in range(0, taps_x):
            col = x0 + b
            ok = (col < x1) & inside
            wx = tl.where(ok, _triangle((col - cx + 0.5) * inv_x), 0.0)
            p = line + col * 3
            r0 += wx * tl.load(p, mask=ok, other=0).to(tl.float32)
            r1 += wx * tl.load(p + 1, mask=ok, other=0).to(tl.float32)
            r2 += wx * tl.load(p + 2, mask=ok, other=0).to(tl.float32)
        acc0 += wy * r0
        acc1 += wy * r1
        acc2 += wy * r2
    norm = 1.0 / (total_y * tl.where(inside, total_x, 1.0))
    dst = out + ((n * size + oy) * size + ox).to(tl.int64) * 3
    tl.store(dst, (acc0 * norm - mean0) * rstd0, mask=inside)
    tl.store(dst + 1, (acc1 * norm - mean1) * rstd1, mask=inside)
    tl.store(dst + 2, (acc2 * norm - mean2) * rstd2, mask=inside)


def resize(packed: torch.Tensor, meta: torch.Tensor, size: int) -> torch.Tensor:
    """:func:`benchmarks.resnet.regions.resize_reference` on CUDA tensors (``packed`` uint8,
    ``meta`` int64 [n, regions.FIELDS])."""
    n, fields = meta.shape
    out = torch.empty(n, size, size, 3, dtype=torch.float32, device=packed.device)
    if n:
        mean, std = data.MEAN, data.STD
        _resize_rows[(n, size)](packed, meta.contiguous(), out, size, *mean,
                                *(1.0 / s for s in std), FIELDS=fields,
                                BLOCK=triton.next_power_of_2(size), enable_fp_fusion=False)
    return out.permute(0, 3, 1, 2)
