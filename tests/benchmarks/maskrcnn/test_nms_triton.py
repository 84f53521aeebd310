"""The Triton NMS (``nms-triton``) against the pure-PyTorch reference path on the GPU: the
same kept boxes, in the same order, for ties, categories, strict thresholds, suppressed
boxes that must not suppress, and the RPN's own rows of 2,000 clustered proposals."""

import pytest
import torch

from benchmarks.maskrcnn.anchors import fpn_anchors
from benchmarks.maskrcnn.boxes import batched_nms
from benchmarks.maskrcnn.rpn import RPN
from tests.benchmarks.maskrcnn.test_boxes import brute_nms
from tests.benchmarks.maskrcnn.test_rpn import FEATURE_SIZES, GT_BOXES, IMAGE_SIZES, head_outputs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def clustered_boxes(n, categories, generator, extent=800.0):
    """Boxes around a few centres per category (as an RPN's candidates), scores with ties."""
    centres = torch.rand(categories, 8, 2, generator=generator) * extent
    pick = torch.randint(0, 8, (n,), generator=generator)
    idxs = torch.randint(0, categories, (n,), generator=generator)
    xy = centres[idxs, pick] + torch.randn(n, 2, generator=generator) * 12
    wh = 40 + torch.rand(n, 2, generator=generator) * 120
    scores = (torch.rand(n, generator=generator) * 256).floor() / 256   # bf16-like ties
    return torch.cat((xy, xy + wh), 1).cuda(), scores.cuda(), idxs.cuda()


@pytest.mark.parametrize("n, categories", [(0, 1), (1, 1), (7, 3), (2000, 1), (80_000, 40)])
@pytest.mark.parametrize("threshold", [0.5, 0.7])
def test_triton_nms_keeps_what_the_reference_keeps(n, categories, threshold):
    from benchmarks.maskrcnn.nms_triton import nms_keep

    boxes, scores, idxs = clustered_boxes(n, categories, torch.Generator().manual_seed(n))
    expected = batched_nms(boxes, scores, idxs, threshold)
    got = batched_nms(boxes, scores, idxs, threshold, nms_keep)
    assert torch.equal(got, expected)
    if n >= 2000:
        assert 0 < len(got) < n / 2        # clusters: most boxes suppressed
    if n <= 7:
        assert got.tolist() == brute_nms(boxes.cpu(), scores.cpu(), idxs.cpu(), threshold)


def test_strict_threshold_and_suppressed_boxes_that_do_not_suppress():
    from benchmarks.maskrcnn.nms_triton import nms_keep

    # IoUs: 0-1 0.5 exactly (does not suppress at 0.5), 0-2 0.82, 0-3 0.6, 2-3 0.74, 1-3
    # 0.33. At 0.7 box 0 removes box 2, which then cannot remove box 3.
    boxes = torch.tensor([[0.0, 0.0, 9.0, 9.0], [0.0, 0.0, 9.0, 4.0],
                          [1.0, 0.0, 10.0, 9.0], [2.5, 0.0, 11.5, 9.0]], device="cuda")
    scores = torch.tensor([0.9, 0.7, 0.4, 0.3], device="cuda")
    one = torch.zeros(4, dtype=torch.long, device="cuda")
    for threshold in (0.5, 0.49, 0.7, 0.8):
        assert torch.equal(batched_nms(boxes, scores, one, threshold, nms_keep),
                           batched_nms(boxes, scores, one, threshold))
    assert batched_nms(boxes, scores, one, 0.5, nms_keep).tolist() == [0, 1]
    assert batched_nms(boxes, scores, one, 0.7, nms_keep).tolist() == [0, 1, 3]


@pytest.mark.parametrize("training", [True, False])
def test_rpn_proposals_with_triton_nms_equal_the_reference(training):
    from benchmarks.maskrcnn.nms_triton import nms_keep

    objectness, deltas = head_outputs(seed=6)
    cuda = [[t.cuda() for t in ts] for ts in (objectness, deltas, fpn_anchors(FEATURE_SIZES),
                                               GT_BOXES)]
    plain, fast = RPN(pre_nms_top_n_train=300), RPN(pre_nms_top_n_train=300)
    fast.nms_keep = nms_keep
    plain.train(training), fast.train(training)
    for g, e in zip(fast.proposals(*cuda[:3], IMAGE_SIZES, cuda[3]),
                    plain.proposals(*cuda[:3], IMAGE_SIZES, cuda[3]), strict=True):
        assert torch.equal(g, e)


def test_more_boxes_per_category_than_a_program_holds_is_one_line():
    from benchmarks.maskrcnn.nms_triton import MAX_WIDTH, nms_keep

    boxes = torch.zeros(1, MAX_WIDTH + 1, 4, device="cuda")
    with pytest.raises(ValueError, match="drop nms-triton"):
        nms_keep(boxes, torch.ones(boxes.shape[:2], dtype=torch.bool, device="cuda"), 0.5)


def test_new_row_widths_compile_no_new_variant():
    """A width of 1 or a multiple of 16 would each be a Triton specialisation."""
    from benchmarks.maskrcnn.nms_triton import _nms_rows, nms_keep
    from tests.triton_variants import compiled_variants

    def rows(width):
        boxes, _, _ = clustered_boxes(2 * width, 1, torch.Generator().manual_seed(width))
        nms_keep(boxes.view(2, width, 4), torch.ones(2, width, dtype=torch.bool,
                                                     device="cuda"), 0.5)

    rows(3)
    before = compiled_variants(_nms_rows)
    for width in (1, 16, 5):                                    # the same block of 16
        rows(width)
    torch.cuda.synchronize()
    assert compiled_variants(_nms_rows) == before
