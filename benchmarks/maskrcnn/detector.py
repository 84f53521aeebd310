"""The forward of the MLPerf Training 1.1 Mask R-CNN that connects its pieces (mlcommons/training
v1.1 ``object_detection/pytorch/maskrcnn_benchmark/modeling``: ``detector/generalized_rcnn.py``,
``rpn/rpn.py``, ``roi_heads/{roi_heads,box_head/box_head,mask_head/mask_head}.py``).

Training (:meth:`Detector.forward` on a :class:`benchmarks.maskrcnn.data.TrainBatch`): backbone
and FPN, the RPN head and its loss on the anchors, proposals (the ground truth appended), RoI
sampling, the box head's loss on the sampled RoIs and the mask head's on their positives. It
returns the five losses the reference sums: ``loss_objectness``, ``loss_rpn_box_reg``,
``loss_classifier``, ``loss_box_reg``, ``loss_mask``.

Evaluation (on an :class:`benchmarks.maskrcnn.data.EvalBatch`): test proposals, the box head
and its post-processing, then the mask head on the detected boxes (``MaskRCNNFPNFeatureExtractor``
pools the detections in test, as there), masks pasted into each image at its original size;
one :class:`benchmarks.maskrcnn.roi_heads.ImageDetections` per image, boxes in original pixels.

The networks run in three regions with shapes of their own (backbone + FPN + RPN head:
``_backbone``; box head and mask head: ``_heads``) and the losses in three more (``_losses``),
each the plain function here, which the optimisations replace (compiled: ``compiled.py``;
graphed; the box head before the sampler's host sync: ``before_sync.py``). The heads run on
their RoI count rounded up to ``roi_multiples`` (0: as it is); ``streams`` runs the losses
beside the rest (:class:`common.streams.SideStreams`, none by default); ``nms_keep`` is the
greedy step of the NMS in evaluation's post-processing (the RPN holds its own).
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.maskrcnn.anchors import fpn_anchors
from benchmarks.maskrcnn.boxes import Keep, nms_keep
from benchmarks.maskrcnn.model import MaskRCNN
from benchmarks.maskrcnn.roi_align import rois_from_boxes
from benchmarks.maskrcnn.roi_heads import (
    DETECTIONS_PER_IMG,
    ImageDetections,
    RoISampler,
    RoISamples,
    box_loss,
    mask_loss,
    mask_targets,
    postprocess_boxes,
    postprocess_masks,
)
from benchmarks.maskrcnn.rpn import RPN
from common.kernel_profile import region
from common.streams import SideStreams

LOSSES = ("loss_objectness", "loss_rpn_box_reg", "loss_classifier", "loss_box_reg", "loss_mask")


def _on_host(counts: torch.Tensor):
    """A function that gives ``counts``' values: on CUDA their copy to the host starts now,
    behind the work queued so far, and the function waits for that copy alone, not for
    work queued after it."""
    if not counts.is_cuda:
        return counts.tolist
    host = counts.to("cpu", non_blocking=True)      # into pinned memory
    copied = torch.cuda.Event()
    copied.record()

    def values() -> list:
        copied.synchronize()
        return host.tolist()
    return values


def _round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (0: ``n`` as it is)."""
    return n + (-n % multiple if multiple else 0)


def ground_truth(boxes: torch.Tensor, labels: torch.Tensor, masks: torch.Tensor
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """A padded batch's targets per image: boxes [G_i, 4], labels [G_i] and masks
    [G_i, H, W] (``TrainBatch``: label 0 is padding, the masks follow the real boxes)."""
    valid = labels > 0
    counts = valid.sum(dim=1).tolist()
    return (list(boxes[valid].split(counts)), list(labels[valid].split(counts)),
            list(masks.split(counts)))


def _mask_loss(mask_logits: torch.Tensor, rois: torch.Tensor, labels: torch.Tensor,
               matched_idxs: torch.Tensor, gt_masks: torch.Tensor) -> torch.Tensor:
    """The mask loss of the positive RoIs [P, 5] against their ground truth's masks
    rasterised into each RoI."""
    return mask_loss(mask_logits, labels,
                     mask_targets(rois[:, 1:], matched_idxs, gt_masks, mask_logits.shape[-1]))


class Detector(nn.Module):
    """``GeneralizedRCNN``: the networks (:class:`MaskRCNN`), the RPN's proposal selection and
    loss (:class:`RPN`) and the RoI sampler, with the reference's test settings."""

    def __init__(self, net: MaskRCNN, rpn: RPN, sampler: RoISampler,
                 detections_per_image: int = DETECTIONS_PER_IMG):
        super().__init__()
        self.net, self.rpn, self.sampler = net, rpn, sampler
        self.detections_per_image = detections_per_image
        self.nms_keep: Keep = nms_keep
        self.roi_multiples = [0, 0]     # the box head's, the mask head's
        self._anchors: dict = {}
        self.streams = SideStreams(next(net.parameters()).device, 0)
        self._backbone = self._levels_and_rpn
        self._heads = (self._box_head, self._mask_head)
        self._training_heads: tuple | None = None   # head-graphs': in training only
        self._losses = (self.rpn.loss, box_loss, _mask_loss)

    def _levels_and_rpn(self, images: torch.Tensor):
        levels = self.net.features(images)
        return levels, *self.net.rpn(levels)

    def _box_head(self, levels: list[torch.Tensor], rois: torch.Tensor):
        return self.net.box_predictor(self.net.box_features(levels, rois))

    def _mask_head(self, levels: list[torch.Tensor], rois: torch.Tensor) -> torch.Tensor:
        return self.net.mask_predictor(self.net.mask_features(levels, rois))

    @staticmethod
    def _dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
        """``t``'s sizes in ``dims`` vary from call to call: a compiled region's first graph
        is built for any of them, not for the first batch's (eager code ignores the mark)."""
        for d in dims:
            torch._dynamo.maybe_mark_dynamic(t, d)
        return t

    def levels_and_rpn(self, images: torch.Tensor):
        """FPN levels, RPN objectness and deltas of padded images [N, 3, H, W]."""
        return self._backbone(images)

    def box_head(self, levels: list[torch.Tensor], rois: torch.Tensor):
        """Class scores and box deltas of RoIs [K, 5]."""
        return self._head(0, levels, rois)

    def mask_head(self, levels: list[torch.Tensor], rois: torch.Tensor) -> torch.Tensor:
        """Mask logits of RoIs [K, 5]."""
        return self._head(1, levels, rois)

    def _head(self, index: int, levels: list[torch.Tensor], rois: torch.Tensor):
        """The box (``index`` 0) or mask head's outputs for RoIs [K, 5]; with a RoI multiple
        for it, the head runs on ``K`` rounded up to that multiple (copies of the last RoI,
        their outputs dropped)."""
        n, multiple = len(rois), self.roi_multiples[index]
        if not n:   # nothing detected: eager, not a graph compiled for no RoIs
            return (self._box_head, self._mask_head)[index](levels, rois)
        pad = _round_up(n, multiple) - n
        if pad:
            rois = torch.cat([rois, rois[-1:].expand(pad, -1)])
        heads = self._training_heads if self.training and self._training_heads else self._heads
        out = heads[index]([self._dynamic(x, 2, 3) for x in levels], self._dynamic(rois, 0))
        if not pad:
            return out
        return out[:n] if index else tuple(x[:n] for x in out)

    def anchors(self, levels: list[torch.Tensor]) -> list[torch.Tensor]:
        """The FPN anchors of these feature maps, made once per padded batch shape."""
        key = (levels[0].device, *(tuple(x.shape[-2:]) for x in levels))
        if key not in self._anchors:
            self._anchors[key] = fpn_anchors([tuple(x.shape[-2:]) for x in levels],
                                             levels[0].device)
        return self._anchors[key]

    def _box_losses(self, levels: list[torch.Tensor], samples: RoISamples):
        """The box head's two losses on ``samples`` (rows of label -1 left out)."""
        with region("box-head"):
            scores, box_deltas = self.box_head(levels, samples.rois)
        with region("box-loss"):
            return self.streams.run(1, self._losses[1], *(self._dynamic(t, 0) for t in (
                scores, box_deltas, samples.labels, samples.regression_targets)))

    def forward(self, images: torch.Tensor, image_sizes: torch.Tensor, *targets: torch.Tensor):
        """Training: ``(images, image_sizes, boxes, labels, masks)`` of a ``TrainBatch`` ->
        the losses (dict of float32 scalars). Evaluation: ``(images, image_sizes,
        original_sizes)`` -> one ``ImageDetections`` per image, masks pasted."""
        with region("backbone+rpn-head"):
            levels, objectness, deltas = self.levels_and_rpn(images)
        anchors = self.anchors(levels)
        if not self.training:
            sizes = [tuple(s) for s in image_sizes.tolist()]
            proposals = self.rpn.proposals(objectness, deltas, anchors, sizes)
            return self._detect(levels, proposals, sizes, targets[0])
        return self.training_losses(levels, objectness, deltas, anchors, image_sizes, *targets)

    def training_losses(self, levels: list[torch.Tensor], objectness: list[torch.Tensor],
                        deltas: list[torch.Tensor], anchors: list[torch.Tensor],
                        image_sizes: torch.Tensor, gt_boxes: torch.Tensor,
                        gt_labels: torch.Tensor, gt_masks: torch.Tensor) -> dict:
        """The five losses of a training batch from the backbone region's outputs."""
        gt_valid = gt_labels > 0
        streams, (rpn_loss, _, mask_loss_fn) = self.streams, self._losses
        with region("rpn-loss"):
            rpn_losses = streams.run(0, rpn_loss, objectness, deltas, anchors, image_sizes,
                                     self._dynamic(gt_boxes, 1), self._dynamic(gt_valid, 1))
        with region("proposals"):
            proposals, valid = self.rpn.padded_proposals(objectness, deltas, anchors,
                                                         image_sizes, gt_boxes, gt_valid)
        with region("roi-sampler"):
            padded, counts = self.sampler.padded(proposals, valid, gt_boxes, gt_labels)
            counts = _on_host(counts)
        samples, positive, box_losses = self.sampled_box_losses(
            levels, padded, counts, (len(proposals), proposals.shape[1], gt_labels.shape[1]),
            rpn_losses)
        with region("mask-head"):
            # padded here (rows of label -1, which the loss leaves out) where they fit
            mask_rows = _round_up(positive, self.roi_multiples[1])
            positives = (padded.positives.first(mask_rows) if mask_rows < len(padded.labels)
                         else samples.positives)
            mask_logits = self.mask_head(levels, positives.rois)
        with region("mask-loss"):
            loss_mask = streams.run(2, mask_loss_fn, *(self._dynamic(t, 0) for t in (
                mask_logits, positives.rois, positives.labels, positives.matched_idxs,
                gt_masks)))
        streams.join()
        return dict(zip(LOSSES, (*rpn_losses, *box_losses, loss_mask)))

    def sampled_box_losses(self, levels: list[torch.Tensor], padded: RoISamples, counts,
                           shape: tuple[int, int, int], rpn_losses: tuple
                           ) -> tuple[RoISamples, int, tuple[torch.Tensor, torch.Tensor]]:
        """The sampled RoIs, their count of positives and the box head's two losses on them,
        once the host has the sampler's ``counts`` (``shape``: images, candidates an image and
        padded ground truth an image; ``rpn_losses``: the RPN's two, for
        :mod:`benchmarks.maskrcnn.before_sync`)."""
        with region("roi-sampler"):
            sampled, positive = counts()
            samples = padded.first(sampled, positive)
        return samples, positive, self._box_losses(levels, samples)

    def _detect(self, levels: list[torch.Tensor], proposals: list[torch.Tensor],
                sizes: list[tuple[int, int]], original_sizes: torch.Tensor
                ) -> list[ImageDetections]:
        scores, box_deltas = self.box_head(levels, rois_from_boxes(proposals))
        detections = postprocess_boxes(scores, box_deltas, proposals, sizes,
                                       detections_per_image=self.detections_per_image,
                                       nms_keep=self.nms_keep)
        mask_logits = self.mask_head(levels, rois_from_boxes([d.boxes for d in detections]))
        return postprocess_masks(mask_logits, detections, sizes,
                                 [tuple(s) for s in original_sizes.tolist()])
