"""FPN anchors against values worked out by hand from the reference's ``generate_anchors``
(``modeling/rpn/anchor_generator.py``, mlcommons/training v1.1 ``object_detection``)."""

import torch

from benchmarks.maskrcnn.anchors import cell_anchors, fpn_anchors, visible

# P2 (stride 4, size 32): the 4 x 4 cell (0, 0, 3, 3) has area 16 and centre 1.5. For
# height / width 0.5, 1, 2 the widths are round(sqrt(16 / r)) = 6, 4, 3 and the heights
# round(width * r) = 3, 4, 6; scaled by 32 / 4 = 8: 48 x 24, 32 x 32, 24 x 48 about
# (1.5, 1.5), i.e. x1 = 1.5 - (48 - 1) / 2 = -22, x2 = 1.5 + (48 - 1) / 2 = 25, ...
P2_CELL = [[-22.0, -10.0, 25.0, 13.0], [-14.0, -14.0, 17.0, 17.0], [-10.0, -22.0, 13.0, 25.0]]
# P5 (stride 32, size 256): widths round(sqrt(2048)) = 45, 32, 23; heights round(22.5) = 22
# (numpy rounds half to even), 32, 46; times 8 about 15.5: y1 = 15.5 - (176 - 1) / 2 = -72
P5_CELL = [[-164.0, -72.0, 195.0, 103.0], [-112.0, -112.0, 143.0, 143.0],
           [-76.0, -168.0, 107.0, 199.0]]


def test_cell_anchors_by_hand():
    assert cell_anchors(4, 32).tolist() == P2_CELL
    assert cell_anchors(32, 256).tolist() == P5_CELL
    assert cell_anchors(4, 32).dtype == torch.float32


def test_anchor_count_and_order_per_level():
    sizes = [(5, 7), (3, 4), (2, 2), (1, 1), (1, 1)]
    anchors = fpn_anchors(sizes)
    assert [len(a) for a in anchors] == [h * w * 3 for h, w in sizes]
    p2 = anchors[0]
    assert p2[:3].tolist() == P2_CELL
    shift = torch.tensor([4.0, 0.0, 4.0, 0.0])              # next column: + stride in x
    assert torch.equal(p2[3:6], p2[:3] + shift)
    assert torch.equal(p2[7 * 3:7 * 3 + 3], p2[:3] + shift.roll(1))    # next row: + 4 in y
    # the last cell of P3 (stride 8): row 2, column 3
    last_shift = torch.tensor([24.0, 16.0, 24.0, 16.0])
    assert torch.equal(anchors[1][-3:], cell_anchors(8, 64) + last_shift)


def test_visibility_straddle_zero():
    anchors = torch.tensor([[0.0, 0.0, 11.0, 9.0],       # exactly inside a 10 x 12 image
                            [-0.5, 0.0, 5.0, 5.0],       # starts left of it
                            [0.0, 0.0, 12.0, 5.0],       # reaches x = width
                            [0.0, 0.0, 5.0, 10.0],       # reaches y = height
                            [0.0, -1.0, 5.0, 5.0]])      # starts above it
    assert visible(anchors, (10, 12)).tolist() == [True, False, False, False, False]
    assert visible(anchors, (10, 12), straddle_thresh=1).tolist() == [True] * 5
    assert visible(anchors, (10, 12), straddle_thresh=-1).all()
