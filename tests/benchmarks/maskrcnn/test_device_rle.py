"""``device-rle``: evaluation's masks run-length encoded from their run boundaries equal
pycocotools' RLEs of the same masks (the plain path), on the CPU and on the GPU."""

import pytest
import torch

from benchmarks.maskrcnn.device_rle import encode_masks
from common.coco import evaluation


def _masks(n, h, w, seed):
    g = torch.Generator().manual_seed(seed)
    masks = torch.zeros(n, h, w, dtype=torch.uint8)
    for i in range(n):   # blobs with holes, some touching the image's edges
        y, x = (int(torch.randint(0, s - 2, (1,), generator=g)) for s in (h, w))
        dy, dx = (int(torch.randint(1, s - c + 1, (1,), generator=g)) for s, c in ((h, y), (w, x)))
        masks[i, y:y + dy, x:x + dx] = torch.rand(dy, dx, generator=g) > 0.2
    masks[0] = 0                      # empty
    masks[1] = 1                      # full: the counts start with 0 zeros
    masks[2] = 0
    masks[2, 0, 0] = masks[2, -1, -1] = 1   # the first and the last pixel only
    return masks


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")])])
@pytest.mark.parametrize("shape", [(9, 37, 53), (5, 64, 21)])
def test_the_rles_are_pycocotools(device, shape):
    masks = _masks(*shape, seed=shape[1])
    want = evaluation.encode_masks(masks.numpy())
    assert encode_masks(masks.to(device)) == want and len(want) == shape[0]


def test_no_mask_no_rle():
    assert encode_masks(torch.zeros(0, 5, 7, dtype=torch.uint8)) == []
