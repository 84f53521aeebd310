"""The Triton RoIAlign (``roi-align-triton``) against the pure-PyTorch reference path on the
GPU: pooled features and the levels' gradients, in fp32 and bf16, channels-last and not, for
RoIs on every level, across the maps' borders, smaller than a pixel, and none; under
``torch.compile`` with the RoI count dynamic."""

import math

import pytest
import torch

from benchmarks.maskrcnn.roi_align import POOLER_SCALES, LevelMapper, roi_align_levels
from tests.benchmarks.maskrcnn.test_roi_align import brute_roi_align

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

IMAGE = (3, 96, 160)        # batch, padded height, width


def levels_and_rois(k, channels=32, dtype=torch.float32, channels_last=True, seed=0):
    """FPN maps of ``IMAGE`` (requiring grad) and ``k`` RoIs [K, 5] with their levels: boxes
    from under a pixel to larger than the image, some reaching past its borders."""
    g = torch.Generator().manual_seed(seed)
    n, h, w = IMAGE
    maps = []
    for s in POOLER_SCALES:
        f = torch.randn(n, channels, math.ceil(h * s), math.ceil(w * s), generator=g)
        f = f.to("cuda", dtype)
        if channels_last:
            f = f.contiguous(memory_format=torch.channels_last)
        maps.append(f.requires_grad_())
    xy = torch.rand(k, 2, generator=g) * torch.tensor([w + 40.0, h + 40.0]) - 20
    wh = torch.rand(k, 2, generator=g) ** 2 * 700 + 0.2
    rois = torch.cat((torch.randint(0, n, (k, 1), generator=g).float(), xy, xy + wh), 1)
    rois = rois.cuda()
    return maps, rois, LevelMapper(2, 5)(rois[:, 1:])


def pooled_and_grads(align, maps, rois, levels, size, grad_seed=1):
    out = align(maps, POOLER_SCALES, rois, levels, size, 2)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed))
    grads = torch.autograd.grad(out, maps, g.bfloat16().to(out))   # the same in fp32 and bf16
    return out, grads


@pytest.mark.parametrize("size", [(7, 7), (14, 14), (3, 5)])
@pytest.mark.parametrize("channels_last", [True, False])
def test_triton_roi_align_matches_the_reference_in_fp32(size, channels_last):
    from benchmarks.maskrcnn.roi_align_triton import roi_align_levels as triton_align

    maps, rois, levels = levels_and_rois(300, channels_last=channels_last)
    assert set(levels.tolist()) == {0, 1, 2, 3}
    out, grads = pooled_and_grads(triton_align, maps, rois, levels, size)
    ref_out, ref_grads = pooled_and_grads(roi_align_levels, maps, rois, levels, size)
    assert out.shape == ref_out.shape == (300, 32, *size)
    # a sample position one fp32 rounding apart moves an output by up to ~1.4e-5 here: the
    # reference's own distance from its float64 result on these maps
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)
    for got, expected, m in zip(grads, ref_grads, maps):
        assert got.dtype == m.dtype and got.stride() == m.stride()
        assert expected.abs().max() > 0
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_triton_roi_align_matches_the_kernel_loop():
    """Against the reference CUDA kernel's loop by hand (tests/.../test_roi_align.py), one
    level: a RoI across the border, one of a fraction of a pixel."""
    from benchmarks.maskrcnn.roi_align_triton import roi_align_levels as triton_align

    features = torch.randn(2, 3, 9, 13, dtype=torch.float64)
    rois = torch.tensor([[0, -6.0, 3.0, 40.0, 30.0], [1, 10.2, 7.1, 10.4, 7.3],
                         [1, 30.0, 20.0, 60.0, 44.0]])
    expected = brute_roi_align(features, rois.double(), (4, 3), 0.5, 2).float()
    got = triton_align([features.float().cuda()], [0.5], rois.cuda(),
                       torch.zeros(3, dtype=torch.long, device="cuda"), (4, 3), 2)
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)


def test_triton_roi_align_in_bf16_sums_in_fp32():
    """bf16 maps, as under amp: within bf16 rounding of the fp32 reference on the same values
    (outputs and gradients are rounded once, from fp32 sums)."""
    from benchmarks.maskrcnn.roi_align_triton import roi_align_levels as triton_align

    maps, rois, levels = levels_and_rois(500, channels=256, dtype=torch.bfloat16)
    out, grads = pooled_and_grads(triton_align, maps, rois, levels, (7, 7))
    exact = [m.detach().float().requires_grad_() for m in maps]
    ref_out, ref_grads = pooled_and_grads(roi_align_levels, exact, rois, levels, (7, 7))
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in grads)
    torch.testing.assert_close(out.float(), ref_out, rtol=1e-2, atol=1e-2)
    for got, expected in zip(grads, ref_grads):
        torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2)


def test_only_two_samples_a_bin():
    from benchmarks.maskrcnn.roi_align_triton import roi_align_levels as triton_align

    maps, rois, levels = levels_and_rois(4)
    with pytest.raises(ValueError, match="drop roi-align-triton"):
        triton_align(maps, POOLER_SCALES, rois, levels, (7, 7), 3)


def test_no_rois():
    from benchmarks.maskrcnn.roi_align_triton import roi_align_levels as triton_align

    maps, rois, levels = levels_and_rois(0)
    out, grads = pooled_and_grads(triton_align, maps, rois, levels, (7, 7))
    assert out.shape == (0, 32, 7, 7)
    assert all(g.shape == m.shape and not g.any() for g, m in zip(grads, maps))


def test_compiled_with_a_dynamic_roi_count():
    """Inside ``torch.compile`` (the heads' regions) with the RoI count marked dynamic: the
    eager op's outputs and gradients, for two counts and one graph."""
    from benchmarks.maskrcnn.roi_align_triton import roi_align_levels as triton_align

    torch._dynamo.reset()
    compiled = torch.compile(lambda maps, rois, levels: triton_align(
        maps, POOLER_SCALES, rois, levels, (7, 7), 2).relu().sum(dim=(2, 3)), fullgraph=True)
    for k in (64, 200):
        maps, rois, levels = levels_and_rois(k, seed=k)
        torch._dynamo.mark_dynamic(rois, 0)
        torch._dynamo.mark_dynamic(levels, 0)
        outs = []
        for fn in (compiled, lambda *a: triton_align(a[0], POOLER_SCALES, a[1], a[2], (7, 7),
                                                    2).relu().sum(dim=(2, 3))):
            out = fn(maps, rois, levels)
            outs.append((out, *torch.autograd.grad(out.sum(), maps)))
        for got, expected in zip(*outs):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
