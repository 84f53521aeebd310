"""Box coding, IoU, clipping, NMS and matching against hand-computed values and brute-force
loops of maskrcnn-benchmark's definitions (mlcommons/training v1.1 ``object_detection``)."""

import math

import pytest
import torch

from benchmarks.maskrcnn.boxes import (
    BBOX_XFORM_CLIP,
    ROI_BOX_WEIGHTS,
    RPN_BOX_WEIGHTS,
    BoxCoder,
    Matcher,
    batched_nms,
    box_iou,
    clip_boxes,
    min_size_mask,
)


def random_boxes(n, generator, extent=50.0, max_size=30.0):
    xy = torch.rand(n, 2, generator=generator, dtype=torch.float64) * extent
    wh = torch.rand(n, 2, generator=generator, dtype=torch.float64) * max_size
    return torch.cat((xy, xy + wh), dim=1)


def brute_iou(a, b):
    """IoU of two boxes, pixels counted inclusively (``boxlist_iou``, ``devIoU``)."""
    iw = max(min(a[2], b[2]) - max(a[0], b[0]) + 1, 0.0)
    ih = max(min(a[3], b[3]) - max(a[1], b[1]) + 1, 0.0)
    inter = iw * ih
    area_a = (a[2] - a[0] + 1) * (a[3] - a[1] + 1)
    area_b = (b[2] - b[0] + 1) * (b[3] - b[1] + 1)
    return inter / (area_a + area_b - inter)


def brute_nms(boxes, scores, idxs, threshold):
    """Greedy NMS per category, highest score first; kept indices by decreasing score."""
    boxes, scores, idxs = boxes.tolist(), scores.tolist(), idxs.tolist()
    kept = []
    for i in sorted(range(len(boxes)), key=lambda i: -scores[i]):
        if all(idxs[j] != idxs[i] or brute_iou(boxes[j], boxes[i]) <= threshold
               for j in kept):
            kept.append(i)
    return kept


def test_encode_by_hand():
    # proposal: 10 x 10 pixels centred at (5, 5); target: 20 x 10 centred at (12, 9)
    proposal = torch.tensor([[0.0, 0.0, 9.0, 9.0]])
    target = torch.tensor([[2.0, 4.0, 21.0, 13.0]])
    codes = BoxCoder(ROI_BOX_WEIGHTS).encode(target, proposal)
    # dx = 10 * (12 - 5) / 10, dy = 10 * (9 - 5) / 10, dw = 5 * log(20 / 10), dh = 5 * log(1)
    torch.testing.assert_close(codes, torch.tensor([[7.0, 4.0, 5 * math.log(2), 0.0]]))
    assert torch.equal(BoxCoder(ROI_BOX_WEIGHTS).decode(codes, proposal), target)


@pytest.mark.parametrize("weights", [RPN_BOX_WEIGHTS, ROI_BOX_WEIGHTS])
def test_encode_decode_round_trip(weights):
    g = torch.Generator().manual_seed(0)
    proposals, targets = random_boxes(64, g), random_boxes(64, g)
    coder = BoxCoder(weights)
    torch.testing.assert_close(coder.decode(coder.encode(targets, proposals), proposals),
                               targets)


def test_decode_of_no_boxes():
    """An image left without proposals decodes to no boxes of any class."""
    decoded = BoxCoder(ROI_BOX_WEIGHTS).decode(torch.zeros(0, 4 * 81), torch.zeros(0, 4))
    assert decoded.shape == (0, 4 * 81)


def test_decode_per_class_codes_and_clip():
    coder = BoxCoder(RPN_BOX_WEIGHTS)
    boxes = torch.tensor([[0.0, 0.0, 15.0, 7.0], [4.0, 4.0, 5.0, 9.0]])
    codes = torch.tensor([[0.5, -0.25, 10.0, 0.0, 0.0, 0.0, 0.1, -0.2],
                          [1.0, 1.0, -1.0, 20.0, 0.0, 0.0, 0.0, 0.0]])
    decoded = coder.decode(codes, boxes)
    assert decoded.shape == (2, 8)
    for k in range(2):
        torch.testing.assert_close(decoded[:, 4 * k:4 * k + 4],
                                   coder.decode(codes[:, 4 * k:4 * k + 4], boxes))
    # dw = 10 is clamped to log(1000 / 16): the first box, 16 wide, becomes 1000 wide;
    # its centre x moves from 0 + 16 / 2 = 8 by 0.5 * 16, so x1 = 16 - 500, x2 = 16 + 500 - 1
    assert math.exp(BBOX_XFORM_CLIP) * 16 == pytest.approx(1000)
    torch.testing.assert_close(decoded[0, [0, 2]], torch.tensor([-484.0, 515.0]))


def test_box_iou_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    a, b = random_boxes(20, g), random_boxes(15, g)
    a[0] = torch.tensor([3.0, 3.0, 3.0, 3.0])          # a single pixel
    b[0] = torch.tensor([3.0, 3.0, 5.0, 4.0])          # sharing it: IoU 1 / 6
    expected = torch.tensor([[brute_iou(x, y) for y in b.tolist()] for x in a.tolist()],
                            dtype=torch.float64)
    torch.testing.assert_close(box_iou(a, b), expected)
    assert box_iou(a, b)[0, 0] == pytest.approx(1 / 6)


def test_clip_boxes_and_min_size_by_hand():
    boxes = torch.tensor([[-5.0, 2.0, 130.0, 70.0], [10.0, -1.0, 12.0, 3.5]])
    # an image 60 high and 120 wide: x in [0, 119], y in [0, 59]
    expected = torch.tensor([[0.0, 2.0, 119.0, 59.0], [10.0, 0.0, 12.0, 3.5]])
    assert torch.equal(clip_boxes(boxes, (60, 120)), expected)
    # the second box is 3 pixels wide (10, 11, 12) and 4.5 high
    assert min_size_mask(expected, 3).tolist() == [True, True]
    assert min_size_mask(expected, 4).tolist() == [True, False]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
def test_batched_nms_matches_greedy_loop(seed, threshold):
    g = torch.Generator().manual_seed(seed)
    n = 120
    boxes = random_boxes(n, g, extent=40.0)
    scores = torch.randperm(n, generator=g).double() / n         # distinct: no ties
    idxs = torch.randint(0, 4, (n,), generator=g) * 3            # sparse category labels
    keep = batched_nms(boxes, scores, idxs, threshold)
    assert keep.tolist() == brute_nms(boxes, scores, idxs, threshold)
    assert len(keep) < n                                         # some were suppressed


def test_batched_nms_categories_and_strict_threshold():
    boxes = torch.tensor([[0.0, 0.0, 9.0, 9.0],     # 100 pixels
                          [0.0, 0.0, 9.0, 9.0],     # the same box, another category
                          [0.0, 0.0, 9.0, 4.0],     # 50 pixels inside the first: IoU 0.5
                          [0.0, 0.0, 9.0, 8.0]])    # 90 pixels inside the first: IoU 0.9
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    idxs = torch.tensor([0, 1, 0, 0])
    # IoU exactly at the threshold does not suppress (the CUDA kernel's ">")
    assert batched_nms(boxes, scores, idxs, 0.5).tolist() == [0, 1, 2]
    assert batched_nms(boxes, scores, idxs, 0.49).tolist() == [0, 1]
    assert batched_nms(boxes, scores, torch.tensor([0, 1, 2, 0]), 0.49).tolist() == [0, 1, 2]
    assert batched_nms(boxes[:0], scores[:0], idxs[:0], 0.5).tolist() == []


def test_batched_nms_suppressed_boxes_do_not_suppress():
    # IoUs: 0-1 0.82, 1-2 0.74, 0-2 0.60, 2-3 0.74, 0-3 0.43. At 0.7, box 0 removes box 1,
    # box 1 would remove box 2 but is gone, so box 2 stays and removes box 3.
    boxes = torch.tensor([[0.0, 0.0, 9.0, 9.0], [1.0, 0.0, 10.0, 9.0],
                          [2.5, 0.0, 11.5, 9.0], [4.0, 0.0, 13.0, 9.0]])
    scores = torch.tensor([0.4, 0.3, 0.2, 0.1])
    assert batched_nms(boxes, scores, torch.zeros(4, dtype=torch.long), 0.7).tolist() == [0, 2]


def test_matcher_by_hand():
    # 3 ground truths (rows) x 8 predictions (columns); thresholds 0.7 and 0.3
    quality = torch.tensor([
        [0.9, 0.5, 0.10, 0.4, 0.25, 0.10, 0.7, 0.3],
        [0.1, 0.6, 0.15, 0.1, 0.00, 0.05, 0.0, 0.0],
        [0.0, 0.1, 0.20, 0.0, 0.20, 0.00, 0.0, 0.0],
    ], dtype=torch.float64)
    B, L = Matcher.BETWEEN_THRESHOLDS, Matcher.BELOW_LOW_THRESHOLD
    assert (B, L) == (-2, -1)
    # 0: above high; 1: between; 2: below; 3: between; 4: below (best is gt 0 at 0.25);
    # 5: below; 6: exactly high -> matched; 7: exactly low -> between
    assert Matcher(0.7, 0.3)(quality).tolist() == [0, B, L, B, L, L, 0, B]
    # gt 1's best is prediction 1 (0.6); gt 2's best, 0.2, is a tie of predictions 2 and 4.
    # The rescued predictions take their own best ground truth: 4 goes to gt 0, not gt 2.
    assert Matcher(0.7, 0.3, True)(quality).tolist() == [0, 1, 2, B, 0, L, 0, B]
    with pytest.raises(ValueError, match="ground-truth"):
        Matcher(0.7, 0.3)(quality[:0])
