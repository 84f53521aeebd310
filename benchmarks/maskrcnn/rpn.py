"""Proposal selection, training targets and loss of the Region Proposal Network of the MLPerf
Training 1.1 Mask R-CNN (mlcommons/training ``object_detection/pytorch/maskrcnn_benchmark``:
``modeling/rpn/{rpn,inference,loss,utils}.py``, ``modeling/balanced_positive_negative_sampler.py``,
``layers/smooth_l1_loss.py``; values from ``configs/e2e_mask_rcnn_R_50_FPN_1x.yaml`` and
``config/defaults.py``; NVIDIA's v1.1 ``benchmarks/maskrcnn`` for the per-image switch).

Head outputs per FPN level are objectness logits [B, A, H, W] and deltas [B, 4A, H, W]; they
are read in the anchors' order (row, column, anchor; :mod:`benchmarks.maskrcnn.anchors`), the
deltas as ``[B, A, 4, H, W]``. Image sizes are ``(height, width)`` of the unpadded images.

Proposals (``RPNPostProcessor``), per image, scores being the logits' sigmoid in float32:
1. per level, the ``pre_nms_top_n`` best anchors (2000 training, 1000 test);
2. decode with weights 1, 1, 1, 1, clip to the image, drop boxes with a side below
   ``min_size`` (0), NMS at IoU 0.7 within the level, keep the level's best
   ``post_nms_top_n`` (``POST_NMS_TOP_N``: 2000 training, 1000 test);
3. over the levels (``FPN_POST_NMS_TOP_N``): in training the best 2000 of the whole batch
   (the reference's ``select_over_all_levels``, whose comment says it should be per image;
   NVIDIA keeps it per batch and sets 1000 per image of a GPU's batch, and offers
   ``FPN_POST_NMS_TOP_N_PER_IMAGE``), kept in level order, then the image's ground-truth
   boxes appended; in test the best 1000 of each image, best first.
Equal scores rank by position (level, then rank within the level), as :mod:`topk` does.

Loss (``RPNLossComputation``): anchors matched to ground truth at IoU 0.7 / 0.3 with the
low-quality rule; label 1 if matched, 0 below 0.3, ignored between the thresholds or when the
anchor leaves the image (straddle 0). Per image 256 anchors are sampled at random, at most
half positive, the rest negative. Both losses are divided by the number of sampled anchors of
the whole batch: binary cross-entropy on the sampled logits, smooth L1 (beta 1/9) summed over
the positive anchors' deltas against ``encode(gt, anchor)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.maskrcnn.anchors import STRADDLE_THRESH, visible
from benchmarks.maskrcnn.boxes import (
    RPN_BOX_WEIGHTS,
    TO_REMOVE,
    BoxCoder,
    Matcher,
    box_iou,
    min_size_mask,
    nms_keep,
)
from benchmarks.maskrcnn.sampler import balanced_sample
from benchmarks.maskrcnn.topk import ordered_topk
from common.errors import UserError
from common.workload import maybe_compile

PRE_NMS_TOP_N_TRAIN = 2000      # per level
PRE_NMS_TOP_N_TEST = 1000
POST_NMS_TOP_N_TRAIN = 2000     # per level, after NMS
POST_NMS_TOP_N_TEST = 1000
FPN_POST_NMS_TOP_N_TRAIN = 2000  # over the levels, per batch (mllog num_image_candidates)
FPN_POST_NMS_TOP_N_TEST = 1000   # over the levels, per image
NMS_THRESH = 0.7
MIN_SIZE = 0
FG_IOU_THRESHOLD = 0.7
BG_IOU_THRESHOLD = 0.3
BATCH_SIZE_PER_IMAGE = 256
POSITIVE_FRACTION = 0.5
SMOOTH_L1_BETA = 1.0 / 9


def flatten_levels(objectness: list[torch.Tensor], deltas: list[torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [B, N] and deltas [B, N, 4] of all levels in the anchors' order
    (``concat_box_prediction_layers``), N the anchors of all levels."""
    logits, codes = [], []
    for obj, delta in zip(objectness, deltas, strict=True):
        batch, num_anchors, height, width = obj.shape
        if delta.shape != (batch, 4 * num_anchors, height, width):
            raise ValueError(f"RPN deltas {tuple(delta.shape)} do not fit objectness "
                             f"{tuple(obj.shape)}")
        logits.append(obj.permute(0, 2, 3, 1).reshape(batch, -1))
        codes.append(delta.reshape(batch, num_anchors, 4, height, width)
                     .permute(0, 3, 4, 1, 2).reshape(batch, -1, 4))
    return torch.cat(logits, dim=1), torch.cat(codes, dim=1)


def _image_bounds(image_sizes: list[tuple[int, int]] | torch.Tensor,
                  device: torch.device) -> torch.Tensor:
    """``(width - 1, height - 1)`` twice per image [B, 4] of sizes [B, 2] (a device tensor, or
    host values copied without a host sync)."""
    if not isinstance(image_sizes, torch.Tensor):
        image_sizes = torch.tensor(image_sizes, dtype=torch.float32)
        if device.type == "cuda":
            image_sizes = image_sizes.pin_memory()
    sizes = image_sizes.to(device, torch.float32, non_blocking=True)
    return sizes.flip(-1).repeat(1, 2) - TO_REMOVE


def _rank_in_group(group: torch.Tensor) -> torch.Tensor:
    """Position of each element [K] within its run of a sorted group id [K]: its position
    less that of the run's first element (a running maximum, where ``searchsorted`` fails
    Inductor's CUDA lowering on a view)."""
    position = torch.arange(len(group), device=group.device)
    starts = torch.cat((torch.ones_like(group[:1], dtype=torch.bool), group[1:] != group[:-1]))
    return position - torch.where(starts, position, 0).cummax(0).values


class RPN(nn.Module):
    """The RPN's proposal selection (:meth:`proposals`) and loss (:meth:`loss`), with the
    reference's settings as defaults; ``train()`` / ``eval()`` pick the training or test
    top-N. It holds no parameters: the head is :class:`benchmarks.maskrcnn.model.RPNHead`.

    ``fpn_post_nms_per_image_train`` takes the training top-N over levels per image instead
    of per batch (NVIDIA's switch). ``topk`` selects each level's pre-NMS candidates
    (:func:`benchmarks.maskrcnn.topk.ordered_topk`) and ``nms_keep`` is NMS's greedy step
    (:func:`benchmarks.maskrcnn.boxes.nms_keep`): the optimisations replace them."""

    def __init__(self, *, pre_nms_top_n_train: int = PRE_NMS_TOP_N_TRAIN,
                 pre_nms_top_n_test: int = PRE_NMS_TOP_N_TEST,
                 post_nms_top_n_train: int = POST_NMS_TOP_N_TRAIN,
                 post_nms_top_n_test: int = POST_NMS_TOP_N_TEST,
                 fpn_post_nms_top_n_train: int = FPN_POST_NMS_TOP_N_TRAIN,
                 fpn_post_nms_top_n_test: int = FPN_POST_NMS_TOP_N_TEST,
                 fpn_post_nms_per_image_train: bool = False,
                 nms_thresh: float = NMS_THRESH, min_size: float = MIN_SIZE,
                 fg_iou_threshold: float = FG_IOU_THRESHOLD,
                 bg_iou_threshold: float = BG_IOU_THRESHOLD,
                 batch_size_per_image: int = BATCH_SIZE_PER_IMAGE,
                 positive_fraction: float = POSITIVE_FRACTION,
                 straddle_thresh: float = STRADDLE_THRESH):
        super().__init__()
        counts = dict(pre_nms_top_n_train=pre_nms_top_n_train,
                      pre_nms_top_n_test=pre_nms_top_n_test,
                      post_nms_top_n_train=post_nms_top_n_train,
                      post_nms_top_n_test=post_nms_top_n_test,
                      fpn_post_nms_top_n_train=fpn_post_nms_top_n_train,
                      fpn_post_nms_top_n_test=fpn_post_nms_top_n_test,
                      batch_size_per_image=batch_size_per_image)
        bad = [f"{name}={value}" for name, value in counts.items() if value < 1]
        if not 0 < nms_thresh <= 1:
            bad.append(f"nms_thresh={nms_thresh}")
        if not 0 <= bg_iou_threshold <= fg_iou_threshold <= 1:
            bad.append(f"IoU thresholds bg {bg_iou_threshold}, fg {fg_iou_threshold} "
                       "(need 0 <= bg <= fg <= 1)")
        if not 0 <= positive_fraction <= 1:
            bad.append(f"positive_fraction={positive_fraction}")
        if bad:
            raise UserError(f"invalid RPN settings: {', '.join(bad)}")
        self.pre_nms_top_n_train = pre_nms_top_n_train
        self.pre_nms_top_n_test = pre_nms_top_n_test
        self.post_nms_top_n_train = post_nms_top_n_train
        self.post_nms_top_n_test = post_nms_top_n_test
        self.fpn_post_nms_top_n_train = fpn_post_nms_top_n_train
        self.fpn_post_nms_top_n_test = fpn_post_nms_top_n_test
        self.fpn_post_nms_per_image_train = fpn_post_nms_per_image_train
        self.nms_thresh = nms_thresh
        self.min_size = min_size
        self.matcher = Matcher(fg_iou_threshold, bg_iou_threshold,
                               allow_low_quality_matches=True)
        self.batch_size_per_image = batch_size_per_image
        self.positive_fraction = positive_fraction
        self.straddle_thresh = straddle_thresh
        self.topk, self.nms_keep = ordered_topk, nms_keep
        self.box_coder = BoxCoder(RPN_BOX_WEIGHTS)
        self._pre_nms, self._post_nms = self._candidates, self._select

    def most_proposals(self, batch: int) -> int:
        """The most proposals that a training batch of ``batch`` images holds in all, before
        its ground truth is appended: the over-levels top-N, per batch (or per image)."""
        top_n = self.fpn_post_nms_top_n_train
        return top_n * batch if self.fpn_post_nms_per_image_train else top_n

    def _top_ns(self) -> tuple[int, int, int]:
        """The pre-NMS, post-NMS and over-levels top-N of the current mode."""
        if self.training:
            return (self.pre_nms_top_n_train, self.post_nms_top_n_train,
                    self.fpn_post_nms_top_n_train)
        return self.pre_nms_top_n_test, self.post_nms_top_n_test, self.fpn_post_nms_top_n_test

    @staticmethod
    def _check(objectness: list[torch.Tensor], anchors: list[torch.Tensor],
               image_sizes: list[tuple[int, int]]) -> None:
        if len(objectness) != len(anchors):
            raise ValueError(f"{len(objectness)} RPN levels but {len(anchors)} anchor levels")
        for level, (obj, cells) in enumerate(zip(objectness, anchors)):
            if obj[0].numel() != len(cells):
                raise ValueError(f"level {level}: {obj[0].numel()} RPN outputs per image but "
                                 f"{len(cells)} anchors")
        if len(image_sizes) != len(objectness[0]):
            raise ValueError(f"{len(image_sizes)} image sizes for a batch of "
                             f"{len(objectness[0])}")

    @torch.no_grad()
    def proposals(self, objectness: list[torch.Tensor], deltas: list[torch.Tensor],
                  anchors: list[torch.Tensor], image_sizes: list[tuple[int, int]] | torch.Tensor,
                  gt_boxes: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Proposals [K_i, 4] (float32) of each image from per-level ``objectness``
        [B, A, H, W], ``deltas`` [B, 4A, H, W] and ``anchors`` [H * W * A, 4]; in training
        mode the ``gt_boxes`` [M_i, 4], if given, are appended."""
        boxes, valid = self._chosen(objectness, deltas, anchors, image_sizes)
        proposals = list(boxes[valid].split(valid.sum(dim=1).tolist()))
        if self.training and gt_boxes is not None:
            proposals = [torch.cat((p, gt.to(p))) for p, gt in zip(proposals, gt_boxes,
                                                                    strict=True)]
        return proposals

    @torch.no_grad()
    def padded_proposals(self, objectness: list[torch.Tensor], deltas: list[torch.Tensor],
                         anchors: list[torch.Tensor], image_sizes: torch.Tensor,
                         gt_boxes: torch.Tensor, gt_valid: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`proposals` of a training batch without a host sync: each image's proposals
        in a row of [B, W, 4] (W bounds the count), then its padded ground truth [B, G, 4];
        and which entries are real [B, W + G] (``gt_valid`` [B, G] for the ground truth's)."""
        boxes, valid = self._chosen(objectness, deltas, anchors, image_sizes)
        return (torch.cat((boxes, gt_boxes.to(boxes)), dim=1),
                torch.cat((valid, gt_valid), dim=1))

    def compile_selection(self, mode: str) -> None:
        """Compiles the proposal selection before and after NMS (``maybe_compile``'s
        ``mode``), each a region per padded size and mode; NMS's greedy step between them
        stays as it is (the reference's rounds synchronise the host)."""
        self._pre_nms = maybe_compile(self._candidates, mode, dynamic=False)
        self._post_nms = maybe_compile(self._select, mode, dynamic=False)

    def _chosen(self, objectness: list[torch.Tensor], deltas: list[torch.Tensor],
                anchors: list[torch.Tensor], image_sizes: list[tuple[int, int]] | torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The proposals that ``select_over_all_levels`` keeps, a row per image [B, K, 4] and
        which are real [B, K]: in training in level order (per batch, or per image with
        ``fpn_post_nms_per_image_train``), in test per image by decreasing score. Equal
        scores rank by position (level, then rank within the level)."""
        self._check(objectness, anchors, image_sizes)
        bounds = _image_bounds(image_sizes, objectness[0].device)
        boxes, scores, valid = self._pre_nms(objectness, deltas, anchors, bounds)
        rows = (-1, scores.shape[-1])
        kept = self.nms_keep(boxes.view(*rows, 4), valid.view(rows),
                                           self.nms_thresh).view_as(valid)
        return self._post_nms(boxes, scores, valid & kept, [len(c) for c in anchors])

    def _candidates(self, objectness: list[torch.Tensor], deltas: list[torch.Tensor],
                    anchors: list[torch.Tensor], bounds: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each image and level's pre-NMS candidates, padded: boxes [B, L, W, 4] and scores
        [B, L, W] in each level's top-K order (best first, the score -1 where there is no
        candidate) and which take part in NMS [B, L, W]. W is the largest level's top-K:
        shapes alone fix it, no host sync. ``bounds`` [B, 4] from :func:`_image_bounds`."""
        batch = len(bounds)
        pre_nms, _, _ = self._top_ns()
        width = max(min(pre_nms, len(cells)) for cells in anchors)
        scores, boxes = [], []
        for obj, delta, level_anchors in zip(objectness, deltas, anchors, strict=True):
            logits, codes = flatten_levels([obj], [delta])
            k = min(pre_nms, logits.shape[1])
            top, index = self.topk(logits.float().sigmoid(), k)
            codes = codes.gather(1, index[..., None].expand(-1, -1, 4)).float()
            decoded = self.box_coder.decode(codes.reshape(-1, 4),
                                            level_anchors[index].float().reshape(-1, 4))
            decoded = torch.minimum(decoded.view(batch, k, 4).clamp(min=0), bounds[:, None])
            scores.append(F.pad(top, (0, width - k), value=-1.0))
            boxes.append(F.pad(decoded, (0, 0, 0, width - k)))
        scores, boxes = torch.stack(scores, dim=1), torch.stack(boxes, dim=1)
        return boxes, scores, (scores >= 0) & min_size_mask(boxes, self.min_size)

    def _select(self, boxes: torch.Tensor, scores: torch.Tensor, kept: torch.Tensor,
                level_sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_chosen` from the candidates and their NMS survivors ``kept`` [B, L, W]
        (``level_sizes``: the anchors of each level)."""
        batch, levels, width = scores.shape
        pre_nms, post_nms, top_n = self._top_ns()
        kept = kept & (kept.cumsum(dim=-1) <= post_nms)
        scores = torch.where(kept, scores, -1.0)
        per_image = not self.training or self.fpn_post_nms_per_image_train
        flat = scores.view(batch if per_image else 1, -1)
        top, index = ordered_topk(flat, min(top_n, flat.shape[1]))
        real = top >= 0
        if self.training:   # level order, the real ones first
            index = torch.where(real, index, index + flat.shape[1]).sort(dim=1).values
            real = index < flat.shape[1]
            index = index.remainder(flat.shape[1])
        if per_image:
            image = torch.arange(batch, device=index.device)[:, None].expand_as(index)
            position = torch.arange(index.shape[1], device=index.device).expand_as(index)
            index = index + image * flat.shape[1]
        else:   # the batch's choice, dealt into rows: its index order is by image
            image = torch.where(real, index // (levels * width), batch)
            position = _rank_in_group(image[0])[None]
        most = min(top_n, sum(min(n, pre_nms, post_nms) for n in level_sizes))
        fits = real & (position < most)
        picked = boxes.view(-1, 4)[index.flatten()]
        out = boxes.new_zeros(batch + 1, most, 4)
        valid = torch.zeros(batch + 1, most, dtype=torch.bool, device=boxes.device)
        rows, cols = torch.where(fits, image, batch).flatten(), (position * fits).flatten()
        out = out.index_put((rows, cols), picked)
        valid = valid.index_put((rows, cols), fits.flatten())
        return out[:batch], valid[:batch]

    @torch.no_grad()
    def targets(self, anchors: list[torch.Tensor],
                image_sizes: list[tuple[int, int]] | torch.Tensor, gt_boxes: torch.Tensor,
                gt_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Labels [B, N] (float32: 1 positive, 0 negative, -1 ignored) and regression
        targets [B, N, 4] of the anchors of all levels (N in all) for the padded ground
        truth [B, G, 4] whose real boxes ``gt_valid`` [B, G] marks (an image without any
        has negative anchors only), every image at once."""
        if len(gt_boxes) != len(image_sizes):
            raise ValueError(f"{len(gt_boxes)} ground-truth lists for {len(image_sizes)} images")
        cells = torch.cat(anchors).float()
        gt = gt_boxes.to(cells)
        matches = self.matcher(box_iou(gt, cells), gt_valid)                # [B, N]
        ignored = ((matches == Matcher.BETWEEN_THRESHOLDS)
                   | ~visible(cells, torch.as_tensor(image_sizes, device=cells.device),
                              self.straddle_thresh))
        labels = torch.where(ignored, -1.0, (matches >= 0).float())
        matched = gt.gather(1, matches.clamp(min=0)[..., None].expand(-1, -1, 4))
        regression = self.box_coder.encode(matched.reshape(-1, 4),
                                           cells.expand_as(matched).reshape(-1, 4))
        return labels, regression.view_as(matched)

    def sample(self, labels: torch.Tensor, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Masks [B, N] of the sampled positive and negative anchors of labels [B, N]
        (``BalancedPositiveNegativeSampler``): per image up to ``batch_size_per_image *
        positive_fraction`` positives, then negatives up to ``batch_size_per_image`` in all,
        each a uniform random subset drawn from ``generator`` (on the labels' device) or
        the global generator."""
        return balanced_sample(labels == 1, labels == 0, self.batch_size_per_image,
                               self.positive_fraction, generator)

    def loss(self, objectness: list[torch.Tensor], deltas: list[torch.Tensor],
             anchors: list[torch.Tensor], image_sizes: list[tuple[int, int]] | torch.Tensor,
             gt_boxes: torch.Tensor, gt_valid: torch.Tensor,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss_objectness, loss_rpn_box_reg)``, float32 scalars, from the per-level head
        outputs, anchors and padded ground truth (:meth:`targets`); ``generator`` draws the
        sampled anchors."""
        self._check(objectness, anchors, image_sizes)
        logits, codes = flatten_levels(objectness, deltas)
        labels, regression = self.targets(anchors, image_sizes, gt_boxes, gt_valid)
        positive, negative = self.sample(labels, generator)
        sampled = positive | negative
        count = sampled.sum().clamp(min=1)     # the reference would give NaN for none
        objectness_loss = F.binary_cross_entropy_with_logits(
            logits.float(), labels.clamp(min=0), reduction="none")
        box_loss = F.smooth_l1_loss(codes.float(), regression, beta=SMOOTH_L1_BETA,
                                    reduction="none")
        return (torch.where(sampled, objectness_loss, 0.0).sum() / count,
                torch.where(positive[..., None], box_loss, 0.0).sum() / count)
