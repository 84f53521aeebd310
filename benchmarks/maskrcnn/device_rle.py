"""Evaluation's masks run-length encoded on the device (``device-rle``).

The plain path copies each image's pasted masks [N, H, W] (one byte a pixel: 30 MB for 100
detections in a 640 x 480 image) to the host and encodes them there with pycocotools, 40-110
ms an image on one core of CI's 2-core machine: minutes for COCO's 5,000 evaluation images,
in the training process. Here the run boundaries (the positions, in COCO's column-major
order, where a mask changes value) are found on the device and only they are copied; the host
turns them into COCO's counts and compresses those (pycocotools' ``frPyObjects``). The RLEs
are :func:`common.coco.evaluation.encode_masks`'s, the reference.
"""

from __future__ import annotations

import numpy as np
import torch
from pycocotools import mask as mask_utils

from common.optimisations import Optimisation


def encode_masks(masks: torch.Tensor) -> list[dict]:
    """Binary masks [N, H, W] (any device) as COCO's compressed RLEs, counts as str."""
    n, h, w = masks.shape
    if n == 0:
        return []
    flat = masks.transpose(1, 2).reshape(n, h * w) != 0       # column-major, as COCO's RLE
    first = flat[:, 0].cpu().numpy()
    change = (flat[:, 1:] != flat[:, :-1]).nonzero().cpu().numpy()   # sorted by mask
    ends = np.cumsum(np.bincount(change[:, 0], minlength=n))[:-1]
    objects = []
    for starts_one, cuts in zip(first, np.split(change[:, 1] + 1, ends)):
        runs = np.diff(np.concatenate(([0], cuts, [h * w])))
        counts = ([0] if starts_one else []) + runs.tolist()   # COCO's runs start with 0s
        objects.append({"size": [h, w], "counts": counts})
    rles = mask_utils.frPyObjects(objects, h, w)
    for rle in rles:
        rle["counts"] = rle["counts"].decode("ascii")
    return rles


OPTIMISATION = Optimisation(
    "device-rle", "evaluation's masks run-length encoded on the device, only the runs copied "
    "to the host (device_rle.py)", apply=lambda wl, _: setattr(wl, "encode_masks", encode_masks),
    compare=None, tested_by="tests/benchmarks/maskrcnn/test_device_rle.py (evaluation, not the "
    "step)")
