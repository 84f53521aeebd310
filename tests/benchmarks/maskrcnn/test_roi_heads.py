"""RoI sampling, box and mask losses and post-processing of the Mask R-CNN second stage against
hand computations, per-class loops and a transcription of the reference's ``Masker``
(mlcommons/training v1.1 ``object_detection``: ``modeling/roi_heads/{box_head,mask_head}``)."""

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from benchmarks.maskrcnn.boxes import ROI_BOX_WEIGHTS, BoxCoder, box_iou
from benchmarks.maskrcnn.roi_align import roi_align
from benchmarks.maskrcnn.roi_heads import (
    ImageDetections,
    Positives,
    RoISampler,
    RoISamples,
    box_loss,
    mask_loss,
    mask_probabilities,
    mask_targets,
    paste_masks,
    postprocess_boxes,
    postprocess_masks,
    scale_boxes,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def brute_iou(a, b):
    """IoU of two inclusive-pixel boxes given as lists."""
    iw = min(a[2], b[2]) - max(a[0], b[0]) + 1
    ih = min(a[3], b[3]) - max(a[1], b[1]) + 1
    inter = max(iw, 0) * max(ih, 0)
    area = (a[2] - a[0] + 1) * (a[3] - a[1] + 1) + (b[2] - b[0] + 1) * (b[3] - b[1] + 1)
    return inter / (area - inter)


def hand_encode(gt, proposal, weights=ROI_BOX_WEIGHTS):
    """``(dx, dy, dw, dh)`` of one proposal towards one ground-truth box (lists)."""
    pw, ph = proposal[2] - proposal[0] + 1, proposal[3] - proposal[1] + 1
    gw, gh = gt[2] - gt[0] + 1, gt[3] - gt[1] + 1
    wx, wy, ww, wh = weights
    return [wx * ((gt[0] + gw / 2) - (proposal[0] + pw / 2)) / pw,
            wy * ((gt[1] + gh / 2) - (proposal[1] + ph / 2)) / ph,
            ww * math.log(gw / pw), wh * math.log(gh / ph)]


def jittered(boxes, n, g, jitter=1.0):
    """``n`` boxes, each a ground-truth box moved by less than ``jitter`` pixels."""
    pick = torch.randint(len(boxes), (n,), generator=g)
    return boxes[pick] + (torch.rand(n, 4, generator=g) * 2 - 1) * jitter


def far_boxes(n, g, origin=500.0):
    """``n`` boxes far from every ground-truth box used here (IoU 0)."""
    xy = origin + torch.rand(n, 2, generator=g) * 100
    return torch.cat((xy, xy + 5 + torch.rand(n, 2, generator=g) * 20), dim=1)


GT_BOXES = torch.tensor([[10.0, 10.0, 49.0, 39.0], [100.0, 50.0, 139.0, 99.0],
                         [200.0, 20.0, 229.0, 79.0]])
GT_LABELS = torch.tensor([5, 1, 80])


def sample_one(sampler, proposals, gt, labels, generator=None):
    """The sampler on a batch of one image."""
    return sampler(proposals[None], torch.ones(1, len(proposals), dtype=torch.bool), gt[None],
                   labels[None], generator=generator)


@pytest.mark.parametrize(("num_pos", "num_neg", "batch", "fraction", "expected"), [
    (200, 300, 512, 0.25, (128, 300)),      # the reference's sizes, few negatives
    (10, 1000, 512, 0.25, (10, 502)),       # few positives: negatives fill the batch
    (40, 40, 16, 0.5, (8, 8)),              # a tiny config
])
def test_sampler_counts_fraction_and_targets(num_pos, num_neg, batch, fraction, expected):
    g = torch.Generator().manual_seed(num_pos)
    proposals = torch.cat((jittered(GT_BOXES, num_pos, g), far_boxes(num_neg, g)))
    proposals = proposals[torch.randperm(len(proposals), generator=g)]
    sampler = RoISampler(batch_size_per_image=batch, positive_fraction=fraction)
    samples = sample_one(sampler, proposals, GT_BOXES, GT_LABELS, generator=g)
    labels, matched = samples.labels, samples.matched_idxs
    positive = torch.nonzero(labels > 0).squeeze(1)
    assert len(positive) == expected[0] and len(labels) == sum(expected)
    assert torch.equal(samples.positives.rois, samples.rois[positive])
    assert torch.equal(matched < 0, labels == 0) and (samples.rois[:, 0] == 0).all()
    rows = {tuple(p) for p in proposals.tolist()}
    sampled = samples.rois[:, 1:].tolist()
    assert len({tuple(p) for p in sampled}) == len(sampled) and rows >= {tuple(p)
                                                                          for p in sampled}
    for i in positive.tolist():
        box, index = sampled[i], matched[i].item()
        ious = [brute_iou(gt, box) for gt in GT_BOXES.tolist()]
        assert index == max(range(len(ious)), key=ious.__getitem__) and ious[index] >= 0.5
        assert labels[i] == GT_LABELS[index]
        torch.testing.assert_close(samples.regression_targets[i],
                                   torch.tensor(hand_encode(GT_BOXES[index].tolist(), box)))


def test_sampler_draws_random_subsets():
    g = torch.Generator().manual_seed(3)
    proposals = torch.cat((jittered(GT_BOXES, 60, g), far_boxes(60, g)))
    sampler = RoISampler(batch_size_per_image=20, positive_fraction=0.25)
    drawn = [sample_one(sampler, proposals, GT_BOXES, GT_LABELS, g) for _ in range(30)]
    drawn = [s.positives.rois[:, 1:].tolist() for s in drawn]
    subsets = {tuple(sorted(map(tuple, s))) for s in drawn}
    seen = {tuple(p) for s in drawn for p in s}
    assert len(subsets) == 30 and len(seen) > 45     # 5 of 60 positives per draw


def test_sampler_labels_at_the_threshold_by_hand():
    gt = torch.tensor([[0.0, 0.0, 9.0, 9.0], [20.0, 20.0, 29.0, 29.0]])
    proposals = torch.tensor([[0.0, 0.0, 9.0, 4.0],      # 50 of 100 pixels: IoU 0.5, positive
                              [0.0, 0.0, 9.0, 3.0],      # IoU 0.4: background
                              [20.0, 20.0, 29.0, 29.0],  # the second box itself
                              [0.0, 0.0, 29.0, 29.0]])   # IoU 0.11 with each: background
    samples = sample_one(RoISampler(batch_size_per_image=8), proposals, gt,
                         torch.tensor([3, 7]))
    got = {tuple(p): (label, index) for p, label, index in zip(
        samples.rois[:, 1:].tolist(), samples.labels.tolist(), samples.matched_idxs.tolist())}
    assert got == {(0.0, 0.0, 9.0, 4.0): (3, 0), (0.0, 0.0, 9.0, 3.0): (0, -1),
                   (20.0, 20.0, 29.0, 29.0): (7, 1), (0.0, 0.0, 29.0, 29.0): (0, -1)}
    assert len(samples.positives.labels) == 2
    empty = sample_one(RoISampler(), proposals, gt[:0], torch.tensor([], dtype=torch.long))
    assert len(empty.positives.labels) == 0 and empty.labels.tolist() == [0] * 4
    assert empty.matched_idxs.tolist() == [-1] * 4


def test_sampler_of_a_padded_batch_matches_each_image_alone():
    g = torch.Generator().manual_seed(4)
    proposals = torch.zeros(3, 50, 4)
    valid = torch.zeros(3, 50, dtype=torch.bool)
    for i, n in enumerate((50, 30, 0)):
        proposals[i, :n] = torch.cat((jittered(GT_BOXES, n // 2, g), far_boxes(n - n // 2, g)))
        valid[i, :n] = True
    gt = torch.stack((GT_BOXES, GT_BOXES + 1, GT_BOXES + 2))
    gt_labels = torch.stack((GT_LABELS, torch.tensor([2, 0, 0]), torch.tensor([0, 0, 0])))
    samples = RoISampler(batch_size_per_image=16)(proposals, valid, gt, gt_labels, g)
    image, boxes = samples.rois[:, 0].long(), samples.rois[:, 1:]
    assert torch.bincount(image, minlength=3).tolist() == [16, 16, 0]
    assert torch.equal(image, image.sort().values)
    real_gt = gt[gt_labels > 0]                     # the batch's ground truth, in order
    matcher = RoISampler().matcher
    for i in range(2):
        mine = image == i
        assert {tuple(b) for b in boxes[mine].tolist()} <= {
            tuple(b) for b in proposals[i, valid[i]].tolist()}
        real = gt_labels[i] > 0
        matches = matcher(box_iou(gt[i, real], boxes[mine]))
        first = (gt_labels[:i] > 0).sum()
        assert torch.equal(samples.matched_idxs[mine],
                           torch.where(matches >= 0, first + matches, -1))
        assert torch.equal(samples.labels[mine],
                           torch.where(matches >= 0, gt_labels[i, matches.clamp(min=0)], 0))
    positive = samples.matched_idxs >= 0
    assert torch.equal(samples.positives.rois, samples.rois[positive])
    torch.testing.assert_close(samples.regression_targets[positive], BoxCoder(
        ROI_BOX_WEIGHTS).encode(real_gt[samples.matched_idxs[positive]], boxes[positive]))


def test_padded_samples_hold_the_samples_first_then_rows_the_loss_leaves_out():
    """``RoISampler.padded``: the samples that ``__call__`` gives (one generator state), then
    rows of label -1 with a zero box and targets; the counts on the device."""
    proposals = torch.zeros(2, 50, 4)
    valid = torch.zeros(2, 50, dtype=torch.bool)
    g = torch.Generator().manual_seed(5)
    for i, n in enumerate((50, 20)):
        proposals[i, :n] = torch.cat((jittered(GT_BOXES, n // 2, g), far_boxes(n - n // 2, g)))
        valid[i, :n] = True
    gt, gt_labels = torch.stack((GT_BOXES, GT_BOXES)), torch.stack((GT_LABELS, GT_LABELS))
    sampler = RoISampler(batch_size_per_image=16)
    expected = sampler(proposals, valid, gt, gt_labels, torch.Generator().manual_seed(6))
    padded, counts = sampler.padded(proposals, valid, gt, gt_labels,
                                    torch.Generator().manual_seed(6))
    total, positives = counts.tolist()
    assert (total, positives) == (len(expected.labels), len(expected.positives.labels))
    assert 0 < positives < total < 2 * 50
    first = padded.first(total, positives)
    for got, want in zip([*vars(first).values()][:-1] + [*vars(first.positives).values()],
                         [*vars(expected).values()][:-1] + [*vars(expected.positives).values()],
                         strict=True):
        assert torch.equal(got, want)
    assert len(padded.labels) == 2 * 50 + 1
    rest = slice(total, 2 * 50)                 # the last row is spare
    assert (padded.labels[rest] == -1).all() and (padded.matched_idxs[rest] == -1).all()
    assert not padded.rois[rest].any() and not padded.regression_targets[rest].any()
    mine, pads = padded.positives.first(positives), padded.positives.first(2 * 50)
    for got, field in ((mine.rois, expected.rois), (mine.labels, expected.labels),
                       (mine.matched_idxs, expected.matched_idxs)):
        assert torch.equal(got, field[expected.labels > 0])
    assert (pads.labels[positives:] == -1).all()
    assert not pads.rois[positives:].any()
    assert not pads.matched_idxs[positives:].any()      # ground truth 0: a valid index


def test_mask_loss_leaves_out_rows_of_label_minus_one():
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(5, 3, 4, 4, generator=g, requires_grad=True)
    labels, targets = torch.tensor([1, 2, 1, -1, -1]), (torch.rand(5, 4, 4, generator=g) > 0.5)
    padded = mask_loss(logits, labels, targets)
    padded.backward()
    torch.testing.assert_close(padded, mask_loss(logits[:3], labels[:3], targets[:3]))
    assert not logits.grad[3:].any() and logits.grad[:3].abs().sum() > 0


def test_box_loss_leaves_out_rows_of_label_minus_one():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(6, 3, generator=g, requires_grad=True)
    deltas = torch.randn(6, 12, generator=g, requires_grad=True)
    labels, targets = torch.tensor([0, 2, 1, 1, -1, -1]), torch.randn(6, 4, generator=g)
    padded = box_loss(logits, deltas, labels, targets)
    sum(padded).backward()
    plain = box_loss(logits[:4], deltas[:4], labels[:4], targets[:4])
    torch.testing.assert_close(torch.stack(padded), torch.stack(plain))
    assert not logits.grad[4:].any() and not deltas.grad[4:].any()
    assert logits.grad[:4].abs().sum() > 0


def test_box_loss_by_hand():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [1.0, -2.0, 0.0]])
    labels = torch.tensor([0, 2, 1])
    deltas = torch.full((3, 3, 4), 50.0)                 # other classes' deltas are ignored
    deltas[1, 2] = torch.tensor([0.5, -2.0, 0.0, 1.0])
    deltas[2, 1] = torch.tensor([1.0, 1.0, 1.0, 1.0])
    targets = torch.tensor([[9.0, 9.0, 9.0, 9.0], [0.0, 0.0, 0.0, 0.0], [1.0, 3.0, 1.0, 0.5]])
    classification, regression = box_loss(logits, deltas.reshape(3, 12), labels, targets)
    expected_ce = sum(math.log(sum(math.exp(v) for v in row)) - row[k]
                      for row, k in zip(logits.tolist(), labels.tolist())) / 3
    # smooth L1 with beta 1: |d| < 1 -> d^2 / 2, else |d| - 1/2. Row 1: 0.125 + 1.5 + 0 + 0.5;
    # row 2: 0 + 1.5 + 0 + 0.125; row 0 is background; divided by the 3 sampled RoIs
    assert classification.item() == pytest.approx(expected_ce, rel=1e-6)
    assert regression.item() == pytest.approx((2.125 + 1.625) / 3, rel=1e-6)


def test_mask_target_of_a_rectangle_by_hand():
    # image 1: GT 0 a rectangle on rows 20..39 and columns 10..19, GT 1 all ones
    masks_a = torch.zeros(2, 64, 40, dtype=torch.uint8)
    masks_a[0, 20:40, 10:20] = 1
    masks_a[1] = 1
    # image 2: its only GT covers columns 0..13 of rows 0..13
    masks_b = torch.zeros(1, 30, 30, dtype=torch.uint8)
    masks_b[0, :14, :14] = 1
    rois_a = torch.tensor([[3.0, 3.0, 20.0, 20.0], [4.0, 6.0, 32.0, 62.0]])
    rois_b = torch.tensor([[0.0, 0.0, 28.0, 28.0]])
    masks = torch.zeros(3, 64, 40, dtype=torch.uint8)       # the batch's, padded
    masks[:2], masks[2, :30, :30] = masks_a, masks_b[0]
    targets = mask_targets(torch.cat((rois_a, rois_b)), torch.tensor([1, 0, 2]), masks)
    assert targets.shape == (3, 28, 28) and targets.dtype == torch.float32
    assert (targets[0] == 1).all()
    # The reference crops the polygon [10, 20] x [20, 40] to the RoI, whose sides are
    # x2 - x1 = 28 and y2 - y1 = 56 pixels, and scales it to 28 x 28: columns [6, 16]
    # (scale 1) and rows [7, 17] (scale 1/2) hold the cells inside it.
    expected = torch.zeros(28, 28)
    expected[7:17, 6:16] = 1
    assert torch.equal(targets[1], expected)
    # pixels 0..13 are the polygon [0, 14]: cells 0..13 at scale 1
    expected = torch.zeros(28, 28)
    expected[:14, :14] = 1
    assert torch.equal(targets[2], expected)
    assert mask_targets(rois_a[:0], torch.tensor([], dtype=torch.long),
                        masks).shape == (0, 28, 28)


def per_image_mask_targets(boxes, matched_idxs, gt_masks, size=28):
    """The plain path: per image, RoIAlign of its used ground-truth masks, made float32."""
    targets = []
    for rois, matched, masks in zip(boxes, matched_idxs, gt_masks, strict=True):
        if len(rois) == 0:
            continue
        used, index = torch.unique(matched, return_inverse=True)
        rois = torch.cat((index[:, None].float(), rois.float() - 0.5), dim=1)
        pooled = roi_align(masks[used, None].float(), rois, size, 1.0, 2)
        targets.append(pooled[:, 0] >= 0.5)
    return torch.cat(targets).float()


def test_mask_targets_of_the_batch_equal_the_per_image_loop():
    g = torch.Generator().manual_seed(5)
    counts, positives = [3, 1, 2], [7, 0, 5]
    masks = (torch.rand(sum(counts), 50, 60, generator=g) < 0.5).to(torch.uint8)
    xy = torch.rand(sum(positives), 2, generator=g) * 40
    rois = torch.cat((xy, xy + 2 + torch.rand(sum(positives), 2, generator=g) * 25), dim=1)
    matched = [torch.randint(n, (p,), generator=g) for n, p in zip(counts, positives)]
    firsts = [0, *torch.tensor(counts).cumsum(0).tolist()[:-1]]
    got = mask_targets(rois, torch.cat([m + f for m, f in zip(matched, firsts)]), masks)
    expected = per_image_mask_targets(rois.split(positives), matched, masks.split(counts))
    assert torch.equal(got, expected)


def test_mask_loss_by_hand():
    logits = torch.full((2, 3, 2, 2), 100.0)              # other classes' channels: ignored
    logits[0, 2] = torch.tensor([[0.0, 2.0], [-1.0, 3.0]])
    logits[1, 1] = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    targets = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 0.0], [1.0, 1.0]]])
    loss = mask_loss(logits, torch.tensor([2, 1]), targets)
    # binary cross-entropy with logits: log(1 + e^x) - x t, mean over the 8 pixels
    pairs = [(0.0, 1), (2.0, 0), (-1.0, 0), (3.0, 1), (1.0, 0), (-2.0, 0), (0.5, 1), (0.0, 1)]
    expected = sum(math.log1p(math.exp(x)) - x * t for x, t in pairs) / 8
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_mask_loss_without_positives_is_zero_with_a_graph():
    logits = torch.zeros(0, 81, 28, 28, requires_grad=True)
    loss = mask_loss(logits, torch.zeros(0, dtype=torch.long), torch.zeros(0, 28, 28))
    assert loss.item() == 0 and loss.requires_grad and loss.dtype == torch.float32
    loss.backward()
    assert logits.grad.shape == logits.shape


def greedy_nms(boxes, scores, threshold):
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    kept = []
    for i in order:
        if all(brute_iou(boxes[i], boxes[j]) <= threshold for j in kept):
            kept.append(i)
    return kept


def per_class_postprocess(logits, deltas, proposals, size, detections_per_image):
    """The reference's ``PostProcessor.filter_results`` for one image, class by class."""
    probs = F.softmax(logits, dim=-1)
    decoded = BoxCoder(ROI_BOX_WEIGHTS).decode(deltas, proposals).reshape(len(logits), -1, 4)
    height, width = size
    upper = torch.tensor([width - 1, height - 1] * 2, dtype=torch.float32)
    decoded = torch.minimum(decoded.clamp(min=0), upper)
    found = []
    for j in range(1, probs.shape[1]):
        rows = [i for i in range(len(probs)) if probs[i, j] > 0.05]
        boxes = [decoded[i, j].tolist() for i in rows]
        scores = [probs[i, j].item() for i in rows]
        found += [(scores[k], j, rows[k]) for k in greedy_nms(boxes, scores, 0.5)]
    found = sorted(found, reverse=True)[:detections_per_image]
    return (torch.stack([decoded[i, j] for _, j, i in found]) if found else torch.zeros(0, 4),
            torch.tensor([s for s, _, _ in found]), [j for _, j, _ in found])


@pytest.mark.parametrize("detections_per_image", [100, 6])
def test_postprocess_boxes_matches_per_class_loop(detections_per_image):
    g = torch.Generator().manual_seed(detections_per_image)
    sizes = [(50, 60), (40, 80), (30, 30)]
    centres = [torch.tensor([[10.0, 10.0, 30.0, 35.0], [25.0, 5.0, 55.0, 40.0]]),
               torch.tensor([[40.0, 2.0, 75.0, 30.0]]), torch.tensor([[5.0, 5.0, 20.0, 20.0]])]
    proposals = [jittered(c, n, g, jitter=4.0) for c, n in zip(centres, (30, 20, 10))]
    num_classes = 5
    logits = torch.randn(60, num_classes, generator=g) * 2
    logits[50:, 1:] = -10                                   # image 3 finds nothing
    deltas = torch.randn(60, 4 * num_classes, generator=g) * 0.5
    got = postprocess_boxes(logits, deltas, proposals, sizes,
                            detections_per_image=detections_per_image)
    assert len(got) == 3 and len(got[2].scores) == 0
    start = 0
    for d, p, size in zip(got, proposals, sizes):
        rows = slice(start, start + len(p))
        boxes, scores, labels = per_class_postprocess(logits[rows], deltas[rows], p, size,
                                                      detections_per_image)
        start += len(p)
        torch.testing.assert_close(d.boxes, boxes)
        torch.testing.assert_close(d.scores, scores)
        assert d.labels.tolist() == labels and d.labels.dtype == torch.long
        candidates = (F.softmax(logits[rows], -1)[:, 1:] > 0.05).sum().item()
        if detections_per_image == 100 and candidates:
            assert len(labels) < candidates                 # NMS removed some
    if detections_per_image == 6:
        assert len(got[0].scores) == 6                      # the cap cut image 1


def masker_reference(prob, box, height, width):
    """``paste_mask_in_image`` of the reference's ``mask_head/inference.py`` for one 28 x 28
    probability map: the padded map resized by ``F.interpolate`` onto the expanded box.
    Returns the pasted binary mask and the resized values where they were pasted."""
    padded = torch.zeros(30, 30)
    padded[1:-1, 1:-1] = prob
    box = box.float()
    w_half, h_half = (box[2] - box[0]) * 0.5, (box[3] - box[1]) * 0.5
    x_c, y_c = (box[2] + box[0]) * 0.5, (box[3] + box[1]) * 0.5
    w_half *= 30 / 28
    h_half *= 30 / 28
    x1, y1, x2, y2 = (int(v) for v in torch.stack((x_c - w_half, y_c - h_half, x_c + w_half,
                                                   y_c + h_half)).to(torch.int32))
    w, h = max(x2 - x1 + 1, 1), max(y2 - y1 + 1, 1)
    resized = F.interpolate(padded[None, None], size=(h, w), mode="bilinear",
                            align_corners=False)[0, 0]
    image = torch.zeros(height, width, dtype=torch.uint8)
    values = torch.full((height, width), -1.0)
    x_0, x_1, y_0, y_1 = max(x1, 0), min(x2 + 1, width), max(y1, 0), min(y2 + 1, height)
    if x_1 > x_0 and y_1 > y_0:
        part = resized[y_0 - y1:y_1 - y1, x_0 - x1:x_1 - x1]
        image[y_0:y_1, x_0:x_1] = part > 0.5
        values[y_0:y_1, x_0:x_1] = part
    return image, values


def test_paste_masks_matches_per_mask_reference():
    g = torch.Generator().manual_seed(0)
    height, width = 37, 53
    probs = torch.rand(14, 28, 28, generator=g)
    xy = torch.rand(14, 2, generator=g) * torch.tensor([width, height])
    wh = torch.rand(14, 2, generator=g) * 40
    boxes = torch.cat((xy, xy + wh), dim=1)
    boxes[0] = torch.tensor([0.0, 0.0, width - 1, height - 1])    # the whole image
    boxes[1] = torch.tensor([5.3, 7.9, 5.6, 8.1])                 # under one pixel
    boxes[2] = torch.tensor([-3.0, -2.5, 12.2, 60.0])             # out over two sides
    pasted = paste_masks(probs, boxes, (height, width), pixels_per_batch=5 * height * width)
    assert pasted.shape == (14, height, width) and pasted.dtype == torch.uint8
    for mask, prob, box in zip(pasted, probs, boxes):
        expected, values = masker_reference(prob, box, height, width)
        differ = mask != expected
        # only float rounding at exactly the threshold may tell the two apart
        assert ((values[differ] - 0.5).abs() < 1e-5).all()
        assert differ.sum() <= 1
    assert pasted.sum() > 0
    assert paste_masks(probs[:0], boxes[:0], (height, width)).shape == (0, height, width)


def test_full_mask_pasted_into_a_box_fills_exactly_its_pixels():
    # with sides x2 - x1 and y2 - y1 multiples of 28 the grown box has integer corners; in
    # general the reference's truncation of those corners moves the edges by up to a pixel
    height, width = 100, 120
    boxes = torch.tensor([[10.0, 20.0, 38.0, 48.0], [0.0, 0.0, 56.0, 28.0],
                          [63.0, 43.0, 119.0, 99.0]])
    pasted = paste_masks(torch.ones(3, 28, 28), boxes, (height, width))
    for mask, (x1, y1, x2, y2) in zip(pasted, boxes.long().tolist()):
        expected = torch.zeros(height, width, dtype=torch.uint8)
        expected[y1:y2 + 1, x1:x2 + 1] = 1
        assert torch.equal(mask, expected)


def test_scale_boxes_and_postprocess_masks_to_original_size():
    from common.coco.evaluation import encode_masks
    boxes = torch.tensor([[0.0, 0.0, 28.0, 28.0], [10.0, 4.0, 20.0, 30.0]])
    # resized 50 x 60 image of an original 100 x 90 one: x times 1.5, y times 2
    torch.testing.assert_close(scale_boxes(boxes, (50, 60), (100, 90)),
                               torch.tensor([[0.0, 0.0, 42.0, 56.0], [15.0, 8.0, 30.0, 60.0]]))
    logits = torch.full((1, 3, 28, 28), -20.0)
    logits[0, 2] = 20.0                                   # only the predicted class is on
    detections = [ImageDetections(boxes[:1], torch.tensor([0.9]), torch.tensor([2])),
                  ImageDetections(boxes[:0], torch.zeros(0), torch.zeros(0, dtype=torch.long))]
    got = postprocess_masks(logits, detections, [(50, 60), (40, 40)], [(100, 120), (20, 20)])
    assert got[1].masks.shape == (0, 20, 20)
    torch.testing.assert_close(got[0].boxes, torch.tensor([[0.0, 0.0, 56.0, 56.0]]))
    expected = torch.zeros(1, 100, 120, dtype=torch.uint8)
    expected[0, :57, :57] = 1
    assert torch.equal(got[0].masks, expected)
    assert encode_masks(got[0].masks.numpy())[0]["size"] == [100, 120]
    torch.testing.assert_close(mask_probabilities(logits, torch.tensor([1]))[0],
                               torch.full((28, 28), torch.sigmoid(torch.tensor(-20.0)).item()))


def _training_step_losses(device, dtype=None, sample_device=None):
    """Sampler (on ``sample_device``, default ``device``), box and mask losses on a tiny
    two-image batch whose head outputs come from linear layers (under autocast when ``dtype``
    is given); returns the losses, the layers and the samples."""
    sample_device = sample_device or device
    g = torch.Generator().manual_seed(7)
    gt = [GT_BOXES, GT_BOXES[:1]]
    masks = []
    for boxes in gt:
        m = torch.zeros(len(boxes), 120, 240, dtype=torch.uint8)
        for k, (x1, y1, x2, y2) in enumerate(boxes.long().tolist()):
            m[k, y1 + 3:y2 - 3, x1:x2 + 1] = 1
        masks.append(m.to(device))
    proposals = torch.stack([torch.cat((jittered(b, 12, g, 3.0), far_boxes(20, g)))
                             for b in gt]).to(sample_device)
    valid = torch.ones(proposals.shape[:2], dtype=torch.bool, device=sample_device)
    gt_labels = torch.stack((GT_LABELS, torch.tensor([GT_LABELS[0], 0, 0])))
    samples = RoISampler(batch_size_per_image=16)(
        proposals, valid, torch.stack((GT_BOXES, F.pad(GT_BOXES[:1], (0, 0, 0, 2)))).to(
            sample_device), gt_labels.to(sample_device),
        generator=torch.Generator(sample_device).manual_seed(0))
    *fields, positives = vars(samples).values()
    samples = RoISamples(*(t.to(device) for t in fields),
                         Positives(*(t.to(device) for t in vars(positives).values())))
    masks = torch.cat(masks)
    torch.manual_seed(0)
    box_head = torch.nn.Linear(4, 81 * 5).to(device)
    mask_head = torch.nn.Linear(4, 81 * 28 * 28).to(device)
    rois = samples.rois[:, 1:] / 100
    positive = samples.labels > 0
    autocast = (torch.autocast(device, dtype=dtype) if dtype is not None
                else contextlib.nullcontext())
    with autocast:
        out = box_head(rois)
        mask_logits = mask_head(rois[positive]).reshape(-1, 81, 28, 28)
        losses = (*box_loss(out[:, :81], out[:, 81:], samples.labels,
                            samples.regression_targets),
                  mask_loss(mask_logits, samples.labels[positive],
                            mask_targets(samples.rois[positive, 1:],
                                         samples.matched_idxs[positive], masks)))
    return losses, box_head, mask_head, samples


def test_gradients_flow_to_the_heads():
    losses, box_head, mask_head, samples = _training_step_losses("cpu")
    assert all(loss.dtype == torch.float32 and loss.item() > 0 for loss in losses)
    sum(losses).backward()
    for p in (*box_head.parameters(), *mask_head.parameters()):
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    # regression gradients reach only the positives' own classes' deltas
    positive_labels = samples.positives.labels
    rows = torch.nonzero(box_head.weight.grad[81:].reshape(81, 4, 4).abs().sum((1, 2)))
    assert set(rows.squeeze(1).tolist()) == set(positive_labels.tolist())


def test_losses_under_autocast_are_float32():
    losses, *_ = _training_step_losses("cpu", torch.bfloat16)
    reference, *_ = _training_step_losses("cpu")
    for loss, ref in zip(losses, reference):
        assert loss.dtype == torch.float32
        assert loss.item() == pytest.approx(ref.item(), rel=0.05)
    logits = torch.randn(6, 3).bfloat16()
    deltas = (torch.randn(6, 12) * 0.1).bfloat16()
    proposals = [torch.tensor([[1.0, 1.0, 20.0, 20.0]] * 6)]
    (d,) = postprocess_boxes(logits, deltas, proposals, [(30, 30)])
    assert d.boxes.dtype == torch.float32 and d.scores.dtype == torch.float32


@pytest.mark.gpu
@needs_cuda
def test_cuda_matches_cpu():
    cpu, *_ = _training_step_losses("cpu", sample_device="cuda")
    gpu, *_ = _training_step_losses("cuda")
    amp, *_ = _training_step_losses("cuda", torch.bfloat16)
    for a, b, c in zip(cpu, gpu, amp):
        assert b.item() == pytest.approx(a.item(), rel=1e-4)
        assert c.dtype == torch.float32 and c.item() == pytest.approx(a.item(), rel=0.05)
    g = torch.Generator().manual_seed(1)
    probs = torch.rand(20, 28, 28, generator=g)
    xy = torch.rand(20, 2, generator=g) * 400
    boxes = torch.cat((xy, xy + torch.rand(20, 2, generator=g) * 300), dim=1)
    on_cpu = paste_masks(probs, boxes, (480, 640))
    on_gpu = paste_masks(probs.cuda(), boxes.cuda(), (480, 640)).cpu()
    assert (on_cpu != on_gpu).sum() <= 20
    logits, deltas = torch.randn(50, 6, generator=g), torch.randn(50, 24, generator=g) * 0.3
    proposals = [jittered(GT_BOXES, 30, g, 5.0), jittered(GT_BOXES, 20, g, 5.0)]
    sizes = [(120, 240), (100, 230)]
    for a, b in zip(postprocess_boxes(logits, deltas, proposals, sizes),
                    postprocess_boxes(logits.cuda(), deltas.cuda(),
                                      [p.cuda() for p in proposals], sizes)):
        torch.testing.assert_close(b.boxes.cpu(), a.boxes, rtol=1e-5, atol=1e-4)
        assert b.labels.cpu().tolist() == a.labels.tolist()
