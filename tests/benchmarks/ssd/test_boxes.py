"""Default boxes, box coding, matching and NMS against hand-computed values and a literal
per-image transcription of the reference's ``Encoder`` (``utils.py``, mlcommons/training v1.1)."""

import math

import pytest
import torch

from benchmarks.ssd.boxes import (
    box_iou,
    dboxes300_coco,
    decode,
    decode_batch,
    encode,
    ltrb_to_xywh,
    match,
    nms_keep,
    xywh_to_ltrb,
)

DBOXES = dboxes300_coco()


def reference_encode(bboxes_in, labels_in, dboxes, criteria=0.5):
    """``Encoder.encode`` for one image, as the reference writes it."""
    dboxes_ltrb = xywh_to_ltrb(dboxes)
    ious = box_iou(bboxes_in, dboxes_ltrb)
    best_dbox_ious, best_dbox_idx = ious.max(dim=0)
    best_bbox_ious, best_bbox_idx = ious.max(dim=1)
    best_dbox_ious.index_fill_(0, best_bbox_idx, 2.0)
    for idx in range(best_bbox_idx.size(0)):   # sequential: the later ground truth wins
        best_dbox_idx[best_bbox_idx[idx]] = idx
    masks = best_dbox_ious > criteria
    labels_out = torch.zeros(dboxes.shape[0], dtype=torch.long)
    labels_out[masks] = labels_in[best_dbox_idx[masks]]
    bboxes_out = dboxes_ltrb.clone()
    bboxes_out[masks, :] = bboxes_in[best_dbox_idx[masks], :]
    return ltrb_to_xywh(bboxes_out), labels_out


def reference_decode_single(bboxes_in, scores_in, criteria, max_output, max_num=200,
                            nms_valid_thresh=0.05):
    """``Encoder.decode_single`` (boxes [A, 4] ltrb, probabilities [A, C]), as written."""
    bboxes_out, scores_out, labels_out = [], [], []
    for i, score in enumerate(scores_in.split(1, 1)):
        if i == 0:
            continue
        score = score.squeeze(1)
        mask = score > nms_valid_thresh
        bboxes, score = bboxes_in[mask, :], score[mask]
        if score.size(0) == 0:
            continue
        _, score_idx_sorted = score.sort(dim=0)
        score_idx_sorted = score_idx_sorted[-max_num:]
        candidates = []
        while score_idx_sorted.numel() > 0:
            idx = score_idx_sorted[-1].item()
            iou_sorted = box_iou(bboxes[score_idx_sorted, :], bboxes[idx, :][None]).squeeze(1)
            score_idx_sorted = score_idx_sorted[iou_sorted < criteria]
            candidates.append(idx)
        bboxes_out.append(bboxes[candidates, :])
        scores_out.append(score[candidates])
        labels_out.extend([i] * len(candidates))
    bboxes_out, scores_out = torch.cat(bboxes_out), torch.cat(scores_out)
    labels_out = torch.tensor(labels_out, dtype=torch.long)
    _, max_ids = scores_out.sort(dim=0)
    max_ids = max_ids[-max_output:]
    return bboxes_out[max_ids, :], labels_out[max_ids], scores_out[max_ids]


def test_8732_default_boxes_by_hand():
    assert DBOXES.shape == (8732, 4) == (38**2 * 4 + 19**2 * 6 + 10**2 * 6 + 5**2 * 6
                                         + 3**2 * 4 + 1 * 4, 4)
    s2 = math.sqrt(2)
    expected = {
        # 38x38 map, step 8 (fk = 300 / 8 = 37.5), scale 21 / 300
        0: (0.5 / 37.5, 0.5 / 37.5, 0.07, 0.07),
        # its second size sqrt(21 * 45) / 300, row 10, column 20
        1444 + 10 * 38 + 20: (20.5 / 37.5, 10.5 / 37.5, math.sqrt(0.07 * 0.15),
                              math.sqrt(0.07 * 0.15)),
        # its aspect ratio 1/2 (the inverse of 2), last row and column
        3 * 1444 + 37 * 38 + 37: (37.5 / 37.5, 37.5 / 37.5, 0.07 / s2, 0.07 * s2),
        # 3x3 map (offset 8692), step 100 (fk = 3), scale 207 / 300
        8692: (0.5 / 3, 0.5 / 3, 0.69, 0.69),
        # its aspect ratio 2, row 1, column 2
        8692 + 2 * 9 + 1 * 3 + 2: (2.5 / 3, 1.5 / 3, 0.69 * s2, 0.69 / s2),
        # 1x1 map (offset 8728): sqrt(261 * 315) / 300, and ratio 2 with w clamped to 1
        8729: (0.5, 0.5, math.sqrt(0.87 * 1.05), math.sqrt(0.87 * 1.05)),
        8730: (0.5, 0.5, 1.0, 0.87 / s2),
    }
    for i, box in expected.items():
        torch.testing.assert_close(DBOXES[i], torch.tensor(box), msg=f"box {i}")
    torch.testing.assert_close(xywh_to_ltrb(DBOXES[8730]),
                               torch.tensor([0.0, 0.5 - 0.87 / s2 / 2, 1.0, 0.5 + 0.87 / s2 / 2]))
    assert DBOXES.min() >= 0 and DBOXES.max() <= 1


def test_encode_decode_round_trip():
    torch.manual_seed(0)
    boxes = torch.cat((torch.rand(2, 8732, 2), torch.rand(2, 8732, 2) * 0.9 + 0.05), -1)
    offsets = encode(boxes, DBOXES)
    torch.testing.assert_close(decode(offsets, DBOXES), boxes)
    torch.testing.assert_close(encode(DBOXES, DBOXES), torch.zeros(8732, 4))
    # the variances: a shift of one default-box width is 10, a doubled width log(2) / 0.2
    shifted = DBOXES[8729] * torch.tensor([1.0, 1.0, 2.0, 1.0])
    shifted[0] += DBOXES[8729, 2]
    torch.testing.assert_close(encode(shifted, DBOXES[8729:8730])[0],
                               torch.tensor([10.0, 0.0, math.log(2) / 0.2, 0.0]))


def test_match_by_hand():
    """Image 0: box A is default box 400 itself (38x38 map, size 0.07, row 10, column 20),
    so 400 (IoU 1) and the two aspect-ratio-2 boxes of that cell (IoU 0.0049 / 0.006335
    = 0.547; every other default box is below 0.5) take it; box B, 0.08 x 0.01 at the
    centre of row 30, column 5, has IoU 0.163 at best (the wide ratio-2 box there, 4033),
    below 0.5, so only that one box takes it. Image 1 has no ground truth: its padding
    (a copy of A) must match nothing."""
    a = xywh_to_ltrb(DBOXES[400])
    cx, cy = 5.5 / 37.5, 30.5 / 37.5
    b = torch.tensor([cx - 0.04, cy - 0.005, cx + 0.04, cy + 0.005])
    gt = torch.stack((torch.stack((a, b)), torch.stack((a, torch.zeros(4)))))
    labels = torch.tensor([[5, 7], [5, 0]])
    valid = torch.tensor([[True, True], [False, False]])
    boxes, labels_out = match(gt, labels, valid, DBOXES)
    assert boxes.shape == (2, 8732, 4) and labels_out.shape == (2, 8732)
    expected = torch.zeros(2, 8732, dtype=torch.long)
    expected[0, [400, 2 * 1444 + 400, 3 * 1444 + 400]] = 5
    expected[0, 2 * 1444 + 30 * 38 + 5] = 7
    assert torch.equal(labels_out, expected)
    torch.testing.assert_close(boxes[0, 3 * 1444 + 400], DBOXES[400])
    torch.testing.assert_close(boxes[0, 4033], ltrb_to_xywh(b))
    # background boxes keep their own default box
    torch.testing.assert_close(boxes[0, 0], DBOXES[0])
    torch.testing.assert_close(boxes[1], ltrb_to_xywh(xywh_to_ltrb(DBOXES)))


def test_match_later_ground_truth_takes_a_shared_best_box():
    a = xywh_to_ltrb(DBOXES[400])
    _, labels = match(torch.stack((a, a))[None], torch.tensor([[3, 4]]),
                      torch.tensor([[True, True]]), DBOXES)
    # the forced box goes to the later ground truth; the others to the first maximum
    assert labels[0, 400] == 4 and labels[0, 2 * 1444 + 400] == 3


def random_ground_truths(n: int, generator: torch.Generator) -> torch.Tensor:
    lt = torch.rand(n, 2, generator=generator) * 0.8
    wh = torch.rand(n, 2, generator=generator) * 0.5 + 0.01
    return torch.cat((lt, (lt + wh).clamp(max=1)), -1)


@pytest.mark.parametrize("compiled", [False, True])   # compiled: as the GPU configs run it
def test_match_equals_the_reference_encode_per_image(compiled):
    g = torch.Generator().manual_seed(1)
    counts, m = [3, 1, 12, 7], 12
    gt, labels = torch.zeros(len(counts), m, 4), torch.zeros(len(counts), m, dtype=torch.long)
    valid = torch.zeros(len(counts), m, dtype=torch.bool)
    for i, n in enumerate(counts):
        gt[i, :n] = random_ground_truths(n, g)
        labels[i, :n] = torch.randint(1, 81, (n,), generator=g)
        valid[i, :n] = True
        gt[i, n:] = torch.rand(m - n, 4, generator=g)   # padding garbage, masked out
    boxes, labels_out = (torch.compile(match) if compiled else match)(gt, labels, valid, DBOXES)
    for i, n in enumerate(counts):
        ref_boxes, ref_labels = reference_encode(gt[i, :n], labels[i, :n], DBOXES)
        assert torch.equal(labels_out[i], ref_labels)
        torch.testing.assert_close(boxes[i], ref_boxes)
    assert (labels_out > 0).sum() > sum(counts)     # not only the forced matches


def test_nms_keeps_greedily_by_hand():
    # sorted by score: A, B overlaps A (IoU 0.6), C overlaps only B (IoU 0.6), D is invalid
    boxes = torch.tensor([[0.0, 0, 1, 1], [0.25, 0, 1.25, 1], [0.5, 0, 1.5, 1], [0, 0, 1, 1]])
    keep = nms_keep(boxes, torch.tensor([True, True, True, False]), 0.5)
    assert keep.tolist() == [True, False, True, False]   # C survives: B was suppressed


@pytest.mark.parametrize("max_num,max_output,thresh", [(200, 200, 0.05), (30, 50, 0.05),
                                                      (200, 200, 0.95)])
def test_decode_batch_equals_brute_force(max_num, max_output, thresh):
    """Random predictions at the real default boxes, 4 foreground classes, against the
    reference's per-image loop; per-class top-k, the final cut, or the score threshold
    binds."""
    g = torch.Generator().manual_seed(2)
    ploc = torch.randn(2, 4, 8732, generator=g) * 0.5
    ploc[:, 2:] += 6      # boxes 3.3 times their default box's size: NMS drops about 1 in 3
    plabel = torch.randn(2, 5, 8732, generator=g) * 2
    boxes, labels, scores, valid = decode_batch(ploc, plabel, DBOXES, criteria=0.5,
                                                max_output=max_output, max_num=max_num,
                                                nms_valid_thresh=thresh)
    assert boxes.shape == (2, max_output, 4) and scores.shape == labels.shape == valid.shape
    ref_boxes = xywh_to_ltrb(decode(ploc.transpose(1, 2), DBOXES))
    probs = plabel.transpose(1, 2).softmax(dim=-1)
    for i in range(2):
        rb, rl, rs = reference_decode_single(ref_boxes[i], probs[i], 0.5, max_output,
                                             max_num, thresh)
        order = rs.argsort(descending=True)
        n = int(valid[i].sum())
        assert n == len(rs) and valid[i, :n].all()
        torch.testing.assert_close(scores[i, :n], rs[order])
        assert torch.equal(labels[i, :n], rl[order])
        torch.testing.assert_close(boxes[i, :n], rb[order])
