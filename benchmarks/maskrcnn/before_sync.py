"""Work queued for the GPU before the host waits for the RoI sampler's counts.

``box-head-before-sync``: the box head and its loss run on a bound of the sampled RoIs that
the host knows without their counts (:func:`box_rows`; the rows past the samples have label
-1, which the loss leaves out) before the host reads the counts, and the host reads them by
waiting for their copy alone: the GPU works through the box head while the host goes on to
the mask head, which needs the positives' count. The same losses; plain, the box head waits
for the counts.

``backward-before-sync`` (with it) also queues, before the host waits for the counts, the
backward of the RPN's and box head's losses: work for the GPU while the host, past the
counts, launches the mask head, its loss and the rest of the backward. The losses and heads
then take the backbone region's outputs (FPN levels, RPN objectness and deltas) as leaves
cut from them, so that backward stops there, its gradients gathered on the leaves (where the
mask head's add to them); :func:`finish_backward` runs the mask loss's backward, then the
backbone region's with the leaves' gradients. The same gradients; one process only (DDP
expects one backward a step).
"""

from __future__ import annotations

import functools

import torch

from benchmarks.maskrcnn.detector import Detector, _round_up
from common.kernel_profile import region


def box_rows(det: Detector, batch: int, candidates: int, gt: int) -> int:
    """A bound on a training batch's sampled RoIs that the host knows without the counts:
    at most ``batch_size_per_image`` of each image's ``candidates``, and at most the batch's
    proposals plus its ``gt`` padded ground-truth boxes an image; rounded up to the box head's
    RoI multiple where that stays within the candidates."""
    bound = min(batch * min(det.sampler.batch_size_per_image, candidates),
                det.rpn.most_proposals(batch) + batch * max(gt, 1))
    rounded = _round_up(bound, det.roi_multiples[0])
    return rounded if rounded <= batch * candidates else bound


def sampled_box_losses(det: Detector, scale_loss, levels, padded, counts, shape, rpn_losses):
    """:meth:`Detector.sampled_box_losses` with the box head before the counts; with
    ``scale_loss`` (a ``GradScaler``'s ``scale``), the RPN's and box losses' backward too."""
    rows = box_rows(det, *shape)
    box_losses = det._box_losses(levels, padded.first(rows, 0))
    if scale_loss is not None:
        with region("backward-before-sync"):
            det.streams.join()     # the RPN's and box head's losses
            scale_loss(rpn_losses[0] + rpn_losses[1] + sum(box_losses)).backward()
    with region("roi-sampler"):
        sampled, positive = counts()
        samples = padded.first(sampled, positive)
    if sampled > rows:
        raise RuntimeError(f"{sampled} RoIs sampled, more than the box head's bound of "
                           f"{rows}: before_sync.box_rows is wrong")
    return samples, positive, box_losses


def _cut(det: Detector, training_losses, levels, objectness, deltas, *rest):
    """``training_losses`` on the backbone region's outputs (lists of tensors) as leaves of
    their own, kept with the outputs for :func:`finish_backward`."""
    outputs = (levels, objectness, deltas)
    det.pending_backward = [(x, x.detach().requires_grad_()) for group in outputs
                            for x in group]
    leaves = iter(leaf for _, leaf in det.pending_backward)
    return training_losses(*([next(leaves) for _ in group] for group in outputs), *rest)


def finish_backward(det: Detector, mask_loss: torch.Tensor) -> None:
    """The rest of the step's backward: the (scaled) mask loss's, then the backbone region's
    from the gradients gathered on its outputs' leaves."""
    pending, det.pending_backward = det.pending_backward, []
    if not pending:
        raise RuntimeError("finish_backward without a training forward before it")
    mask_loss.backward()
    reached = [(x, leaf.grad) for x, leaf in pending if leaf.grad is not None]
    torch.autograd.backward([x for x, _ in reached], [g for _, g in reached])


def apply_box_head(wl, _value) -> None:
    det = wl.detector
    det.sampled_box_losses = functools.partial(sampled_box_losses, det, None)


def apply_backward(wl, _value) -> None:
    det, scale = wl.detector, wl.scaler.scale
    det.pending_backward = []
    det.sampled_box_losses = functools.partial(sampled_box_losses, det, scale)
    det.training_losses = functools.partial(_cut, det, det.training_losses)
    wl.backward = lambda losses, _loss: finish_backward(det, scale(losses["loss_mask"]))
