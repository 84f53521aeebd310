"""RoIAlign and the FPN pooler against a per-RoI, per-bin, per-sample loop of the reference
CUDA kernel's arithmetic (``csrc/cuda/ROIAlign_cuda.cu``) and the level rule of
``modeling/poolers.py`` (mlcommons/training v1.1 ``object_detection``)."""

import math

import pytest
import torch

from benchmarks.maskrcnn.roi_align import (
    POOLER_SCALES,
    LevelMapper,
    Pooler,
    _table,
    roi_align,
    rois_from_boxes,
)


def bilinear_taps(height, width, y, x):
    """The kernel's ``bilinear_interpolate_gradient``: a sample's four neighbours
    (row, column) and their weights; none for a sample out of the map."""
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return []
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_high = y_low = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_high = x_low = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    return [(y_low, x_low, hy * hx), (y_low, x_high, hy * lx),
            (y_high, x_low, ly * hx), (y_high, x_high, ly * lx)]


def kernel_taps(rois, output_size, scale, ratio, height, width):
    """Per output bin, as ``RoIAlignForward`` walks it: (RoI, batch index, bin row, bin
    column, [(row, column, weight / sample count) of every sample's neighbours])."""
    out_h, out_w = output_size
    for k, (n, x1, y1, x2, y2) in enumerate(rois.tolist()):
        x1, y1, x2, y2 = x1 * scale, y1 * scale, x2 * scale, y2 * scale
        roi_w, roi_h = max(x2 - x1, 1.0), max(y2 - y1, 1.0)
        bin_w, bin_h = roi_w / out_w, roi_h / out_h
        for ph in range(out_h):
            for pw in range(out_w):
                taps = []
                for iy in range(ratio):
                    y = y1 + ph * bin_h + (iy + 0.5) * bin_h / ratio
                    for ix in range(ratio):
                        x = x1 + pw * bin_w + (ix + 0.5) * bin_w / ratio
                        taps += [(r, c, w / ratio**2)
                                 for r, c, w in bilinear_taps(height, width, y, x)]
                yield k, int(n), ph, pw, taps


def brute_roi_align(features, rois, output_size, scale, ratio):
    _, channels, height, width = features.shape
    feats = features.tolist()
    out = torch.zeros(len(rois), channels, *output_size, dtype=torch.float64)
    for k, n, ph, pw, taps in kernel_taps(rois, output_size, scale, ratio, height, width):
        for ch in range(channels):
            out[k, ch, ph, pw] = sum(w * feats[n][ch][r][c] for r, c, w in taps)
    return out


def brute_roi_align_backward(grad_out, rois, scale, ratio, feature_shape):
    """``RoIAlignBackwardFeature``: each sample's share of its bin's gradient is added to
    its four neighbours."""
    batch, channels, height, width = feature_shape
    grads = grad_out.tolist()
    grad = torch.zeros(feature_shape, dtype=torch.float64)
    for k, n, ph, pw, taps in kernel_taps(rois, grad_out.shape[2:], scale, ratio, height,
                                          width):
        for ch in range(channels):
            for r, c, w in taps:
                grad[n, ch, r, c] += grads[k][ch][ph][pw] * w
    return grad


def make_rois():
    """(batch index, x1, y1, x2, y2) in image pixels, for maps 6 high and 7 wide at 1/2."""
    return torch.tensor([
        [0, 2.0, 3.0, 9.0, 8.0],          # well inside
        [1, -4.0, -3.0, 6.0, 5.0],        # over the top-left corner
        [0, 8.0, 6.0, 16.0, 14.0],        # over the bottom-right corner, past H and W
        [1, 5.0, 5.0, 5.4, 5.2],          # tiny: pooled as 1 x 1 on the map
        [0, 7.0, 4.0, 3.0, 2.0],          # malformed (x2 < x1): also 1 x 1
        [1, -10.0, -9.0, -4.0, -4.0],     # entirely outside: zeros
        [0, 10.0, 9.0, 13.9, 11.9],       # samples between H - 1 and H (the edge rule)
    ], dtype=torch.float64)


@pytest.mark.parametrize("output_size,ratio", [((3, 3), 2), ((2, 4), 3), ((1, 1), 1)])
def test_roi_align_matches_kernel_loop(output_size, ratio):
    g = torch.Generator().manual_seed(0)
    features = torch.randn(2, 3, 6, 7, generator=g, dtype=torch.float64)
    rois = make_rois()
    pooled = roi_align(features, rois, output_size, 0.5, ratio)
    assert pooled.shape == (len(rois), 3, *output_size)
    torch.testing.assert_close(pooled, brute_roi_align(features, rois, output_size, 0.5, ratio))
    assert pooled[5].abs().max() == 0


def test_roi_align_float32_and_no_rois():
    g = torch.Generator().manual_seed(1)
    features = torch.randn(2, 4, 6, 7, generator=g)
    rois = make_rois().float()
    torch.testing.assert_close(roi_align(features, rois, 2, 0.5, 2),
                               brute_roi_align(features, rois, (2, 2), 0.5, 2).float())
    assert roi_align(features, rois[:0], 7, 0.5, 2).shape == (0, 4, 7, 7)


def test_roi_align_backward_matches_kernel_loop():
    g = torch.Generator().manual_seed(4)
    features = torch.randn(2, 3, 6, 7, generator=g, dtype=torch.float64, requires_grad=True)
    rois = make_rois()
    grad_out = torch.randn(len(rois), 3, 3, 2, generator=g, dtype=torch.float64)
    roi_align(features, rois, (3, 2), 0.5, 2).backward(grad_out)
    torch.testing.assert_close(features.grad,
                               brute_roi_align_backward(grad_out, rois, 0.5, 2, features.shape))


def test_roi_align_gradcheck():
    g = torch.Generator().manual_seed(2)
    features = torch.randn(2, 2, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0, 1.0, 0.5, 6.0, 5.0], [1, -2.0, 3.0, 9.5, 9.9],
                         [1, 3.0, 3.0, 3.2, 3.1]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda f: roi_align(f, rois, (2, 3), 0.5, 2), (features,))


def test_level_mapper_by_hand():
    mapper = LevelMapper(2, 5)
    side = torch.tensor([1.0, 111.0, 112.0, 223.0, 224.0, 447.0, 448.0, 2000.0])
    boxes = torch.stack((torch.zeros_like(side), torch.zeros_like(side), side - 1, side - 1), 1)
    # sqrt(area) = side (inclusive pixels): level floor(4 + log2(side / 224)) in [2, 5]
    assert mapper(boxes).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # a 200 x 250 box: sqrt(50000) = 223.6 < 224, level 3
    assert mapper(torch.tensor([[10.0, 20.0, 209.0, 269.0]])).tolist() == [1]
    # eps: a side 1e-4 pixel short of 224 (log2 = -6.4e-7) still maps to the canonical level
    assert mapper(torch.tensor([[0.0, 0.0, 222.9999, 222.9999]], dtype=torch.float64)).tolist() \
        == [2]


def test_pooler_pools_each_roi_from_its_level():
    g = torch.Generator().manual_seed(3)
    image = (2, 64, 96)                                   # batch, height, width
    features = [torch.randn(image[0], 3, math.ceil(image[1] * s), math.ceil(image[2] * s),
                            generator=g, dtype=torch.float64) for s in POOLER_SCALES]
    # sqrt(area): 25.5, 129.5 | 448.2, 2.4, 269.3 -> levels 2, 3 | 5, 2, 4
    boxes = [torch.tensor([[0.0, 0.0, 20.0, 30.0], [10.0, 10.0, 160.0, 120.0]]),
             torch.tensor([[-200.0, -150.0, 300.0, 250.0], [40.0, 10.0, 41.0, 12.0],
                           [-100.0, -80.0, 200.0, 160.0]])]
    rois = rois_from_boxes([b.double() for b in boxes])
    assert rois[:, 0].tolist() == [0, 0, 1, 1, 1]
    pooler = Pooler(7)
    levels = pooler.map_levels(rois[:, 1:])
    assert levels.tolist() == [0, 1, 3, 0, 2]
    expected = torch.cat([brute_roi_align(features[lvl], rois[k:k + 1], (7, 7),
                                          POOLER_SCALES[lvl], 2)
                          for k, lvl in enumerate(levels.tolist())])
    torch.testing.assert_close(pooler(features, rois), expected)


def test_channels_last_features_pool_the_same_from_a_view():
    g = torch.Generator().manual_seed(5)
    maps = [torch.randn(2, 3, h, w, generator=g, dtype=torch.float64) for h, w in ((8, 12),
                                                                                 (4, 6))]
    cl = [f.contiguous(memory_format=torch.channels_last) for f in maps]
    table = _table(cl[:1])
    assert table.untyped_storage().data_ptr() == cl[0].untyped_storage().data_ptr()
    assert _table(maps[:1]).untyped_storage().data_ptr() != maps[0].untyped_storage().data_ptr()
    torch.testing.assert_close(_table(cl), _table(maps), rtol=0, atol=0)
    rois = rois_from_boxes([torch.tensor([[1.0, 2.0, 30.0, 20.0]], dtype=torch.float64),
                            torch.tensor([[0.0, 0.0, 47.0, 31.0], [5.0, 6.0, 9.0, 8.0]],
                                         dtype=torch.float64)])
    pooler = Pooler(3, scales=(1 / 4, 1 / 8))
    grads = []
    for features in (maps, cl):
        features = [f.detach().requires_grad_() for f in features]
        pooled = pooler(features, rois)
        pooled.backward(torch.ones_like(pooled))
        grads.append((pooled, *(f.grad for f in features)))
    torch.testing.assert_close(grads[1], grads[0])
