"""RPN proposal selection against a per-image, per-level loop written from the reference's
``RPNPostProcessor``; anchor labels, sampler and loss against hand-worked cases of its
``RPNLossComputation`` and ``BalancedPositiveNegativeSampler`` (mlcommons/training v1.1
``object_detection/pytorch/maskrcnn_benchmark/modeling/rpn``)."""

import functools
import math

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from benchmarks.maskrcnn.anchors import fpn_anchors, visible
from benchmarks.maskrcnn.boxes import (
    RPN_BOX_WEIGHTS,
    BoxCoder,
    Matcher,
    box_iou,
    clip_boxes,
    min_size_mask,
)
from benchmarks.maskrcnn.rpn import RPN, flatten_levels
from benchmarks.maskrcnn.topk import split_topk
from common.errors import UserError

IMAGE_SIZES = [(64, 96), (52, 70)]          # (height, width), the batch padded to 64 x 96
FEATURE_SIZES = [(16, 24), (8, 12), (4, 6), (2, 3), (1, 2)]


def head_outputs(seed, batch=2, dtype=torch.float32):
    """Random per-level logits and deltas; some logits saturate to a sigmoid of exactly 1,
    so that scores tie across positions, levels and images."""
    g = torch.Generator().manual_seed(seed)
    objectness, deltas = [], []
    for h, w in FEATURE_SIZES:
        logits = torch.randn(batch, 3, h, w, generator=g) * 2
        logits[torch.rand(logits.shape, generator=g) < 0.01] = 30.0
        objectness.append(logits.to(dtype))
        deltas.append((torch.randn(batch, 12, h, w, generator=g) * 0.3).to(dtype))
    return objectness, deltas


def per_anchor(objectness, deltas, image):
    """Logits [L] and deltas [L, 4] of one image and level, anchor i = (row * W + col) * A + a."""
    _, num_anchors, height, width = objectness.shape
    logits = torch.empty(height * width * num_anchors)
    codes = torch.empty(height * width * num_anchors, 4)
    for row in range(height):
        for col in range(width):
            for a in range(num_anchors):
                i = (row * width + col) * num_anchors + a
                logits[i] = objectness[image, a, row, col]
                codes[i] = deltas[image, 4 * a:4 * a + 4, row, col]
    return logits, codes


def greedy_nms(boxes, threshold):
    """Indices kept by greedy NMS of boxes already in rank order."""
    iou = box_iou(boxes, boxes)
    kept = []
    for i in range(len(boxes)):
        if all(iou[j, i] <= threshold for j in kept):
            kept.append(i)
    return torch.tensor(kept, dtype=torch.int64)


def loop_proposals(objectness, deltas, anchors, image_sizes, *, pre, post, fpn_post,
                   training, per_image, min_size, gt_boxes=None):
    """The reference's selection one image and one level at a time."""
    coder = BoxCoder(RPN_BOX_WEIGHTS)
    candidates = []                                         # per image: (boxes, scores)
    for image, size in enumerate(image_sizes):
        image_boxes, image_scores = [], []
        for obj, delta, cells in zip(objectness, deltas, anchors):
            logits, codes = per_anchor(obj.float(), delta.float(), image)
            scores = logits.sigmoid()
            order = scores.argsort(descending=True, stable=True)[:pre]
            boxes = clip_boxes(coder.decode(codes[order], cells[order]), size)
            scores = scores[order]
            big = min_size_mask(boxes, min_size)
            boxes, scores = boxes[big], scores[big]
            keep = greedy_nms(boxes, 0.7)[:post]
            image_boxes.append(boxes[keep])
            image_scores.append(scores[keep])
        candidates.append((torch.cat(image_boxes), torch.cat(image_scores)))
    if training and not per_image:
        scores = torch.cat([s for _, s in candidates])
        chosen = torch.zeros(len(scores), dtype=torch.bool)
        chosen[scores.argsort(descending=True, stable=True)[:fpn_post]] = True
        chosen = chosen.split([len(s) for _, s in candidates])
        result = [boxes[mask] for (boxes, _), mask in zip(candidates, chosen)]
    else:
        result = []
        for boxes, scores in candidates:
            order = scores.argsort(descending=True, stable=True)[:fpn_post]
            result.append(boxes[order.sort().values if training else order])
    if gt_boxes is not None:
        result = [torch.cat((r, gt)) for r, gt in zip(result, gt_boxes)]
    return result


GT_BOXES = [torch.tensor([[10.0, 12.0, 40.0, 30.0], [50.0, 5.0, 90.0, 60.0]]),
            torch.tensor([[0.0, 0.0, 20.0, 25.0]])]


def padded(boxes):
    """Per-image boxes [M_i, 4] as a padded batch [B, M, 4] and which are real [B, M]."""
    valid = [torch.ones(len(b), dtype=torch.bool) for b in boxes]
    return pad_sequence(boxes, batch_first=True), pad_sequence(valid, batch_first=True)


GT_PADDED = padded(GT_BOXES)


@pytest.mark.parametrize(("training", "per_image"), [(True, False), (True, True),
                                                     (False, False)])
@pytest.mark.parametrize(("topk_chunks", "min_size"), [(1, 0), (4, 12)])
def test_proposals_match_per_image_loop(training, per_image, topk_chunks, min_size):
    objectness, deltas = head_outputs(seed=topk_chunks + min_size)
    anchors = fpn_anchors(FEATURE_SIZES)
    # pre-NMS 150 cuts P2 and P3 (1152 and 288 anchors) but not P4-P6; 60 over the batch or
    # per image cuts the candidates of the levels
    settings = dict(pre=150, post=40, fpn_post=60)
    rpn = RPN(pre_nms_top_n_train=150, pre_nms_top_n_test=150, post_nms_top_n_train=40,
              post_nms_top_n_test=40, fpn_post_nms_top_n_train=60, fpn_post_nms_top_n_test=60,
              fpn_post_nms_per_image_train=per_image, min_size=min_size).train(training)
    if topk_chunks > 1:
        rpn.topk = functools.partial(split_topk, num_chunks=topk_chunks)
    got = rpn.proposals(objectness, deltas, anchors, IMAGE_SIZES, GT_BOXES)
    expected = loop_proposals(objectness, deltas, anchors, IMAGE_SIZES, **settings,
                              training=training, per_image=per_image, min_size=min_size,
                              gt_boxes=GT_BOXES if training else None)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-4)
    counts = [len(g) - (len(gt) if training else 0) for g, gt in zip(got, GT_BOXES)]
    if training and not per_image:
        assert sum(counts) == 60
    else:
        assert max(counts) <= 60


def test_proposals_reference_defaults_and_empty_result():
    rpn = RPN()
    assert (rpn.pre_nms_top_n_train, rpn.pre_nms_top_n_test) == (2000, 1000)
    assert (rpn.post_nms_top_n_train, rpn.post_nms_top_n_test) == (2000, 1000)
    assert (rpn.fpn_post_nms_top_n_train, rpn.fpn_post_nms_top_n_test) == (2000, 1000)
    assert (rpn.nms_thresh, rpn.min_size) == (0.7, 0)
    objectness, deltas = head_outputs(seed=1)
    anchors = fpn_anchors(FEATURE_SIZES)
    # every box is smaller than 1000 pixels: nothing is proposed but the ground truth
    got = RPN(min_size=1000).proposals(objectness, deltas, anchors, IMAGE_SIZES, GT_BOXES)
    assert [g.tolist() for g in got] == [gt.tolist() for gt in GT_BOXES]


def test_proposals_autocast_and_half_inputs():
    objectness, deltas = head_outputs(seed=2, dtype=torch.bfloat16)
    anchors = fpn_anchors(FEATURE_SIZES)
    rpn = RPN(pre_nms_top_n_train=100, fpn_post_nms_top_n_train=80)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = rpn.proposals(objectness, deltas, anchors, IMAGE_SIZES, GT_BOXES)
    expected = rpn.proposals([o.float() for o in objectness], [d.float() for d in deltas],
                             anchors, IMAGE_SIZES, GT_BOXES)
    for g, e in zip(got, expected):
        assert g.dtype == torch.float32
        assert torch.equal(g, e)


# One level of 1 x 3 cells with 2 anchors each: anchor i = col * 2 + a. In a 100 x 100 image:
ANCHORS = torch.tensor([
    [10.0, 10.0, 29.0, 29.0],   # 0: equals ground truth 0 (IoU 1): positive
    [60.0, 60.0, 79.0, 79.0],   # 1: IoU 400 / 600 with ground truth 1, its best: positive
    [70.0, 60.0, 89.0, 79.0],   # 2: ties with anchor 1 for ground truth 1: positive too
    [10.0, 20.0, 29.0, 39.0],   # 3: IoU 200 / 600 = 1/3 with ground truth 0: ignored
    [40.0, 10.0, 49.0, 19.0],   # 4: overlaps nothing: negative
    [-5.0, 0.0, 14.0, 19.0],    # 5: IoU 50 / 750 with ground truth 0, but leaves the image
])
GT = torch.tensor([[10.0, 10.0, 29.0, 29.0], [60.0, 60.0, 89.0, 79.0]])
LABELS = [1.0, 1.0, 1.0, -1.0, 0.0, -1.0]


def one_level(values):
    """Per-anchor values [6, C] as one level's head output [1, 2C, 1, 3]."""
    c = values.shape[1]
    out = torch.empty(1, 2 * c, 1, 3)
    for i, v in enumerate(values):
        col, a = divmod(i, 2)
        out[0, a * c:(a + 1) * c, 0, col] = v
    return out


def test_anchor_labels_and_targets_by_hand():
    labels, targets = RPN().targets([ANCHORS], [(100, 100)], *padded([GT]))
    assert labels.tolist() == [LABELS]
    # anchor 0 sits on its box; anchors 1 and 2 (20 x 20, centres x 70 and 80) regress to
    # ground truth 1 (30 x 20, centre x 75): dx = +-5 / 20, dw = log(30 / 20)
    expected = torch.zeros(6, 4)
    expected[1] = torch.tensor([0.25, 0.0, math.log(1.5), 0.0])
    expected[2] = torch.tensor([-0.25, 0.0, math.log(1.5), 0.0])
    torch.testing.assert_close(targets[0, :3], expected[:3])
    # a higher foreground threshold changes nothing: 1 and 2 are low-quality matches
    labels, _ = RPN(fg_iou_threshold=0.9).targets([ANCHORS], [(100, 100)], *padded([GT]))
    assert labels.tolist() == [LABELS]
    # a straddle threshold of -1 makes anchor 5 visible: IoU 1/15 < 0.3, negative
    labels, _ = RPN(straddle_thresh=-1).targets([ANCHORS], [(100, 100)], *padded([GT]))
    assert labels[0, 5] == 0


def per_image_targets(rpn, anchors, image_sizes, gt_boxes):
    """The plain path: :meth:`RPN.targets` one image at a time on its own ground truth."""
    cells = torch.cat(anchors)
    labels, regression = [], []
    for size, gt in zip(image_sizes, gt_boxes):
        matches = rpn.matcher(box_iou(gt, cells))
        ignored = (matches == Matcher.BETWEEN_THRESHOLDS) | ~visible(cells, size)
        labels.append(torch.where(ignored, -1.0, (matches >= 0).float()))
        regression.append(rpn.box_coder.encode(gt[matches.clamp(min=0)], cells))
    return torch.stack(labels), torch.stack(regression)


def test_batched_targets_equal_the_per_image_loop():
    anchors = fpn_anchors(FEATURE_SIZES)
    g = torch.Generator().manual_seed(8)
    gt = [GT_BOXES[0], GT_BOXES[1], torch.cat((GT_BOXES[1] + 3, GT_BOXES[0] - 2, GT_BOXES[1]))]
    gt = [b + torch.rand(len(b), 4, generator=g) for b in gt]
    sizes = [*IMAGE_SIZES, (60, 80)]
    labels, regression = RPN().targets(anchors, torch.tensor(sizes), *padded(gt))
    want_labels, want_regression = per_image_targets(RPN(), anchors, sizes, gt)
    assert torch.equal(labels, want_labels)
    torch.testing.assert_close(regression, want_regression, rtol=0, atol=0)
    # an image without ground truth: negative or ignored (outside the image) anchors only
    boxes, valid = padded(gt)
    valid[1] = False
    labels, _ = RPN().targets(anchors, torch.tensor(sizes), boxes, valid)
    assert torch.equal(labels[1], torch.where(labels[1] < 0, -1.0, 0.0))
    assert torch.equal(labels[[0, 2]], want_labels[[0, 2]])


@pytest.mark.parametrize(("training", "per_image"), [(True, False), (True, True)])
def test_padded_proposals_equal_the_per_image_list(training, per_image):
    objectness, deltas = head_outputs(seed=9)
    anchors = fpn_anchors(FEATURE_SIZES)
    rpn = RPN(pre_nms_top_n_train=150, post_nms_top_n_train=40, fpn_post_nms_top_n_train=60,
              fpn_post_nms_per_image_train=per_image).train(training)
    boxes, valid = rpn.padded_proposals(objectness, deltas, anchors,
                                        torch.tensor(IMAGE_SIZES), *GT_PADDED)
    expected = rpn.proposals(objectness, deltas, anchors, IMAGE_SIZES, GT_BOXES)
    for b, v, e in zip(boxes, valid, expected):
        assert torch.equal(b[v], e)


def smooth_l1(x, beta=1 / 9):
    x = abs(x)
    return 0.5 * x * x / beta if x < beta else x - 0.5 * beta


def test_loss_by_hand():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.0])
    codes = torch.full((6, 4), 5.0)                 # anchors 3 to 5 carry no box loss
    codes[0] = torch.tensor([0.05, -0.5, 0.0, 0.0])
    codes[1] = torch.tensor([0.25, 0.0, math.log(1.5) + 0.02, 0.0])
    codes[2] = torch.zeros(4)
    objectness, deltas = one_level(logits[:, None]), one_level(codes)
    loss_objectness, loss_box = RPN().loss([objectness], [deltas], [ANCHORS], [(100, 100)],
                                           *padded([GT]))
    # sampled: the 3 positives and the 1 negative, 4 in all
    expected_objectness = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(1.0))
                           + math.log1p(math.exp(-0.5)) + math.log1p(math.exp(-2.0))) / 4
    expected_box = (smooth_l1(0.05) + smooth_l1(0.5) + smooth_l1(0.02)
                    + smooth_l1(0.25) + smooth_l1(math.log(1.5))) / 4
    assert loss_objectness.item() == pytest.approx(expected_objectness, rel=1e-6)
    assert loss_box.item() == pytest.approx(expected_box, rel=1e-5)


def make_labels(positives, negatives, ignored, seed=0):
    labels = torch.tensor([1.0] * positives + [0.0] * negatives + [-1.0] * ignored)
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))]


@pytest.mark.parametrize(("positives", "negatives", "want_pos", "want_neg"), [
    (300, 1000, 128, 128), (20, 1000, 20, 236), (20, 100, 20, 100), (0, 1000, 0, 256),
    (500, 10, 128, 10)])
def test_sampler_counts(positives, negatives, want_pos, want_neg):
    labels = torch.stack([make_labels(positives, negatives, 50, seed=s) for s in range(2)])
    pos, neg = RPN().sample(labels, torch.Generator().manual_seed(0))
    assert pos.sum(1).tolist() == [want_pos] * 2
    assert neg.sum(1).tolist() == [want_neg] * 2
    assert (labels[pos] == 1).all() and (labels[neg] == 0).all()


def test_sampler_fraction_and_randomness():
    rpn = RPN(batch_size_per_image=8, positive_fraction=0.25)
    labels = make_labels(10, 30, 5)[None]
    pos, neg = rpn.sample(labels, torch.Generator().manual_seed(1))
    assert (pos.sum().item(), neg.sum().item()) == (2, 6)
    again, _ = rpn.sample(labels, torch.Generator().manual_seed(1))
    assert torch.equal(pos, again)
    # each of the 10 positives is drawn with probability 2 / 10: about 80 times in 400 draws
    g = torch.Generator().manual_seed(2)
    hits = sum(rpn.sample(labels, g)[0][0].float() for _ in range(400))
    assert hits.sum() == 800
    assert hits[labels[0] == 1].min() > 50 and hits[labels[0] == 1].max() < 115


def test_gradients_reach_sampled_anchors_only():
    objectness, deltas = head_outputs(seed=3)
    objectness = [o.requires_grad_() for o in objectness]
    deltas = [d.requires_grad_() for d in deltas]
    anchors = fpn_anchors(FEATURE_SIZES)
    rpn = RPN(batch_size_per_image=64)
    loss_objectness, loss_box = rpn.loss(objectness, deltas, anchors, IMAGE_SIZES, *GT_PADDED,
                                         torch.Generator().manual_seed(7))
    (loss_objectness + loss_box).backward()
    labels, _ = rpn.targets(anchors, IMAGE_SIZES, *GT_PADDED)
    pos, neg = rpn.sample(labels, torch.Generator().manual_seed(7))
    grad_logits, grad_codes = flatten_levels([o.grad for o in objectness],
                                             [d.grad for d in deltas])
    assert torch.equal(grad_logits != 0, pos | neg)
    assert torch.equal((grad_codes != 0).any(-1), pos)
    assert pos.sum() > 0 and (pos | neg).sum(1).tolist() == [64, 64]


def test_loss_half_inputs_under_autocast():
    objectness, deltas = head_outputs(seed=4, dtype=torch.bfloat16)
    anchors = fpn_anchors(FEATURE_SIZES)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = RPN().loss(objectness, deltas, anchors, IMAGE_SIZES, *GT_PADDED,
                         torch.Generator().manual_seed(0))
    expected = RPN().loss([o.float() for o in objectness], [d.float() for d in deltas],
                          anchors, IMAGE_SIZES, *GT_PADDED, torch.Generator().manual_seed(0))
    for g, e in zip(got, expected):
        assert g.dtype == torch.float32
        assert torch.equal(g, e)


def test_bad_settings_and_shapes():
    with pytest.raises(UserError, match="pre_nms_top_n_train=0"):
        RPN(pre_nms_top_n_train=0)
    with pytest.raises(UserError, match="IoU thresholds"):
        RPN(fg_iou_threshold=0.3, bg_iou_threshold=0.7)
    objectness, deltas = head_outputs(seed=5)
    anchors = fpn_anchors(FEATURE_SIZES)
    with pytest.raises(ValueError, match="anchors"):
        RPN().proposals(objectness, deltas, anchors[::-1], IMAGE_SIZES)
    with pytest.raises(ValueError, match="image sizes"):
        RPN().loss(objectness, deltas, anchors, IMAGE_SIZES[:1], *padded(GT_BOXES[:1]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("training", [True, False])
def test_cuda_equals_cpu(training):
    objectness, deltas = head_outputs(seed=6)
    anchors = fpn_anchors(FEATURE_SIZES)
    rpn = RPN(pre_nms_top_n_train=300, batch_size_per_image=10_000)
    rpn.topk = functools.partial(split_topk, num_chunks=4)
    rpn.train(training)
    cuda = [[t.cuda() for t in ts] for ts in (objectness, deltas, anchors, GT_BOXES)]
    got = rpn.proposals(*cuda[:3], IMAGE_SIZES, cuda[3])
    expected = rpn.proposals(objectness, deltas, anchors, IMAGE_SIZES, GT_BOXES)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-6, atol=1e-4)
    # every anchor sampled: no randomness left to differ between the devices
    gt_cuda = [t.cuda() for t in GT_PADDED]
    for g, e in zip(rpn.loss(*cuda[:3], IMAGE_SIZES, *gt_cuda),
                    rpn.loss(objectness, deltas, anchors, IMAGE_SIZES, *GT_PADDED)):
        torch.testing.assert_close(g.cpu(), e)
