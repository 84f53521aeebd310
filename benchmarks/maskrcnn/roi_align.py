"""RoIAlign and the multi-level FPN pooler of the MLPerf 1.1 Mask R-CNN reference, in plain
PyTorch (mlcommons/training ``object_detection/pytorch/maskrcnn_benchmark``:
``csrc/cuda/ROIAlign_cuda.cu``, ``layers/roi_align.py``, ``modeling/poolers.py``; sizes from
``configs/e2e_mask_rcnn_R_50_FPN_1x.yaml``).

The kernel's arithmetic, without its half-pixel shift (``aligned=False``): a RoI scaled to
the feature map is at least 1 x 1; each output bin averages ``sampling_ratio^2`` bilinear
samples on a regular grid inside it; a sample more than one pixel outside the map is 0, one
less than that outside is clamped to the border. Sampling is a gather of the four
neighbours of every sample of every RoI at once (from a channels-last table of the levels'
pixels: a view of a single map in channels-last memory, else one copy), so autograd gives the
kernel's backward: each sample's gradient goes to its four neighbours. As in the reference,
no gradient flows to the RoI coordinates.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch

from benchmarks.maskrcnn.boxes import box_area

POOLER_SCALES = (1 / 4, 1 / 8, 1 / 16, 1 / 32)     # P2..P5
SAMPLING_RATIO = 2
BOX_RESOLUTION = 7
MASK_RESOLUTION = 14
CANONICAL_SCALE = 224       # a 224 x 224 RoI goes to the canonical level (FPN paper, eqn 1)
CANONICAL_LEVEL = 4


def _axis_samples(start: torch.Tensor, end: torch.Tensor, size: torch.Tensor, bins: int,
                  sampling_ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Along one axis, for RoIs from ``start`` to ``end`` [K] on maps of length ``size`` [K]:
    the sample positions' two neighbours [K, bins * sampling_ratio, 2] (indices, int64) and
    their bilinear weights (zero for a sample out of the map), in the kernel's arithmetic."""
    bin_size = ((end - start).clamp(min=1) / bins)[:, None, None]
    grid = torch.arange(bins, dtype=start.dtype, device=start.device)[:, None]
    offset = torch.arange(sampling_ratio, dtype=start.dtype, device=start.device) + 0.5
    pos = start[:, None, None] + grid * bin_size + offset * bin_size / sampling_ratio
    pos = pos.reshape(len(start), bins * sampling_ratio)
    size = size[:, None]
    inside = (pos >= -1) & (pos <= size)
    pos = pos.clamp(min=0)
    low = pos.floor()
    at_edge = low >= size - 1
    low = torch.where(at_edge, size - 1, low)
    frac = torch.where(at_edge, 0, pos - low)
    high = torch.where(at_edge, low, low + 1)
    weights = torch.stack((1 - frac, frac), dim=-1) * inside[..., None]
    return torch.stack((low, high), dim=-1).long(), weights


def _table(features: list[torch.Tensor]) -> torch.Tensor:
    """The pixels of the maps [N, C, H_l, W_l] as rows [sum of N H_l W_l, C], level after
    level: each map's rows are a view where it is in channels-last memory."""
    rows = [f.permute(0, 2, 3, 1).reshape(-1, f.shape[1]) for f in features]
    return rows[0] if len(rows) == 1 else torch.cat(rows)


@functools.cache
def _level_constants(sizes: tuple[tuple[int, int], ...], scales: tuple[float, ...],
                     device: torch.device) -> torch.Tensor:
    """Per level of maps of ``(H_l, W_l)`` [L, 4] (float64): height, width, scale and the
    pixels of one image on the levels before it; made once, as a host-to-device copy syncs."""
    before = [0, *itertools.accumulate(h * w for h, w in sizes)][:-1]
    return torch.tensor([[h, w, s, b] for (h, w), s, b in zip(sizes, scales, before, strict=True)],
                        dtype=torch.float64, device=device)


def roi_align_levels(features: list[torch.Tensor], scales: list[float], rois: torch.Tensor,
                     levels: torch.Tensor, output_size: tuple[int, int],
                     sampling_ratio: int) -> torch.Tensor:
    """RoIAlign of each RoI [K, 5] on the feature map [N, C, H_l, W_l] of its level [K]:
    every level's pixels are rows of one channels-last table, so all RoIs are one gather."""
    if sampling_ratio <= 0:
        raise ValueError("sampling_ratio must be positive (the adaptive grid is not supported)")
    rois = rois.detach()
    out_h, out_w = output_size
    channels = features[0].shape[1]
    table = _table(features)
    # under torch.compile the sizes may be symbolic: traced into the graph, not cached
    level_constants = (_level_constants.__wrapped__ if torch.compiler.is_compiling()
                       else _level_constants)
    constants = level_constants(tuple(tuple(f.shape[2:]) for f in features), tuple(scales),
                                rois.device)[levels]
    heights, widths, scale = constants[:, :3].to(rois.dtype).unbind(1)
    base = (len(features[0]) * constants[:, 3].long()       # the level's first row
            + rois[:, 0].long() * (heights * widths).long())
    y_idx, y_w = _axis_samples(rois[:, 2] * scale, rois[:, 4] * scale, heights, out_h,
                               sampling_ratio)
    x_idx, x_w = _axis_samples(rois[:, 1] * scale, rois[:, 3] * scale, widths, out_w,
                               sampling_ratio)
    rows = base[:, None, None] + y_idx * widths.long()[:, None, None]     # [K, Y, 2]
    pooled = 0
    for a, b in itertools.product(range(2), repeat=2):                   # the 4 neighbours
        index = rows[:, :, None, a] + x_idx[:, None, :, b]               # [K, Y, X]
        weight = y_w[:, :, None, a] * x_w[:, None, :, b]
        if table.is_floating_point():       # integer maps (masks) are weighted in rois' dtype
            weight = weight.to(table.dtype)
        pooled = pooled + weight[..., None] * table[index]
    pooled = pooled.reshape(len(rois), out_h, sampling_ratio, out_w, sampling_ratio, channels)
    return pooled.mean(dim=(2, 4)).permute(0, 3, 1, 2)


def roi_align(features: torch.Tensor, rois: torch.Tensor, output_size: int | tuple[int, int],
              spatial_scale: float, sampling_ratio: int) -> torch.Tensor:
    """Pooled features [K, C, out_h, out_w] of ``features`` [N, C, H, W] inside ``rois``
    [K, 5] (batch index, x1, y1, x2, y2 in image pixels, scaled by ``spatial_scale``)."""
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    levels = torch.zeros(len(rois), dtype=torch.long, device=rois.device)
    return roi_align_levels([features], [spatial_scale], rois, levels, output_size,
                            sampling_ratio)


class LevelMapper:
    """The FPN level index (0 for ``k_min``) of each box [K, 4]:
    ``floor(canonical_level + log2(sqrt(area) / canonical_scale + eps))`` clamped to
    ``[k_min, k_max]``, the area counting inclusive pixels."""

    def __init__(self, k_min: int, k_max: int, canonical_scale: int = CANONICAL_SCALE,
                 canonical_level: int = CANONICAL_LEVEL, eps: float = 1e-6):
        self.k_min, self.k_max = k_min, k_max
        self.canonical_scale, self.canonical_level = canonical_scale, canonical_level
        self.eps = eps

    def __call__(self, boxes: torch.Tensor) -> torch.Tensor:
        scale = torch.sqrt(box_area(boxes))
        level = torch.floor(self.canonical_level
                            + torch.log2(scale / self.canonical_scale + self.eps))
        return level.clamp(self.k_min, self.k_max).long() - self.k_min


class Pooler:
    """RoIAlign over the FPN levels: each RoI [K, 5] is pooled from the level that
    :class:`LevelMapper` assigns it (``scales`` from finest to coarsest, halving), into
    ``output_size`` (7 for the box head, 14 for the mask head). ``align``: the function that
    pools, :func:`roi_align_levels` or its GPU counterpart (``roi-align-triton``)."""

    def __init__(self, output_size: int, scales: tuple[float, ...] = POOLER_SCALES,
                 sampling_ratio: int = SAMPLING_RATIO, align=roi_align_levels):
        self.output_size = (output_size, output_size)
        self.align = align
        self.scales = list(scales)
        self.sampling_ratio = sampling_ratio
        self.map_levels = LevelMapper(round(-math.log2(scales[0])), round(-math.log2(scales[-1])))

    def __call__(self, features: list[torch.Tensor], rois: torch.Tensor) -> torch.Tensor:
        """Pooled features [K, C, out, out] of the levels' maps [N, C, H_l, W_l]."""
        return self.align(features, self.scales, rois, self.map_levels(rois[:, 1:]),
                          self.output_size, self.sampling_ratio)


def rois_from_boxes(boxes: list[torch.Tensor]) -> torch.Tensor:
    """The RoIs [K, 5] of per-image boxes [K_i, 4]: each box behind its image's index."""
    index = torch.cat([torch.full((len(b), 1), i, dtype=b.dtype, device=b.device)
                       for i, b in enumerate(boxes)])
    return torch.cat((index, torch.cat(boxes)), dim=1)
