"""RoIAlign over the FPN levels as a Triton kernel, forward and backward (optimisation
``roi-align-triton``): the GPU counterpart of
:func:`benchmarks.maskrcnn.roi_align.roi_align_levels`, which stays the reference.

The reference path copies the levels into one table and gathers the four neighbours of every
sample from it; autograd's backward of those gathers is a zero-filled table per neighbour, a
scatter into each and their sum, for each head. Here the forward reads each level where it
lies, one program per row of output bins (bins x channels in registers, fp32 sums); the
backward adds each bin's weighted gradient straight into one fp32 table per level (atomic
adds, as the reference's CUDA kernel does), cast once to the levels' dtype. A bin's value is
separable into row and column taps, and a pixel that both of a bin's samples read along an
axis is one tap: a bin under a pixel wide issues 4 atomic adds a channel, not 16. One launch
per level; a program whose RoI is on another level touches no memory. The sample positions
and weights are the reference's arithmetic (IEEE divisions, no multiply-add contraction)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from benchmarks.maskrcnn.roi_align import SAMPLING_RATIO

# the maps' sizes change with the padded image size: not specialised on, so that no variant is
# compiled inside a timed step; their strides are specialised on (in channels-last memory they
# are multiples of the channels for any size: 16-byte aligned rows, vector loads)
_SIZES = ["level", "height", "width"]


@triton.jit
def _sample(start, bin_size, size, index, SAMPLE: tl.constexpr):
    """Sample ``SAMPLE`` (0 or 1: the reference's sampling ratio 2) of bin ``index`` along an
    axis of ``size`` pixels: its two neighbours (int32) and their bilinear weights, zero out
    of the map."""
    pos = start + index.to(tl.float32) * bin_size + tl.div_rn((SAMPLE + 0.5) * bin_size, 2.0)
    inside = (pos >= -1.0) & (pos <= size)
    pos = tl.maximum(pos, 0.0)
    low = tl.floor(pos)
    at_edge = low >= size - 1
    low = tl.where(at_edge, size - 1, low)
    frac = tl.where(at_edge, 0.0, pos - low)
    high = tl.where(at_edge, low, low + 1)
    return (low.to(tl.int32), high.to(tl.int32), tl.where(inside, 1.0 - frac, 0.0),
            tl.where(inside, frac, 0.0))


@triton.jit
def _taps(start, end, size, index, BINS: tl.constexpr):
    """Along one axis, the pixels (int32) that bin ``index`` of a RoI from ``start`` to ``end``
    reads and each one's weight summed over the bin's two samples: four taps, a pixel that
    both samples read counted once (the other tap's weight 0). A bin's value is separable:
    the sum over its rows' and columns' taps of the two weights' product times the pixel."""
    bin_size = tl.div_rn(tl.maximum(end - start, 1.0), BINS + 0.0)
    p0, p1, w0, w1 = _sample(start, bin_size, size, index, 0)
    p2, p3, w2, w3 = _sample(start, bin_size, size, index, 1)
    # the second sample is not before the first: it shares the first's low pixel (and then
    # its high one) or only the first's high pixel, or none
    same_low = p2 == p0
    low_is_high = p2 == p1
    w0 = tl.where(same_low, w0 + w2, w0)
    w1 = tl.where(same_low, w1 + w3, tl.where(low_is_high, w1 + w2, w1))
    w3 = tl.where(same_low, 0.0, w3)
    w2 = tl.where(same_low | low_is_high, 0.0, w2)
    return p0, p1, p2, p3, w0, w1, w2, w3


@triton.jit
def _bin_row(rois, levels, level, height, width, scale, stride_n, stride_c, channels,
             BINS_H: tl.constexpr, BINS_W: tl.constexpr, BLOCK_W: tl.constexpr,
             BLOCK_C: tl.constexpr):
    """This program's row of output bins: the mask of its [BLOCK_W, BLOCK_C] tile (bins,
    channels; all off where its RoI is on another level), the tile's offsets in the pooled
    rows [K, out_h, out_w, C], the offsets of its RoI's image's channels in a map [1,
    BLOCK_C], then the row's taps (scalars) and the columns' ([BLOCK_W])."""
    k = tl.program_id(0) // BINS_H
    pw = tl.arange(0, BLOCK_W)
    c = tl.arange(0, BLOCK_C)
    mask = (pw[:, None] < BINS_W) & (c[None, :] < channels) & (tl.load(levels + k) == level)
    tile = (tl.program_id(0) * BINS_W + pw[:, None]) * channels + c[None, :]
    origin = tl.load(rois + k * 5).to(tl.int64) * stride_n + c[None, :] * stride_c
    y0, y1, y2, y3, wy0, wy1, wy2, wy3 = _taps(
        tl.load(rois + k * 5 + 2) * scale, tl.load(rois + k * 5 + 4) * scale, height + 0.0,
        tl.program_id(0) % BINS_H, BINS_H)
    x0, x1, x2, x3, wx0, wx1, wx2, wx3 = _taps(
        tl.load(rois + k * 5 + 1) * scale, tl.load(rois + k * 5 + 3) * scale, width + 0.0, pw,
        BINS_W)
    return (mask, tile, origin, y0, y1, y2, y3, wy0, wy1, wy2, wy3, x0, x1, x2, x3, wx0, wx1,
            wx2, wx3)


@triton.jit
def _tap(row, x, weight, grad, stride_w, mask, SCATTER: tl.constexpr):
    """The pixels at columns ``x`` [BLOCK_W] of a row (pointers [1, BLOCK_C] to its
    channels), ``weight`` [BLOCK_W] each, nothing touched where it is 0: with ``SCATTER``,
    ``grad`` [BLOCK_W, BLOCK_C] times the weight added to them (zeros returned); else the
    pixels times the weight, in fp32."""
    at = row + x[:, None] * stride_w
    live = mask & (weight != 0.0)[:, None]
    if SCATTER:
        tl.atomic_add(at, weight[:, None] * grad, mask=live, sem="relaxed")
        result = tl.zeros(at.shape, tl.float32)
    else:
        result = weight[:, None] * tl.load(at, mask=live, other=0.0).to(tl.float32)
    return result


@triton.jit
def _row(row, wy, x0, x1, x2, x3, wx0, wx1, wx2, wx3, grad, stride_w, mask,
         SCATTER: tl.constexpr):
    """:func:`_tap` at a row tap of weight ``wy`` and the four column taps; their sum."""
    return (_tap(row, x0, wy * wx0, grad, stride_w, mask, SCATTER)
            + _tap(row, x1, wy * wx1, grad, stride_w, mask, SCATTER)
            + _tap(row, x2, wy * wx2, grad, stride_w, mask, SCATTER)
            + _tap(row, x3, wy * wx3, grad, stride_w, mask, SCATTER))


@triton.jit
def _bins(base, y0, y1, y2, y3, wy0, wy1, wy2, wy3, x0, x1, x2, x3, wx0, wx1, wx2, wx3, grad,
          stride_h, stride_w, mask, SCATTER: tl.constexpr):
    """:func:`_row` at each of the four row taps (``base`` the image's channels [1,
    BLOCK_C]): the bins' weighted sums of their pixels, or their gradients added."""
    return (_row(base + y0 * stride_h, wy0, x0, x1, x2, x3, wx0, wx1, wx2, wx3, grad, stride_w,
                 mask, SCATTER)
            + _row(base + y1 * stride_h, wy1, x0, x1, x2, x3, wx0, wx1, wx2, wx3, grad,
                   stride_w, mask, SCATTER)
            + _row(base + y2 * stride_h, wy2, x0, x1, x2, x3, wx0, wx1, wx2, wx3, grad,
                   stride_w, mask, SCATTER)
            + _row(base + y3 * stride_h, wy3, x0, x1, x2, x3, wx0, wx1, wx2, wx3, grad,
                   stride_w, mask, SCATTER))


@triton.jit(do_not_specialize=_SIZES)
def _roi_align(maps, rois, levels, rows, level, height, width, scale, stride_n, stride_c,
               stride_h, stride_w, channels, BINS_H: tl.constexpr, BINS_W: tl.constexpr,
               BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr, SCATTER: tl.constexpr):
    """One level's RoIs: pooled into ``rows`` [K, out_h, out_w, C] from ``maps``, or with
    ``SCATTER`` their gradients ``rows`` added into the gradient tables ``maps``."""
    mask, tile, origin, y0, y1, y2, y3, wy0, wy1, wy2, wy3, x0, x1, x2, x3, wx0, wx1, wx2, wx3 = \
        _bin_row(rois, levels, level, height, width, scale, stride_n, stride_c, channels,
                 BINS_H, BINS_W, BLOCK_W, BLOCK_C)
    if SCATTER:
        g = tl.load(rows + tile, mask=mask, other=0.0).to(tl.float32) / 4
        _bins(maps + origin, y0, y1, y2, y3, wy0, wy1, wy2, wy3, x0, x1, x2, x3, wx0, wx1, wx2,
              wx3, g, stride_h, stride_w, mask, SCATTER=True)
    else:
        acc = _bins(maps + origin, y0, y1, y2, y3, wy0, wy1, wy2, wy3, x0, x1, x2, x3, wx0, wx1,
                    wx2, wx3, 0.0, stride_h, stride_w, mask, SCATTER=False)
        tl.store(rows + tile, (acc / 4).to(rows.dtype.element_ty), mask=mask)


def _launch(maps: list[torch.Tensor], rois: torch.Tensor, levels: torch.Tensor,
            rows: torch.Tensor, scales: list[float], output_size: list[int],
            scatter: bool) -> None:
    """:func:`_roi_align` once per level on ``maps`` (the levels, or with ``scatter`` their
    gradients' tables), with ``rows`` [K, out_h, out_w, C] the pooled output or its
    gradient."""
    bins_h, bins_w = output_size
    if not len(rois):
        return
    channels = rows.shape[-1]
    block_c = triton.next_power_of_2(channels)
    for level, (m, scale) in enumerate(zip(maps, scales, strict=True)):
        n, c, h, w = m.stride()
        _roi_align[(len(rois) * bins_h,)](
            m, rois, levels, rows, level, m.shape[2], m.shape[3], float(scale), n, c, h, w,
            channels, BINS_H=bins_h, BINS_W=bins_w,
            BLOCK_W=triton.next_power_of_2(bins_w), BLOCK_C=block_c, SCATTER=scatter,
            num_warps=4 if block_c * bins_w <= 2048 else 8, enable_fp_fusion=False)


@torch.library.custom_op("maskrcnn::roi_align_fpn", mutates_args=())
def _roi_align_fpn(features: list[torch.Tensor], rois: torch.Tensor, levels: torch.Tensor,
                   scales: list[float], output_size: list[int]) -> torch.Tensor:
    out = features[0].new_empty(len(rois), *output_size, features[0].shape[1])
    _launch(features, rois, levels, out, scales, output_size, scatter=False)
    return out


@_roi_align_fpn.register_fake
def _(features, rois, levels, scales, output_size):
    return features[0].new_empty(rois.shape[0], *output_size, features[0].shape[1])


@torch.library.custom_op("maskrcnn::roi_align_fpn_backward", mutates_args=())
def _roi_align_fpn_backward(grad: torch.Tensor, features: list[torch.Tensor],
                            rois: torch.Tensor, levels: torch.Tensor, scales: list[float],
                            output_size: list[int]) -> list[torch.Tensor]:
    tables = [torch.zeros_like(f, dtype=torch.float32) for f in features]
    _launch(tables, rois, levels, grad.contiguous(), scales, output_size, scatter=True)
    return [t.to(f.dtype) for t, f in zip(tables, features, strict=True)]


@_roi_align_fpn_backward.register_fake
def _(grad, features, rois, levels, scales, output_size):
    return [torch.empty_like(f) for f in features]


def _setup_context(ctx, inputs, output):
    features, rois, levels, *ctx.sizes = inputs
    ctx.save_for_backward(rois, levels, *features)


def _grad(ctx, grad):
    rois, levels, *features = ctx.saved_tensors
    return (_roi_align_fpn_backward(grad, features, rois, levels, *ctx.sizes),
            None, None, None, None)


_roi_align_fpn.register_autograd(_grad, setup_context=_setup_context)


def roi_align_levels(features: list[torch.Tensor], scales: list[float], rois: torch.Tensor,
                     levels: torch.Tensor, output_size: tuple[int, int],
                     sampling_ratio: int) -> torch.Tensor:
    """:func:`benchmarks.maskrcnn.roi_align.roi_align_levels` on CUDA maps [N, C, H_l, W_l]
    of a floating dtype: pooled [K, C, out_h, out_w] (a channels-last view), fp32 sums."""
    if sampling_ratio != SAMPLING_RATIO:
        raise ValueError(f"the Triton RoIAlign takes {SAMPLING_RATIO} x {SAMPLING_RATIO} samples "
                         f"a bin (the reference's), not {sampling_ratio}: drop "
                         "roi-align-triton")
    out = _roi_align_fpn(list(features), rois.detach().float().contiguous(),
                         levels.contiguous(), [float(s) for s in scales], list(output_size))
    return out.permute(0, 3, 1, 2)
