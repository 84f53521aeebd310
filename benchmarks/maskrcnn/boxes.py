"""Box coding, IoU, clipping, NMS and matching of the MLPerf 1.1 Mask R-CNN reference
(mlcommons/training ``object_detection/pytorch/maskrcnn_benchmark``: ``modeling/box_coder.py``,
``structures/boxlist_ops.py``, ``structures/bounding_box.py``, ``csrc/cuda/nms.cu``,
``modeling/matcher.py``).

Boxes are ``x1, y1, x2, y2`` in pixels with both ends inclusive, as in maskrcnn-benchmark:
a box spans ``x2 - x1 + 1`` pixels (its ``TO_REMOVE = 1``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

TO_REMOVE = 1                               # the inclusive-pixel convention's extra pixel
BBOX_XFORM_CLIP = math.log(1000.0 / 16)     # largest log-scale change decode lets through
RPN_BOX_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
ROI_BOX_WEIGHTS = (10.0, 10.0, 5.0, 5.0)    # MODEL.ROI_HEADS.BBOX_REG_WEIGHTS
# greedy NMS of padded rows of boxes: (boxes [G, W, 4], valid [G, W], IoU threshold) ->
# survivors [G, W] (bool)
Keep = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def _sizes_and_centres(boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(widths, heights, centre x, centre y) of boxes [..., 4]."""
    widths = boxes[..., 2] - boxes[..., 0] + TO_REMOVE
    heights = boxes[..., 3] - boxes[..., 1] + TO_REMOVE
    return widths, heights, boxes[..., 0] + 0.5 * widths, boxes[..., 1] + 0.5 * heights


class BoxCoder:
    """Regression codes ``(dx, dy, dw, dh)`` of boxes relative to reference boxes, scaled by
    ``weights`` (``wx, wy, ww, wh``); decode clamps ``dw, dh`` at ``bbox_xform_clip``."""

    def __init__(self, weights: tuple[float, float, float, float],
                 bbox_xform_clip: float = BBOX_XFORM_CLIP):
        self.weights = weights
        self.bbox_xform_clip = bbox_xform_clip

    def encode(self, reference_boxes: torch.Tensor, proposals: torch.Tensor) -> torch.Tensor:
        """Codes [N, 4] that move ``proposals`` [N, 4] onto ``reference_boxes`` [N, 4]."""
        ex_w, ex_h, ex_x, ex_y = _sizes_and_centres(proposals)
        gt_w, gt_h, gt_x, gt_y = _sizes_and_centres(reference_boxes)
        wx, wy, ww, wh = self.weights
        return torch.stack((wx * (gt_x - ex_x) / ex_w, wy * (gt_y - ex_y) / ex_h,
                            ww * torch.log(gt_w / ex_w), wh * torch.log(gt_h / ex_h)), dim=1)

    def decode(self, rel_codes: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Boxes [N, 4k] from codes [N, 4k] (k boxes per row, e.g. one per class) applied to
        ``boxes`` [N, 4]. The ``- 1`` on x2, y2 makes decode invert encode exactly."""
        boxes = boxes.to(rel_codes.dtype)
        widths, heights, ctr_x, ctr_y = (t[:, None] for t in _sizes_and_centres(boxes))
        codes = rel_codes.reshape(len(rel_codes), rel_codes.shape[-1] // 4, 4)
        wx, wy, ww, wh = self.weights
        dw = (codes[..., 2] / ww).clamp(max=self.bbox_xform_clip)
        dh = (codes[..., 3] / wh).clamp(max=self.bbox_xform_clip)
        pred_x = codes[..., 0] / wx * widths + ctr_x
        pred_y = codes[..., 1] / wy * heights + ctr_y
        half_w = 0.5 * (torch.exp(dw) * widths)
        half_h = 0.5 * (torch.exp(dh) * heights)
        pred = torch.stack((pred_x - half_w, pred_y - half_h,
                            pred_x + half_w - 1, pred_y + half_h - 1), dim=-1)
        return pred.reshape(rel_codes.shape)


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Areas of boxes [..., 4] -> [...] (``BoxList.area``)."""
    widths, heights, _, _ = _sizes_and_centres(boxes)
    return widths * heights


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of boxes a [..., N, 4] and b [..., M, 4] -> [..., N, M] (``boxlist_iou``)."""
    lt = torch.maximum(a[..., :, None, :2], b[..., None, :, :2])
    rb = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    wh = (rb - lt + TO_REMOVE).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (box_area(a)[..., :, None] + box_area(b)[..., None, :] - inter)


def clip_boxes(boxes: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """Boxes [..., 4] clamped into an image of ``(height, width)``: x in [0, width - 1],
    y in [0, height - 1] (``BoxList.clip_to_image``)."""
    height, width = image_size
    upper = boxes.new_tensor([width, height, width, height]) - TO_REMOVE
    return torch.minimum(boxes.clamp(min=0), upper)


def min_size_mask(boxes: torch.Tensor, min_size: float) -> torch.Tensor:
    """Which boxes [..., 4] have both sides at least ``min_size`` pixels (the boxes that
    ``remove_small_boxes`` keeps)."""
    widths, heights, _, _ = _sizes_and_centres(boxes)
    return (widths >= min_size) & (heights >= min_size)


def _greedy_keep(suppresses: torch.Tensor) -> torch.Tensor:
    """Greedy NMS given ``suppresses`` [..., K, K], where [j, i] says that box j ranks before
    box i and overlaps it too much: box i survives unless a surviving box suppresses it.

    Settled in rounds over every box at once: a box is kept once every box that could
    suppress it is removed, and removed once a kept box suppresses it. Each round settles
    at least the first unsettled box and in practice many more: the rounds follow the
    longest chain of suppressions, one host synchronisation each. Returns [..., K] bool."""
    kept = torch.zeros(suppresses.shape[:-1], dtype=torch.bool, device=suppresses.device)
    removed = torch.zeros_like(kept)
    settled = 0
    while settled < kept.numel():
        kept = ~removed & ~(suppresses & ~removed[..., None]).any(-2)
        removed = removed | (suppresses & kept[..., None]).any(-2)
        settled, before = int((kept | removed).sum()), settled
        if settled == before:
            raise RuntimeError("NMS made no progress: the suppressions are not ordered")
    return kept


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor,
                iou_threshold: float, keep: Keep | None = None) -> torch.Tensor:
    """Indices of the boxes [K, 4] that greedy NMS keeps within each category ``idxs`` [K],
    by decreasing score. As the reference's CUDA kernel, a box is suppressed by a kept,
    higher-scoring box of its category whose IoU with it is strictly above the threshold.
    (The reference returns the kept indices in index order; its RPN passes boxes sorted by
    score, where the two orders agree.)

    The categories are padded to a common length, best first, and ``keep`` (default
    :func:`nms_keep`; on the GPU :func:`benchmarks.maskrcnn.nms_triton.nms_keep`) settles
    them all in one call."""
    order = scores.argsort(descending=True, stable=True)
    order = order[idxs[order].argsort(stable=True)]         # by category, then by score
    _, group, counts = torch.unique_consecutive(idxs[order], return_inverse=True,
                                                return_counts=True)
    rank = torch.arange(len(order), device=boxes.device) - (counts.cumsum(0) - counts)[group]
    width = int(counts.max()) if len(counts) else 0
    padded = boxes.new_zeros(len(counts), width, 4)
    padded[group, rank] = boxes[order]
    valid = torch.zeros(len(counts), width, dtype=torch.bool, device=boxes.device)
    valid[group, rank] = True
    kept = order[(keep or nms_keep)(padded, valid, iou_threshold)[group, rank]]
    return kept[scores[kept].argsort(descending=True, stable=True)]


def nms_keep(padded: torch.Tensor, valid: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS of each row of boxes [G, W, 4], best first, of which ``valid`` [G, W]
    marks the real ones: which boxes survive [G, W] (bool; padding's entries are
    meaningless). Pure PyTorch: the IoU of every pair, then :func:`_greedy_keep`, so the
    work is G x W^2."""
    width = padded.shape[1]
    earlier = torch.ones(width, width, dtype=torch.bool, device=padded.device).triu(1)
    suppresses = (box_iou(padded, padded) > iou_threshold) & earlier & valid[:, :, None]
    return _greedy_keep(suppresses)


class Matcher:
    """Assigns each prediction the ground truth it overlaps most, given an IoU matrix
    [M ground truths, N predictions]: the ground truth's index when the IoU is at least
    ``high_threshold``, ``BETWEEN_THRESHOLDS`` when it is at least ``low_threshold``,
    ``BELOW_LOW_THRESHOLD`` otherwise. With ``allow_low_quality_matches``, the predictions
    that are some ground truth's best (ties included) keep their best ground truth whatever
    the IoU (RPN: 0.7, 0.3 and True; box and mask heads: 0.5, 0.5 and False)."""

    BELOW_LOW_THRESHOLD = -1
    BETWEEN_THRESHOLDS = -2

    def __init__(self, high_threshold: float, low_threshold: float,
                 allow_low_quality_matches: bool = False):
        if low_threshold > high_threshold:
            raise ValueError(f"low_threshold {low_threshold} > high_threshold {high_threshold}")
        self.high_threshold = high_threshold
        self.low_threshold = low_threshold
        self.allow_low_quality_matches = allow_low_quality_matches

    def __call__(self, match_quality_matrix: torch.Tensor,
                 valid: torch.Tensor | None = None) -> torch.Tensor:
        """Matches [..., N] (int64) for a quality matrix [..., M, N]; ``valid`` [..., M] marks
        the real ground truths of a padded batch (a row of none matches nothing)."""
        if match_quality_matrix.shape[-2] == 0 or match_quality_matrix.shape[-1] == 0:
            missing = "ground-truth" if match_quality_matrix.shape[-2] == 0 else "proposal"
            raise ValueError(f"No {missing} boxes available for one of the images")
        if valid is not None:
            match_quality_matrix = torch.where(valid[..., None], match_quality_matrix, -1.0)
        matched_vals, best = match_quality_matrix.max(dim=-2)
        matches = torch.where(matched_vals >= self.high_threshold, best,
                              torch.where(matched_vals >= self.low_threshold,
                                          self.BETWEEN_THRESHOLDS, self.BELOW_LOW_THRESHOLD))
        if self.allow_low_quality_matches:
            best_per_gt = match_quality_matrix.max(dim=-1, keepdim=True).values
            is_best = match_quality_matrix == best_per_gt
            if valid is not None:
                is_best &= valid[..., None]
            matches = torch.where(is_best.any(dim=-2), best, matches)
        return matches
