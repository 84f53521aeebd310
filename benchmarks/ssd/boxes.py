"""Default boxes, box coding, matching and NMS of the MLPerf 1.1 SSD reference
(mlcommons/training ``single_stage_detector/ssd/utils.py``: ``DefaultBoxes``,
``dboxes300_coco``, ``calc_iou_tensor``, ``Encoder.encode``/``decode_batch``; the loss's
``_loc_vec`` in ``base_model.py``), batched over images with fixed shapes.

Boxes are relative to the image (0..1), ``xywh`` (centre, size) or ``ltrb``. Matching
and NMS take every image of a batch at once with no data-dependent shape and no host
synchronisation: ground truths are padded to a fixed count with a validity mask, and
detections come back as a fixed number per image with a validity mask.
"""

from __future__ import annotations

import itertools
import math

import torch

FIG_SIZE = 300
FEATURE_SIZES = (38, 19, 10, 5, 3, 1)
STEPS = (8, 16, 32, 64, 100, 300)
SCALES = (21, 45, 99, 153, 207, 261, 315)
ASPECT_RATIOS = ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,))
SCALE_XY, SCALE_WH = 0.1, 0.2     # the box coding's variances
MATCH_IOU = 0.5                   # Encoder.encode's ``criteria``
NMS_IOU = 0.5                     # coco_eval's ``overlap_threshold``
NMS_SCORE = 0.05                  # --nms-valid-thresh
NMS_TOPK = 200                    # decode_single's ``max_num``: candidates per class
MAX_DETECTIONS = 200              # coco_eval's ``nms_max_detections``: kept per image


def dboxes300_coco() -> torch.Tensor:
    """The 8732 default boxes [8732, 4] xywh, float32, in the model's output order: per
    feature map, per box size (the scale, the geometric mean with the next scale, then
    each aspect ratio and its inverse), per row, per column. Centres and sizes are clamped
    to [0, 1] (as the reference does; the ltrb form may then leave the image)."""
    boxes = []
    for idx, sfeat in enumerate(FEATURE_SIZES):
        fk = FIG_SIZE / STEPS[idx]
        sk1, sk2 = SCALES[idx] / FIG_SIZE, SCALES[idx + 1] / FIG_SIZE
        sk3 = math.sqrt(sk1 * sk2)
        sizes = [(sk1, sk1), (sk3, sk3)]
        for alpha in ASPECT_RATIOS[idx]:
            w, h = sk1 * math.sqrt(alpha), sk1 / math.sqrt(alpha)
            sizes += [(w, h), (h, w)]
        for w, h in sizes:
            for i, j in itertools.product(range(sfeat), repeat=2):
                boxes.append(((j + 0.5) / fk, (i + 0.5) / fk, w, h))
    return torch.tensor(boxes, dtype=torch.float32).clamp_(0, 1)


def xywh_to_ltrb(b: torch.Tensor) -> torch.Tensor:
    xy, wh = b[..., :2], b[..., 2:]
    return torch.cat((xy - 0.5 * wh, xy + 0.5 * wh), -1)


def ltrb_to_xywh(b: torch.Tensor) -> torch.Tensor:
    lt, rb = b[..., :2], b[..., 2:]
    return torch.cat((0.5 * (lt + rb), rb - lt), -1)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of ltrb boxes ``a`` [..., N, 4] and ``b`` [..., M, 4] -> [..., N, M]. Elementwise
    only: the overlap's width times its height, not a ``prod`` over the pair, which eagerly
    is a reduction kernel over an ``[..., N, M, 2]`` intermediate."""
    a, b = a.unsqueeze(-2), b.unsqueeze(-3)
    wh = (torch.minimum(a[..., 2:], b[..., 2:]) - torch.maximum(a[..., :2], b[..., :2]))
    wh = wh.clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    return inter / (area_a + area_b - inter)


def encode(boxes: torch.Tensor, dboxes: torch.Tensor) -> torch.Tensor:
    """xywh boxes [..., A, 4] -> regression targets relative to the default boxes [A, 4]."""
    xy = (boxes[..., :2] - dboxes[:, :2]) / dboxes[:, 2:] / SCALE_XY
    wh = (boxes[..., 2:] / dboxes[:, 2:]).log() / SCALE_WH
    return torch.cat((xy, wh), -1)


def decode(offsets: torch.Tensor, dboxes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`encode`: offsets [..., A, 4] -> xywh boxes."""
    xy = SCALE_XY * offsets[..., :2] * dboxes[:, 2:] + dboxes[:, :2]
    wh = (SCALE_WH * offsets[..., 2:]).exp() * dboxes[:, 2:]
    return torch.cat((xy, wh), -1)


def dense_overlaps(gt_boxes: torch.Tensor, gt_valid: torch.Tensor, dboxes_ltrb: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What matching needs of the IoUs, from the full [B, M, A] matrix: each default box's
    best IoU [B, A] and its ground truth [B, A] (padding scores -1, below any real ground
    truth, so it never wins one), and each ground truth's best default box [B, M] (0 for
    padding); the first of equal maxima in each."""
    ious = box_iou(gt_boxes, dboxes_ltrb).masked_fill(~gt_valid.unsqueeze(-1), -1.0)
    best_dbox_ious, best_dbox_idx = ious.max(dim=1)
    return best_dbox_ious, best_dbox_idx, ious.argmax(dim=2)


def match(gt_boxes: torch.Tensor, gt_labels: torch.Tensor, gt_valid: torch.Tensor,
          dboxes: torch.Tensor, criteria: float = MATCH_IOU, overlaps=dense_overlaps
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Training targets for a batch, as ``Encoder.encode`` gives them for each image.

    ``gt_boxes`` [B, M, 4] ltrb, ``gt_labels`` [B, M] (1..C-1), ``gt_valid`` [B, M] marks
    the real ground truths among the padding (M >= 1, also for a batch without any);
    ``dboxes`` [A, 4] xywh. Each default box takes the ground truth it overlaps most;
    each ground truth also takes its own best default box whatever the overlap (the later
    ground truth wins when two share one, as the reference's sequential assignment does).
    Default boxes left with IoU <= ``criteria`` are background (label 0) and get their own
    box as target. ``overlaps`` computes the IoUs' maxima: :func:`dense_overlaps`, or
    ``benchmarks.ssd.match_triton.fused_overlaps`` on the GPU. Returns (boxes [B, A, 4]
    xywh, labels [B, A] int64).
    """
    dboxes_ltrb = xywh_to_ltrb(dboxes)
    best_dbox_ious, best_dbox_idx, best_bbox_idx = overlaps(gt_boxes, gt_valid, dboxes_ltrb)
    gt_index = torch.arange(gt_boxes.shape[1], device=gt_boxes.device).expand_as(gt_labels)
    # "amax" makes the later ground truth win deterministically (a plain scatter would not)
    forced = torch.full_like(best_dbox_idx, -1).scatter_reduce(
        1, best_bbox_idx, torch.where(gt_valid, gt_index, -1), "amax")
    is_forced = forced >= 0
    best_dbox_idx = torch.where(is_forced, forced, best_dbox_idx)
    positive = is_forced | (best_dbox_ious > criteria)
    labels = torch.where(positive, gt_labels.gather(1, best_dbox_idx), 0)
    matched = gt_boxes.gather(1, best_dbox_idx.unsqueeze(-1).expand(-1, -1, 4))
    boxes = torch.where(positive.unsqueeze(-1), matched, dboxes_ltrb)
    return ltrb_to_xywh(boxes), labels


def nms_keep(boxes: torch.Tensor, valid: torch.Tensor, criteria: float) -> torch.Tensor:
    """Greedy NMS over candidates sorted by descending score: ``boxes`` [..., K, 4] ltrb,
    ``valid`` [..., K]. A candidate is kept unless a kept, higher-scoring one overlaps it
    with IoU >= ``criteria``. K steps, each over every leading index at once."""
    suppresses = box_iou(boxes, boxes) >= criteria
    keep = valid.clone()
    for i in range(boxes.shape[-2]):
        # candidate i is final now: only the higher-scoring ones before it could drop it
        later = suppresses[..., i, i + 1:] & keep[..., i:i + 1]
        keep[..., i + 1:] &= ~later
    return keep


def decode_batch(ploc: torch.Tensor, plabel: torch.Tensor, dboxes: torch.Tensor,
                 criteria: float = NMS_IOU, max_output: int = MAX_DETECTIONS,
                 max_num: int = NMS_TOPK, nms_valid_thresh: float = NMS_SCORE,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Detections from the model's outputs, as ``Encoder.decode_batch`` finds them.

    ``ploc`` [B, 4, A], ``plabel`` [B, C, A], ``dboxes`` [A, 4] xywh. Per image and
    foreground class: the boxes scoring above ``nms_valid_thresh`` (softmax), the best
    ``max_num`` of them, greedy NMS at IoU ``criteria``; then the best ``max_output`` over
    all classes. Returns boxes [B, max_output, 4] ltrb, labels [B, max_output],
    scores [B, max_output] (descending) and valid [B, max_output] (False: padding).
    """
    bboxes = xywh_to_ltrb(decode(ploc.float().transpose(1, 2), dboxes))       # [B, A, 4]
    probs = plabel.float().softmax(dim=1)[:, 1:]                               # [B, C-1, A]
    b, c = probs.shape[:2]
    k = min(max_num, probs.shape[2])
    scores, idx = probs.topk(k, dim=2)                                         # [B, C-1, k]
    cand = bboxes.gather(1, idx.reshape(b, -1, 1).expand(-1, -1, 4)).reshape(b, c, k, 4)
    keep = nms_keep(cand, scores > nms_valid_thresh, criteria)
    scores = torch.where(keep, scores, -1.0).reshape(b, -1)
    n = min(max_output, scores.shape[1])
    top_scores, top = scores.topk(n, dim=1)
    labels = top // k + 1
    top_boxes = cand.reshape(b, -1, 4).gather(1, top.unsqueeze(-1).expand(-1, -1, 4))
    return top_boxes, labels, top_scores.clamp(min=0), top_scores >= 0
