"""The Triton matching overlaps (``--fused-match``) against the dense reference path on the
GPU: each default box's best IoU and ground truth, each ground truth's best default box,
bit for bit, for ties between ground truths and between default boxes, padding anywhere,
images without ground truths, and the matching's targets, eager and compiled."""

import pytest
import torch

from benchmarks.ssd.boxes import dboxes300_coco, dense_overlaps, match, xywh_to_ltrb
from tests.benchmarks.ssd.test_boxes import random_ground_truths

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DBOXES = dboxes300_coco()


def batch(counts, max_boxes, seed):
    """Ground truths with padding at random places, a duplicate pair (ties between ground
    truths), the whole image (ties between default boxes of one size) and a default box."""
    g = torch.Generator().manual_seed(seed)
    gt = torch.rand(len(counts), max_boxes, 4, generator=g)       # padding garbage
    labels = torch.randint(1, 81, (len(counts), max_boxes), generator=g)
    valid = torch.zeros(len(counts), max_boxes, dtype=torch.bool)
    for i, n in enumerate(counts):
        slots = torch.randperm(max_boxes, generator=g)[:n]
        gt[i, slots] = random_ground_truths(n, g)
        if n >= 4:
            gt[i, slots[1]] = gt[i, slots[0]]
            gt[i, slots[2]] = torch.tensor([0.0, 0.0, 1.0, 1.0])
            gt[i, slots[3]] = xywh_to_ltrb(DBOXES[777 * i % len(DBOXES)])
        valid[i, slots] = True
    return gt.cuda(), labels.cuda(), valid.cuda()


@pytest.mark.parametrize("counts, max_boxes", [([3, 0, 12, 7], 12), ([0], 1),
                                               ([4] * 64 + [60, 200, 1], 200)])
def test_fused_overlaps_equal_the_dense_path(counts, max_boxes):
    from benchmarks.ssd.match_triton import fused_overlaps

    gt, _, valid = batch(counts, max_boxes, seed=len(counts))
    dboxes = xywh_to_ltrb(DBOXES).cuda()
    for got, expected in zip(fused_overlaps(gt, valid, dboxes), dense_overlaps(gt, valid, dboxes),
                             strict=True):
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected)


@pytest.mark.parametrize("compiled", [False, True])   # compiled: as the GPU configs run it
def test_match_with_fused_overlaps_gives_the_same_targets(compiled):
    from benchmarks.ssd.match_triton import fused_overlaps

    gt, labels, valid = batch([5, 0, 30, 9, 1], 40, seed=7)
    dboxes = DBOXES.cuda()
    fused = torch.compile(match) if compiled else match
    boxes, labels_out = fused(gt, labels, valid, dboxes, overlaps=fused_overlaps)
    ref_boxes, ref_labels = match(gt, labels, valid, dboxes)
    assert torch.equal(labels_out, ref_labels)
    torch.testing.assert_close(boxes, ref_boxes)
    assert (labels_out > 0).sum() > valid.sum()


def test_new_ground_truth_counts_compile_no_new_variant():
    """A padded count of 1 or a multiple of 16 would each be a Triton specialisation."""
    from benchmarks.ssd.match_triton import _kernel, fused_overlaps
    from tests.triton_variants import compiled_variants

    dboxes = xywh_to_ltrb(DBOXES).cuda()
    fused_overlaps(*batch([2, 3], 3, seed=1)[::2], dboxes)
    before = compiled_variants(_kernel())
    for max_boxes in (1, 16, 32, 7):
        fused_overlaps(*batch([1, 1], max_boxes, seed=max_boxes)[::2], dboxes)
    torch.cuda.synchronize()
    assert compiled_variants(_kernel()) == before
