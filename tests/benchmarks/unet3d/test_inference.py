"""Sliding-window inference: the reference's crop/pad rule, Gaussian weights, sharding."""

import numpy as np
import pytest
import torch

from benchmarks.unet3d import inference

ROI = (32, 32, 32)


def pointwise(x: torch.Tensor) -> torch.Tensor:
    """A 'model' whose logits depend on each voxel only, so windows must stitch exactly."""
    return torch.cat((x, 2 * x.sin(), -x), dim=1)


def test_gaussian_is_the_references_cube_root_map():
    signal = pytest.importorskip("scipy.signal")
    g = signal.windows.gaussian(32, 0.125 * 32)
    expected = np.cbrt(np.multiply.outer(np.multiply.outer(g, g), g))
    torch.testing.assert_close(inference.gaussian_kernel(ROI),
                               torch.from_numpy(expected / expected.max()))


def test_window_plan_crops_small_remainders_and_pads_large_ones():
    crops, pads, starts = inference.window_plan((70, 45, 37), ROI, 0.5)
    # 70 % 16 = 6 < 8: crop 3 + 3; 45 % 16 = 13: pad 1 + 2 to 48; 37 % 16 = 5: crop 2 + 3.
    assert crops == [(3, 3), (0, 0), (2, 3)]
    assert pads == [(0, 0), (1, 2), (0, 0)]
    assert starts == [[0, 16, 32], [0, 16], [0]]
    # Too small for one window: cropped to whole steps (16), then padded up to the window.
    crops, pads, starts = inference.window_plan((20, 32, 32), ROI, 0.5)
    assert (crops[0], pads[0], starts[0]) == ((2, 2), (8, 8), [0])


def test_sliding_window_on_a_volume_not_divisible_by_the_window():
    torch.manual_seed(0)
    image = torch.randn(1, 1, 70, 45, 37)
    logits, crops = inference.sliding_window(pointwise, image, ROI, 0.5, 3, batch_size=4)
    cropped = inference.crop(image, crops)
    assert logits.shape == (1, 3, 64, 45, 32)
    torch.testing.assert_close(logits, pointwise(cropped))


def test_windows_dealt_over_ranks_add_up_to_the_whole():
    torch.manual_seed(1)
    image = torch.randn(1, 1, 48, 48, 40)
    calls = []

    def model(x):
        calls.append(x.shape[0])
        return pointwise(x)

    whole, _ = inference.sliding_window(model, image, ROI, 0.5, 3)
    n_windows = len(calls)
    # Without a process group the all-reduce is skipped: each rank's share comes back as is.
    calls.clear()
    parts = [inference.sliding_window(model, image, ROI, 0.5, 3, rank=r, world=2)[0]
             for r in (0, 1)]
    assert len(calls) == n_windows == 2 * 2 * 2
    torch.testing.assert_close(parts[0] + parts[1], whole)
    assert not torch.allclose(parts[0], whole)
