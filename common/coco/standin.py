"""COCO 2017 at its real scale, for dry runs (``DRY_RUN``) of the SSD and Mask R-CNN configs:
the real image counts and shapes, not a learnable dataset and not COCO.

    python -m common.coco.standin OUTDIR [--fraction 1.0] [--eval-fraction F] [--workers N]

The on-disk format of ``common.coco.fixture`` (``annotations/instances_{train,val}2017.json``,
``{train,val}2017/<12-digit id>.jpg``, polygons with their boxes and areas, 80 category ids)
at 118,287 training and 5,000 validation images (``--fraction`` of each, at least one). The
shapes follow COCO's, approximately: 640 pixels on the long side for most images (a long side
of 200-640 for one in twenty), 4:3 for most of the rest, landscape three times in four;
about 7.3 objects an image (COCO's 860,001 training annotations over 118,287 images), sides
log-uniform from 3% to 90% of the image's shorter side; one image in a hundred without any.
Images are written by ``--workers`` processes, each from its own seeded generator, so the
output does not depend on the worker count.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
from pycocotools import mask as mask_utils

from common.coco.data import STANDIN_KIND
from common.coco.fixture import COCO_CATEGORY_IDS, SHAPES, class_style, draw_image, unit_to_box
from common.fixture_cache import (
    FRACTION,
    cached_fixture,
    fixture_command,
    in_processes,
    standin_parser,
)

TRAIN_IMAGES, VAL_IMAGES = 118_287, 5_000
MEAN_OBJECTS = 860_001 / 118_287
MAX_OBJECTS = 60
EMPTY_FRACTION = 0.01
ASPECTS = (4 / 3, 3 / 2, 1.0, 16 / 9)
ASPECT_P = (0.7, 0.15, 0.1, 0.05)


def _size(rng: np.random.Generator) -> tuple[int, int]:
    long = 640 if rng.random() < 0.95 else int(rng.integers(200, 641))
    short = round(long / rng.choice(ASPECTS, p=ASPECT_P))
    return (long, short) if rng.random() < 0.75 else (short, long)


def _objects(width: int, height: int, rng: np.random.Generator) -> list:
    """(class index, polygon) of each object."""
    if rng.random() < EMPTY_FRACTION:
        return []
    count = min(int(rng.geometric(1 / MEAN_OBJECTS)), MAX_OBJECTS)
    objects, side = [], min(width, height)
    for _ in range(count):
        w, h = np.exp(rng.uniform(math.log(0.03), math.log(0.9), 2)) * side
        box = (rng.uniform(0, width - w), rng.uniform(0, height - h), w, h)
        k = int(rng.integers(len(COCO_CATEGORY_IDS)))
        objects.append((k, unit_to_box(SHAPES[class_style(k)[0]], box).round(2)))
    return objects


def _write_image(job) -> tuple[dict, list]:
    """One image and its annotations (ids to be given); ``job``: folder, image id, seed."""
    folder, image_id, seed = job
    rng = np.random.default_rng([seed, image_id])
    width, height = _size(rng)
    objects = _objects(width, height, rng)
    annotations = []
    for k, polygon in objects:
        flat = polygon.ravel().tolist()
        rle = mask_utils.merge(mask_utils.frPyObjects([flat], height, width))
        x0, y0 = polygon.min(0)
        x1, y1 = polygon.max(0)
        annotations.append({"image_id": image_id, "category_id": COCO_CATEGORY_IDS[k],
                            "segmentation": [flat], "area": float(mask_utils.area(rle)),
                            "bbox": [round(float(v), 2) for v in (x0, y0, x1 - x0, y1 - y0)],
                            "iscrowd": 0})
    name = f"{image_id:012d}.jpg"
    draw_image(width, height, objects, rng).save(Path(folder) / name, quality=90)
    return {"id": image_id, "file_name": name, "width": width, "height": height}, annotations


def write_standin(root, fraction: float = 1.0, workers: int = 1, seed: int = 0,
                  eval_fraction: float | None = None) -> Path:
    """Write the stand-in under ``root`` (reused when the same one is already there);
    ``eval_fraction`` (of the validation images) defaults to ``fraction``."""
    eval_fraction = fraction if eval_fraction is None else eval_fraction
    train, val = (max(1, round(n * f)) for n, f in ((TRAIN_IMAGES, fraction),
                                                     (VAL_IMAGES, eval_fraction)))
    params = dict(kind=STANDIN_KIND, train=train, val=val, seed=seed, version=1)
    categories = [{"id": c, "name": f"{' '.join(class_style(k)[::-1])} {k}",
                   "supercategory": "shape"} for k, c in enumerate(COCO_CATEGORY_IDS)]

    def write(tmp: Path) -> None:
        # COCO-like ids: unique, unordered, not contiguous
        ids = (np.random.default_rng(seed).permutation(600_000)[:train + val] + 1).tolist()
        ann_ids = itertools.count(1)
        (tmp / "annotations").mkdir()
        for split, split_ids in (("train", ids[:train]), ("val", ids[train:])):
            folder = tmp / f"{split}2017"
            folder.mkdir()
            images, annotations = [], []
            for image, anns in in_processes(_write_image, [(str(folder), i, seed)
                                                           for i in split_ids], workers, 64):
                images.append(image)
                annotations += [{"id": next(ann_ids), **a} for a in anns]
            doc = {"info": {"description": "COCO-scale stand-in for dry runs (not COCO)"},
                   "licenses": [], "images": images, "annotations": annotations,
                   "categories": categories}
            (tmp / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(doc))
    return cached_fixture(root, params, write)


@fixture_command
def main(argv=None) -> int:
    p = standin_parser("python -m common.coco.standin",
                       "Write COCO 2017 at its real scale (not COCO).",
                       1.0, "COCO's 118,287 training and 5,000 validation images")
    p.add_argument("--eval-fraction", type=FRACTION, default=None,
                   help="of the validation images (default: --fraction; a dry run times "
                        "the evaluation of all of them at 1)")
    write_standin(**vars(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
