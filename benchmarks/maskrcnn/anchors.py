"""RPN anchors of the MLPerf 1.1 Mask R-CNN reference on the FPN levels P2-P6
(mlcommons/training ``object_detection/pytorch/maskrcnn_benchmark/modeling/rpn/
anchor_generator.py``; sizes and strides from ``configs/e2e_mask_rcnn_R_50_FPN_1x.yaml`` and
``config/defaults.py``).

Per level, each feature-map cell ``(row, col)`` carries the level's cell anchors shifted by
``(col * stride, row * stride)``; anchors are ordered by row, column, then aspect ratio,
which is the order of the RPN head's outputs once permuted to ``[N, H, W, A]``.
"""

from __future__ import annotations

import torch

ANCHOR_SIZES = (32, 64, 128, 256, 512)      # one size per level, P2..P6
ANCHOR_STRIDES = (4, 8, 16, 32, 64)
ASPECT_RATIOS = (0.5, 1.0, 2.0)             # height / width
STRADDLE_THRESH = 0                         # anchors may leave the image by this many pixels


def cell_anchors(stride: int, size: int,
                 aspect_ratios: tuple[float, ...] = ASPECT_RATIOS) -> torch.Tensor:
    """The anchors of the cell at the origin [A, 4], float32, as the reference's
    ``generate_anchors``: the ``stride x stride`` box ``(0, 0, stride - 1, stride - 1)`` is
    reshaped to each aspect ratio at (nearly) constant area, its sides rounded half to even,
    then scaled by ``size / stride`` about the cell's centre. Computed in float64."""
    ratios = torch.tensor(aspect_ratios, dtype=torch.float64)
    centre = 0.5 * (stride - 1)
    widths = torch.round(torch.sqrt(stride * stride / ratios))
    heights = torch.round(widths * ratios)
    widths, heights = widths * (size / stride), heights * (size / stride)
    half_w, half_h = 0.5 * (widths - 1), 0.5 * (heights - 1)
    return torch.stack((centre - half_w, centre - half_h,
                        centre + half_w, centre + half_h), dim=1).float()


def grid_anchors(cell: torch.Tensor, stride: int,
                 feature_size: tuple[int, int]) -> torch.Tensor:
    """Anchors [H * W * A, 4] of a feature map of ``(H, W)`` from its cell anchors [A, 4]."""
    height, width = feature_size
    shift_x = torch.arange(0, width * stride, step=stride, dtype=torch.float32,
                           device=cell.device)
    shift_y = torch.arange(0, height * stride, step=stride, dtype=torch.float32,
                           device=cell.device)
    shift_y, shift_x = torch.meshgrid(shift_y, shift_x, indexing="ij")
    shifts = torch.stack((shift_x, shift_y, shift_x, shift_y), dim=-1).reshape(-1, 1, 4)
    return (shifts + cell).reshape(-1, 4)


def fpn_anchors(feature_sizes: list[tuple[int, int]],
                device: torch.device | str | None = None) -> list[torch.Tensor]:
    """The anchors of each FPN level P2..P6 [H_l * W_l * 3, 4], given the levels' feature
    map sizes ``(H_l, W_l)``."""
    return [grid_anchors(cell_anchors(stride, size).to(device), stride, feature_size)
            for stride, size, feature_size in zip(ANCHOR_STRIDES, ANCHOR_SIZES, feature_sizes,
                                                  strict=True)]


def visible(anchors: torch.Tensor, image_size: tuple[int, int] | torch.Tensor,
            straddle_thresh: float = STRADDLE_THRESH) -> torch.Tensor:
    """Which anchors [K, 4] lie inside an image of ``(height, width)`` (or of each of sizes
    [..., 2], giving [..., K]), allowing ``straddle_thresh`` pixels outside
    (``add_visibility_to``); the RPN loss ignores the others. A negative threshold makes
    every anchor visible."""
    size = torch.as_tensor(image_size, device=anchors.device)
    if straddle_thresh < 0:
        return torch.ones((*size.shape[:-1], len(anchors)), dtype=torch.bool,
                          device=anchors.device)
    height, width = size[..., 0, None], size[..., 1, None]
    return ((anchors[:, 0] >= -straddle_thresh) & (anchors[:, 1] >= -straddle_thresh)
            & (anchors[:, 2] < width + straddle_thresh)
            & (anchors[:, 3] < height + straddle_thresh))
