"""The second stage of the MLPerf Training 1.1 Mask R-CNN: RoI sampling, box and mask losses, and
test-time post-processing (mlcommons/training v1.1 ``object_detection/pytorch/maskrcnn_benchmark``:
``modeling/balanced_positive_negative_sampler.py``, ``modeling/roi_heads/box_head/{loss,
inference}.py``, ``modeling/roi_heads/mask_head/{loss,inference,mask_head}.py``,
``data/datasets/evaluation/coco/coco_eval.py``; values from ``config/defaults.py`` and
``configs/e2e_mask_rcnn_R_50_FPN_1x.yaml``).

Boxes are ``x1, y1, x2, y2`` with inclusive pixels (:mod:`benchmarks.maskrcnn.boxes`); image
sizes are ``(height, width)``; labels are contiguous, 1..C-1 for objects and 0 for background.
Losses, probabilities and box decoding are computed in float32 whatever dtype (autocast) the
heads' outputs have.

Training:
- :class:`RoISampler`, every image at once: each image's proposals (the RPN appends the
  image's ground-truth boxes to them, as the reference's RPN does in training) are matched
  to the ground truth at IoU 0.5 (``Matcher(0.5, 0.5)``, no low-quality matches): the
  matched box's label, background below 0.5. Then 512 RoIs at random, at most a quarter
  positive (``BATCH_SIZE_PER_IMAGE``, ``POSITIVE_FRACTION``), drawn as
  :mod:`benchmarks.maskrcnn.sampler` draws them (the reference's distribution, other random
  numbers) and kept in the proposals' order, the batch's counts read in one host sync;
  regression targets with weights 10, 10, 5, 5.
- :func:`box_loss`: cross-entropy over the sampled RoIs, and smooth L1 (beta 1, as the box
  head passes it) summed over the positives' deltas of their own class, divided by the number
  of sampled RoIs of the batch.
- :func:`mask_targets` and :func:`mask_loss`: binary cross-entropy with logits on the GT class's
  28 x 28 channel of each positive RoI, mean over pixels and RoIs (0, with a graph, without
  positives). The reference crops the matched polygon to the RoI, scales it to 28 x 28 and
  rasterises it (pycocotools), so a cell is set when its centre, at
  ``x1 + (j + 0.5) (x2 - x1) / 28``, lies inside the polygon. Here the ground truth comes as
  full-image binary masks, so the target is RoIAlign (2 x 2 samples per cell) of the matched
  mask over the RoI, thresholded at >= 0.5. The RoI is shifted by half a pixel, since
  RoIAlign reads pixel ``i`` at coordinate ``i`` while the polygon holds its centre at
  ``i + 0.5``: the cells then sample the places the reference's cell centres test. The
  differences: the mask is the polygon already rasterised at the training resolution, and a
  cell averages 4 bilinear samples where the reference tests one point, which moves a
  boundary cell by at most a fraction of a pixel of the image.

Test:
- :func:`postprocess_boxes` (``PostProcessor``): softmax, class-specific decode of every
  proposal, clip to the image, scores above 0.05, NMS at 0.5 within each class, the best 100
  of the image. The reference keeps every detection whose score ties the 100th (its
  ``kthvalue`` cut); this keeps 100.
- :func:`paste_masks` (``Masker``): the predicted class's 28 x 28 probabilities, padded by one
  zero cell, resized bilinearly (``align_corners=False``) onto the box grown by 30/28 about its
  centre with its corners truncated to integers, thresholded above 0.5, in the image at its
  original size; :func:`postprocess_masks` first scales the boxes from the resized image back
  to the original one (``BoxList.resize``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from benchmarks.maskrcnn.boxes import (
    ROI_BOX_WEIGHTS,
    BoxCoder,
    Keep,
    Matcher,
    batched_nms,
    box_iou,
    clip_boxes,
)
from benchmarks.maskrcnn.roi_align import SAMPLING_RATIO, roi_align
from benchmarks.maskrcnn.sampler import balanced_sample

BATCH_SIZE_PER_IMAGE = 512      # MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE
POSITIVE_FRACTION = 0.25        # MODEL.ROI_HEADS.POSITIVE_FRACTION
FG_IOU_THRESHOLD = 0.5          # MODEL.ROI_HEADS.FG_IOU_THRESHOLD
BG_IOU_THRESHOLD = 0.5          # MODEL.ROI_HEADS.BG_IOU_THRESHOLD
BOX_LOSS_BETA = 1.0             # box_head/loss.py's smooth_l1_loss(..., beta=1)
SCORE_THRESH = 0.05             # MODEL.ROI_HEADS.SCORE_THRESH
NMS_THRESH = 0.5                # MODEL.ROI_HEADS.NMS
DETECTIONS_PER_IMG = 100        # MODEL.ROI_HEADS.DETECTIONS_PER_IMG
MASK_SIZE = 28                  # MODEL.ROI_MASK_HEAD.RESOLUTION
MASK_THRESHOLD = 0.5            # Masker(threshold=0.5, padding=1) in coco_eval.py
MASK_PADDING = 1
TARGET_THRESHOLD = 0.5          # a mask-target cell is 1 where RoIAlign gives at least this

Tensor = torch.Tensor


@dataclass
class Positives:
    """The positive samples as the mask head takes them, in the samples' order: ``rois``
    [P, 5], ``labels`` [P] and ``matched_idxs`` [P]. Rows of label -1 past them are padding
    (a zero box on image 0, ground truth 0), which the mask loss leaves out."""
    rois: Tensor
    labels: Tensor
    matched_idxs: Tensor

    def first(self, rows: int) -> Positives:
        return Positives(self.rois[:rows], self.labels[:rows], self.matched_idxs[:rows])


@dataclass
class RoISamples:
    """The sampled RoIs of a batch, image after image: ``rois`` [S, 5] (image index, box),
    ``labels`` [S] (int64, 0 for background), ``regression_targets`` [S, 4] (float32; those
    of background RoIs are unused), ``matched_idxs`` [S] (the ground truth's index among the
    batch's real ones in order, -1 for background), and ``positives``, the fields of the
    positive ones (label > 0) in their order."""
    rois: Tensor
    labels: Tensor
    regression_targets: Tensor
    matched_idxs: Tensor
    positives: Positives

    def first(self, rows: int, positives: int) -> RoISamples:
        """The fields' first ``rows`` rows and the first ``positives`` positives."""
        return RoISamples(self.rois[:rows], self.labels[:rows], self.regression_targets[:rows],
                          self.matched_idxs[:rows], self.positives.first(positives))


class RoISampler:
    """Matches proposals to ground truth and samples the RoIs the box head trains on
    (``FastRCNNLossComputation.subsample`` with ``BalancedPositiveNegativeSampler``, as
    :func:`benchmarks.maskrcnn.sampler.balanced_sample` draws it), every image at once."""

    def __init__(self, batch_size_per_image: int = BATCH_SIZE_PER_IMAGE,
                 positive_fraction: float = POSITIVE_FRACTION,
                 fg_iou_threshold: float = FG_IOU_THRESHOLD,
                 bg_iou_threshold: float = BG_IOU_THRESHOLD,
                 box_weights: tuple[float, float, float, float] = ROI_BOX_WEIGHTS):
        self.batch_size_per_image = batch_size_per_image
        self.positive_fraction = positive_fraction
        self.matcher = Matcher(fg_iou_threshold, bg_iou_threshold,
                               allow_low_quality_matches=False)
        self.box_coder = BoxCoder(box_weights)

    def __call__(self, proposals: Tensor, valid: Tensor, gt_boxes: Tensor, gt_labels: Tensor,
                 generator: torch.Generator | None = None) -> RoISamples:
        """Samples of the padded proposals [B, K, 4] whose real ones ``valid`` [B, K] marks,
        given the padded ground truth, boxes [B, G, 4] and labels [B, G] (0: padding);
        ``generator`` (on the proposals' device) or the global one draws them. An image
        without ground truth gives background RoIs only. One host sync: the counts."""
        samples, counts = self.padded(proposals, valid, gt_boxes, gt_labels, generator)
        return samples.first(*counts.tolist())

    def padded(self, proposals: Tensor, valid: Tensor, gt_boxes: Tensor, gt_labels: Tensor,
               generator: torch.Generator | None = None) -> tuple[RoISamples, Tensor]:
        """:meth:`__call__`'s samples before the host knows their counts, and the counts [2]
        (sampled RoIs, positives) on the device: each field has ``B * K + 1`` rows, the
        samples' first, then rows of label -1 (a zero box and targets), and the last row
        spare (any value); ``positives`` holds the positives' fields first."""
        if gt_labels.shape[1] == 0:                 # a batch without ground truth: one pad
            gt_boxes, gt_labels = gt_boxes.new_zeros(len(valid), 1, 4), gt_labels.new_zeros(
                len(valid), 1)
        boxes, gt_valid = proposals.float(), gt_labels > 0
        gt = gt_boxes.to(boxes)
        matches = self.matcher(box_iou(gt, boxes), gt_valid)
        foreground = matches >= 0
        positive, negative = balanced_sample(
            valid & foreground, valid & (matches == Matcher.BELOW_LOW_THRESHOLD),
            self.batch_size_per_image, self.positive_fraction, generator)
        # Every candidate's fields, and its row among the samples, are made before the sync,
        # while the GPU is still busy with the work before it; after the sync only views of
        # the first rows remain, so the host goes straight on to the heads.
        images = torch.arange(len(boxes), device=boxes.device)[:, None].expand_as(matches)
        matched = matches.clamp(min=0)
        labels = torch.where(foreground, gt_labels.gather(1, matched).long(), 0)
        targets = self.box_coder.encode(gt[images, matched].flatten(0, 1), boxes.flatten(0, 1))
        index = gt_valid.flatten().cumsum(0).view_as(gt_valid) - 1     # among the real ones
        matched_idxs = torch.where(foreground, index.gather(1, matched), -1)
        rois = torch.cat((images[..., None].to(boxes), boxes), dim=2).flatten(0, 1)
        sampled, positive = (positive | negative).flatten(), positive.flatten()
        labels, matched_idxs = labels.flatten(), matched_idxs.flatten()
        row, positive_row = _rows(sampled), _rows(positive)
        fields = [_placed(t, row, fill) for t, fill in (
            (rois, 0), (labels, -1), (targets, 0), (matched_idxs, -1))]
        positives = Positives(*(_placed(t, positive_row, fill) for t, fill in (
            (rois, 0), (labels, -1), (matched_idxs, 0))))
        return (RoISamples(*fields, positives),
                torch.stack((sampled.sum(), positive.sum())))


def _rows(chosen: Tensor) -> Tensor:
    """Each entry's row among the ``chosen`` [N] ones, in order; ``N`` (a spare row) for the
    others."""
    return torch.where(chosen, chosen.cumsum(0) - 1, len(chosen))


def _placed(values: Tensor, rows: Tensor, fill: float) -> Tensor:
    """``values`` [N, ...] written to ``rows`` [N] of a new [N + 1, ...] tensor of ``fill``
    (row N, the spare, takes whatever is left over)."""
    return values.new_full((len(values) + 1, *values.shape[1:]), fill).index_copy_(0, rows,
                                                                                  values)


def box_loss(class_logits: Tensor, box_regression: Tensor, labels: Tensor,
             regression_targets: Tensor, beta: float = BOX_LOSS_BETA) -> tuple[Tensor, Tensor]:
    """``(classification loss, box regression loss)``, float32 scalars, of the box head's
    outputs for the sampled RoIs of the batch: logits [S, C], deltas [S, 4C], labels [S] and
    targets [S, 4] (the images' samples concatenated). Rows of label -1 are padding, left
    out of both losses and of the count they are divided by."""
    classification = F.cross_entropy(class_logits.float(), labels, ignore_index=-1)
    deltas = _of_label(box_regression.float().reshape(len(labels), -1, 4), labels)
    per_roi = F.smooth_l1_loss(deltas, regression_targets.float(), reduction="none",
                               beta=beta).sum(dim=1)
    regression = torch.where(labels > 0, per_roi, 0.0).sum() / (labels >= 0).sum()
    return classification, regression


def mask_targets(rois: Tensor, matched_idxs: Tensor, gt_masks: Tensor,
                 size: int = MASK_SIZE) -> Tensor:
    """Binary targets [P, size, size] (float32) of the positive RoIs [P, 4] from the indices
    [P] of their ground truths among the batch's masks [G, H, W] (uint8, the padded training
    resolution): one RoIAlign over all images, read from the masks as they are."""
    rois = torch.cat((matched_idxs[:, None].float(), rois.float() - 0.5), dim=1)
    pooled = roi_align(gt_masks[:, None], rois, size, 1.0, SAMPLING_RATIO)
    return (pooled[:, 0] >= TARGET_THRESHOLD).float()


def mask_loss(mask_logits: Tensor, labels: Tensor, targets: Tensor) -> Tensor:
    """Binary cross-entropy (float32 scalar) of the mask logits [P, C, M, M] of positive RoIs
    on their labels' [P] channels against ``targets`` [P, M, M], the mean over the pixels of
    the RoIs whose label is not -1 (padding); ``0 * sum`` of the logits, keeping the graph,
    when there are no RoIs."""
    if len(labels) == 0:
        return mask_logits.float().sum() * 0
    per_pixel = F.binary_cross_entropy_with_logits(_of_label(mask_logits.float(), labels),
                                                   targets.float(), reduction="none")
    real = labels >= 0
    return (torch.where(real[:, None, None], per_pixel, 0.0).sum()
            / (real.sum() * per_pixel[0].numel()))


def _of_label(values: Tensor, labels: Tensor) -> Tensor:
    """``values`` [N, C, ...] on each row's label's [N] channel, [N, ...] (zeros for label
    -1): the others masked out and summed away, exactly, so that the gradient is a masked
    copy rather than the scatter into zeros that advanced indexing compiles to."""
    channel = torch.arange(values.shape[1], device=values.device)
    match = channel.view(1, -1, *[1] * (values.dim() - 2)) == labels.view(
        -1, *[1] * (values.dim() - 1))
    return torch.where(match, values, 0.0).sum(dim=1)


class ImageDetections(NamedTuple):
    """One image's detections, best first: ``boxes`` [N, 4], ``scores`` [N], ``labels`` [N]
    (int64) and, once pasted, ``masks`` [N, H, W] (uint8)."""
    boxes: Tensor
    scores: Tensor
    labels: Tensor
    masks: Tensor | None = None


def postprocess_boxes(class_logits: Tensor, box_regression: Tensor, proposals: list[Tensor],
                      image_sizes: list[tuple[int, int]], score_threshold: float = SCORE_THRESH,
                      nms_threshold: float = NMS_THRESH,
                      detections_per_image: int = DETECTIONS_PER_IMG,
                      box_weights: tuple[float, float, float, float] = ROI_BOX_WEIGHTS,
                      nms_keep: Keep | None = None) -> list[ImageDetections]:
    """Detections of each image, in the resized image's pixels, from the box head's logits
    [K, C] and deltas [K, 4C] for the images' test proposals [K_i, 4] (concatenated in order),
    clipped to the resized images' ``(height, width)``. One :func:`boxes.batched_nms` covers
    every image and class, ``nms_keep`` its greedy step (default: the pure-PyTorch one)."""
    counts = [len(p) for p in proposals]
    probs = F.softmax(class_logits.float(), dim=-1)
    num_classes = probs.shape[1]
    decoded = BoxCoder(box_weights).decode(box_regression.float(),
                                           torch.cat(proposals).float())
    decoded = torch.cat([clip_boxes(b.reshape(-1, num_classes, 4), size)
                         for b, size in zip(decoded.split(counts), image_sizes, strict=True)])
    image = torch.repeat_interleave(torch.arange(len(counts), device=probs.device),
                                    torch.tensor(counts, device=probs.device),
                                    output_size=sum(counts))
    roi, label = torch.nonzero(probs[:, 1:] > score_threshold, as_tuple=True)
    label = label + 1
    boxes, scores, image = decoded[roi, label], probs[roi, label], image[roi]
    keep = batched_nms(boxes, scores, image * num_classes + label, nms_threshold, nms_keep)
    keep = keep[image[keep].argsort(stable=True)]           # by image, each best first
    per_image = torch.bincount(image[keep], minlength=len(counts))
    starts = per_image.cumsum(0) - per_image
    rank = torch.arange(len(keep), device=keep.device) - starts[image[keep]]
    keep = keep[rank < detections_per_image]
    sizes = per_image.clamp(max=detections_per_image).tolist()
    return [ImageDetections(*parts) for parts in zip(boxes[keep].split(sizes),
                                                      scores[keep].split(sizes),
                                                      label[keep].split(sizes))]


def scale_boxes(boxes: Tensor, from_size: tuple[int, int], to_size: tuple[int, int]) -> Tensor:
    """Boxes [N, 4] of an image of ``from_size`` in an image of ``to_size`` (both
    ``(height, width)``): x times the ratio of widths, y of heights (``BoxList.resize``)."""
    ratio_w, ratio_h = to_size[1] / from_size[1], to_size[0] / from_size[0]
    return boxes * boxes.new_tensor([ratio_w, ratio_h, ratio_w, ratio_h])


def mask_probabilities(mask_logits: Tensor, labels: Tensor) -> Tensor:
    """Sigmoid [N, M, M] (float32) of the mask logits [N, C, M, M] on the labels' [N]
    channels."""
    rows = torch.arange(len(labels), device=labels.device)
    return mask_logits[rows, labels].float().sigmoid()


def _expanded_corners(boxes: Tensor, scale: float) -> tuple[Tensor, ...]:
    """The Masker's box grown by ``scale`` about its centre, corners truncated towards zero
    (int64), in its float32 arithmetic: ``(x1, y1, x2, y2)``."""
    boxes = boxes.float()
    half_w = (boxes[:, 2] - boxes[:, 0]) * 0.5 * scale
    half_h = (boxes[:, 3] - boxes[:, 1]) * 0.5 * scale
    centre_x = (boxes[:, 2] + boxes[:, 0]) * 0.5
    centre_y = (boxes[:, 3] + boxes[:, 1]) * 0.5
    corners = (centre_x - half_w, centre_y - half_h, centre_x + half_w, centre_y + half_h)
    return tuple(c.to(torch.int32).long() for c in corners)


def _resize_taps(start: Tensor, end: Tensor, length: int, source: int
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Along one image axis of ``length`` pixels, for masks of ``source`` cells resized onto
    pixels ``start..end`` [N]: bilinear ``align_corners=False`` taps as ``F.interpolate``
    computes them, ``(low, high, low weight, high weight)`` [N, length], and which pixels the
    mask covers [N, length]."""
    pixels = torch.arange(length, device=start.device)
    size = (end - start + 1).clamp(min=1)
    scale = (torch.tensor(float(source), device=start.device) / size.float())[:, None]
    src = (scale * ((pixels[None] - start[:, None]).float() + 0.5) - 0.5).clamp(min=0)
    low = src.floor().long().clamp(max=source - 1)
    high_weight = (src - low).clamp(0, 1)
    high = (low + 1).clamp(max=source - 1)
    inside = (pixels[None] >= start[:, None]) & (pixels[None] <= end[:, None])
    return low, high, 1 - high_weight, high_weight, inside


def paste_masks(masks: Tensor, boxes: Tensor, image_size: tuple[int, int],
                threshold: float = MASK_THRESHOLD, padding: int = MASK_PADDING,
                pixels_per_batch: int = 1 << 24) -> Tensor:
    """Masks [N, H, W] (uint8) of an image of ``image_size`` ``(H, W)`` from mask
    probabilities [N, M, M] and their boxes [N, 4] in that image's pixels, as the reference's
    ``Masker``. Masks are pasted in batches of about ``pixels_per_batch`` image pixels."""
    height, width = image_size
    out = torch.zeros(len(masks), height, width, dtype=torch.uint8, device=masks.device)
    if len(masks) == 0:
        return out
    cells = masks.shape[-1]
    padded = F.pad(masks.float(), (padding,) * 4)
    x1, y1, x2, y2 = _expanded_corners(boxes, (cells + 2 * padding) / cells)
    step = max(1, pixels_per_batch // (height * width))
    for i in range(0, len(masks), step):
        part = slice(i, i + step)
        x_low, x_high, x_w0, x_w1, x_in = _resize_taps(x1[part], x2[part], width,
                                                       padded.shape[-1])
        y_low, y_high, y_w0, y_w1, y_in = _resize_taps(y1[part], y2[part], height,
                                                       padded.shape[-2])
        rows = padded[part]                                     # [n, S, S]
        cols = (rows.gather(2, x_low[:, None].expand(-1, rows.shape[1], -1)) * x_w0[:, None]
                + rows.gather(2, x_high[:, None].expand(-1, rows.shape[1], -1))
                * x_w1[:, None])                                 # [n, S, W]
        values = (cols.gather(1, y_low[:, :, None].expand(-1, -1, width)) * y_w0[:, :, None]
                  + cols.gather(1, y_high[:, :, None].expand(-1, -1, width))
                  * y_w1[:, :, None])                           # [n, H, W]
        out[part] = (values > threshold) & y_in[:, :, None] & x_in[:, None, :]
    return out


def postprocess_masks(mask_logits: Tensor, detections: list[ImageDetections],
                      image_sizes: list[tuple[int, int]], original_sizes: list[tuple[int, int]],
                      threshold: float = MASK_THRESHOLD) -> list[ImageDetections]:
    """The detections at the images' original sizes with their pasted masks, given the mask
    head's logits [N, C, M, M] for the detections of every image (concatenated in order) and
    the resized and original ``(height, width)`` of each image."""
    probs = mask_probabilities(mask_logits, torch.cat([d.labels for d in detections]))
    results = []
    for d, p, size, original in zip(detections, probs.split([len(d.labels) for d in detections]),
                                    image_sizes, original_sizes, strict=True):
        boxes = scale_boxes(d.boxes, size, original)
        results.append(ImageDetections(boxes, d.scores, d.labels,
                                       paste_masks(p, boxes, original, threshold)))
    return results
