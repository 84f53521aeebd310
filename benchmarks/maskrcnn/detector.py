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

``compile_mode`` other than ``none`` runs the networks through ``torch.compile`` in three
regions with shapes of their own (backbone + FPN + RPN head; box head; mask head); proposal
selection, matching and sampling stay eager, as their sizes depend on the data. The heads'
RoI counts and map sizes are marked dynamic from the first call, so one graph of each serves
the whole run; the backbone is compiled for each padded image size (static kernels: with
sizes only known symbolically, Inductor's layout checks still specialise it to each width),
so ``--size-buckets`` keeps its graphs few. ``backbone_graphs`` replays that region's
forward and backward as CUDA graphs (Inductor's CUDA graph trees), one per padded size: its
kernels were launched from the host every step, and the step was host-bound.
``head_graphs`` does the same for the box and mask heads, one graph per RoI count and padded
size. ``mask_roi_multiple`` rounds the mask head's RoI count (the sampled positives, or the
detections) up to a multiple: cuDNN builds an execution plan for each new convolution shape,
on the host, and an unpadded count is new at almost every step. ``box_roi_multiple`` does the
same for the box head's (the sampled RoIs, or the test proposals), so that its graphs are few.
The plain path runs each head on the count as it is.

``compile_losses`` also compiles the three losses (the RPN's targets, anchor sampling and
loss; the box head's loss; the mask targets and loss), each a region whose ground-truth,
RoI and positive counts are marked dynamic, compiled anew for each padded size as the
backbone is: in eager mode they are some hundred small kernels a step, each launched from
the host, forward and backward. ``compile_proposals`` compiles the RPN's proposal selection
before and after NMS in the same way (:meth:`benchmarks.maskrcnn.rpn.RPN.compile_selection`).

``box_head_before_sync`` runs the box head and its loss on a bound of the sampled RoIs that
the host knows without their counts (:meth:`Detector._box_rows`; the rows past the samples
have label -1, which the loss leaves out) before the host reads the counts, and reads them
by waiting for their copy alone: the GPU works through the box head while the host goes on
to the mask head, which needs the positives' count. The same losses; plain, the box head
waits for the counts.

``backward_before_sync`` (with ``box_head_before_sync``) also queues, before the host waits
for the counts, the backward of the RPN's and box head's losses: work for the GPU while the
host, past the counts, launches the mask head, its loss and the rest of the backward. The
losses and heads then take the backbone region's outputs (FPN levels, RPN objectness and
deltas) as leaves cut from them, so that backward stops there, its gradients gathered on
the leaves (where the mask head's add to them); :meth:`finish_backward` runs the mask loss's
backward, then the backbone region's with the leaves' gradients. The same gradients;
single-process only (DDP expects one backward a step). The losses are scaled by
``scale_loss`` (a ``GradScaler``'s ``scale``).

``loss_streams`` computes the RPN's targets and loss, the box head's loss and the mask
targets and loss each on a CUDA stream of its own (:class:`common.streams.SideStreams`),
beside the proposal selection and the heads on the current stream, joined before the losses
are returned; off CUDA it changes nothing. ``nms_keep`` is the greedy step of the NMS in
evaluation's post-processing (the RPN holds its own).
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.maskrcnn.anchors import fpn_anchors
from benchmarks.maskrcnn.boxes import Keep
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
from common.workload import maybe_compile

RECOMPILE_LIMIT = 64    # compiled backbone graphs: padded sizes x grad modes
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
                 detections_per_image: int = DETECTIONS_PER_IMG, compile_mode: str = "none",
                 loss_streams: bool = False, nms_keep: Keep | None = None,
                 backbone_graphs: bool = False, head_graphs: bool = False,
                 box_roi_multiple: int = 0, mask_roi_multiple: int = 0,
                 compile_losses: bool = False, compile_proposals: bool = False,
                 box_head_before_sync: bool = False, backward_before_sync: bool = False):
        super().__init__()
        self.nms_keep = nms_keep
        self.net, self.rpn, self.sampler = net, rpn, sampler
        self.detections_per_image = detections_per_image
        self.roi_multiples = (box_roi_multiple, mask_roi_multiple)
        self._anchors: dict = {}
        self._side = SideStreams(next(net.parameters()).device, 3 if loss_streams else 0)
        self.compiled = compile_mode != "none"
        self.head_graphs = head_graphs
        self.graphed = backbone_graphs or head_graphs
        self.box_head_before_sync = box_head_before_sync
        if backward_before_sync and not box_head_before_sync:
            raise ValueError("backward_before_sync needs box_head_before_sync")
        self.backward_before_sync = backward_before_sync
        self.scale_loss = lambda loss: loss
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []   # (output, its leaf)
        if self.compiled:   # a graph per padded size and grad mode, more than the default 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                                       RECOMPILE_LIMIT)
        graphs = {"triton.cudagraphs": True}
        self._backbone = maybe_compile(self._levels_and_rpn, compile_mode, dynamic=False,
                                       **(graphs if backbone_graphs else {}))
        self._heads = tuple(maybe_compile(head, compile_mode, **(graphs if head_graphs else {}))
                            for head in (self._box_head, self._mask_head))
        if compile_proposals:
            rpn.compile_selection(compile_mode)
        loss_mode = compile_mode if compile_losses else "none"
        self._losses = tuple(maybe_compile(fn, loss_mode, dynamic=False)   # but the counts
                             for fn in (self.rpn.loss, box_loss, _mask_loss))

    def _levels_and_rpn(self, images: torch.Tensor):
        levels = self.net.features(images)
        return levels, *self.net.rpn(levels)

    def _box_head(self, levels: list[torch.Tensor], rois: torch.Tensor):
        return self.net.box_predictor(self.net.box_features(levels, rois))

    def _mask_head(self, levels: list[torch.Tensor], rois: torch.Tensor) -> torch.Tensor:
        return self.net.mask_predictor(self.net.mask_features(levels, rois))

    def _dynamic(self, t: torch.Tensor, *dims: int) -> torch.Tensor:
        """Compiled, ``t``'s sizes in ``dims`` vary from call to call: the region's first
        graph is built for any of them, not for the first batch's."""
        if self.compiled:
            for d in dims:
                torch._dynamo.maybe_mark_dynamic(t, d)
        return t

    def levels_and_rpn(self, images: torch.Tensor):
        """FPN levels, RPN objectness and deltas of padded images [N, 3, H, W]. With
        ``head_graphs``, in inference, the levels are copies: a call of a graphed region that
        starts a new iteration of the CUDA graph trees (outside :meth:`forward`'s marked steps,
        each call in inference) frees the outputs of the calls before it (the box head's call
        would free the levels the mask head takes)."""
        levels, objectness, deltas = self._backbone(images)
        if self.head_graphs and not torch.is_grad_enabled():
            levels = [x.clone() for x in levels]
        return levels, objectness, deltas

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
        out = self._heads[index]([self._dynamic(x, 2, 3) for x in levels],
                                 self._dynamic(rois, 0))
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

    def _box_rows(self, batch: int, candidates: int, gt: int) -> int:
        """A bound on a training batch's sampled RoIs that the host knows without the counts:
        at most ``batch_size_per_image`` of each image's ``candidates``, and at most the
        batch's proposals plus its ``gt`` padded ground-truth boxes an image; rounded up to
        the box head's RoI multiple where that stays within the candidates."""
        bound = min(batch * min(self.sampler.batch_size_per_image, candidates),
                    self.rpn.most_proposals(batch) + batch * max(gt, 1))
        rounded = _round_up(bound, self.roi_multiples[0])
        return rounded if rounded <= batch * candidates else bound

    def _box_losses(self, levels: list[torch.Tensor], samples: RoISamples):
        """The box head's two losses on ``samples`` (rows of label -1 left out)."""
        with region("box-head"):
            scores, box_deltas = self.box_head(levels, samples.rois)
        with region("box-loss"):
            return self._side.run(1, self._losses[1], *(self._dynamic(t, 0) for t in (
                scores, box_deltas, samples.labels, samples.regression_targets)))

    def forward(self, images: torch.Tensor, image_sizes: torch.Tensor, *targets: torch.Tensor):
        """Training: ``(images, image_sizes, boxes, labels, masks)`` of a ``TrainBatch`` ->
        the losses (dict of float32 scalars). Evaluation: ``(images, image_sizes,
        original_sizes)`` -> one ``ImageDetections`` per image, masks pasted."""
        if self.graphed:
            # a step of the CUDA graph trees begins here, not wherever they would guess it
            # from their regions' order: with backward_before_sync a backward runs between
            # forwards, after which they would free the backbone's outputs before the mask head
            torch.compiler.cudagraph_mark_step_begin()
        with region("backbone+rpn-head"):
            levels, objectness, deltas = self.levels_and_rpn(images)
        anchors = self.anchors(levels)
        if not self.training:
            sizes = [tuple(s) for s in image_sizes.tolist()]
            proposals = self.rpn.proposals(objectness, deltas, anchors, sizes)
            return self._detect(levels, proposals, sizes, targets[0])
        if self.backward_before_sync:
            levels, objectness, deltas = self._cut(levels, objectness, deltas)
        gt_boxes, gt_labels, gt_masks = targets
        gt_valid = gt_labels > 0
        side, (rpn_loss, _, mask_loss_fn) = self._side, self._losses
        with region("rpn-loss"):
            loss_objectness, loss_rpn_box_reg = side.run(
                0, rpn_loss, objectness, deltas, anchors, image_sizes,
                self._dynamic(gt_boxes, 1), self._dynamic(gt_valid, 1))
        with region("proposals"):
            proposals, valid = self.rpn.padded_proposals(objectness, deltas, anchors,
                                                         image_sizes, gt_boxes, gt_valid)
        with region("roi-sampler"):
            padded, counts = self.sampler.padded(proposals, valid, gt_boxes, gt_labels)
            counts = _on_host(counts)
        if self.box_head_before_sync:
            rows = self._box_rows(len(proposals), proposals.shape[1], gt_labels.shape[1])
            box_losses = self._box_losses(levels, padded.first(rows, 0))
        if self.backward_before_sync:
            with region("backward-before-sync"):
                side.join()     # the RPN's and box head's losses
                self.scale_loss(loss_objectness + loss_rpn_box_reg + sum(box_losses)).backward()
        with region("roi-sampler"):
            sampled, positive = counts()
            samples = padded.first(sampled, positive)
        if not self.box_head_before_sync:
            box_losses = self._box_losses(levels, samples)
        elif sampled > rows:
            raise RuntimeError(f"{sampled} RoIs sampled, more than the box head's bound of "
                               f"{rows}: Detector._box_rows is wrong")
        loss_classifier, loss_box_reg = box_losses
        with region("mask-head"):
            # padded here (rows of label -1, which the loss leaves out) where they fit
            mask_rows = _round_up(positive, self.roi_multiples[1])
            positives = (padded.positives.first(mask_rows) if mask_rows < len(padded.labels)
                         else samples.positives)
            mask_logits = self.mask_head(levels, positives.rois)
        with region("mask-loss"):
            loss_mask = side.run(2, mask_loss_fn, *(self._dynamic(t, 0) for t in (
                mask_logits, positives.rois, positives.labels, positives.matched_idxs,
                gt_masks)))
        side.join()
        return dict(zip(LOSSES, (loss_objectness, loss_rpn_box_reg, loss_classifier,
                                 loss_box_reg, loss_mask)))

    def _cut(self, *outputs: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """The backbone region's outputs (lists of tensors) as leaves of their own, kept with
        the outputs for :meth:`finish_backward`."""
        self._pending = [(x, x.detach().requires_grad_()) for group in outputs for x in group]
        leaves = iter(leaf for _, leaf in self._pending)
        return [[next(leaves) for _ in group] for group in outputs]

    def finish_backward(self, mask_loss: torch.Tensor) -> None:
        """With ``backward_before_sync``, the rest of the step's backward: the (scaled) mask
        loss's, then the backbone region's from the gradients gathered on its outputs' leaves."""
        pending, self._pending = self._pending, []
        if not pending:
            raise RuntimeError("finish_backward without a training forward before it")
        mask_loss.backward()
        reached = [(x, leaf.grad) for x, leaf in pending if leaf.grad is not None]
        torch.autograd.backward([x for x, _ in reached], [g for _, g in reached])

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
