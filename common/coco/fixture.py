"""A tiny synthetic detection dataset in COCO 2017's on-disk format (not COCO).

    python -m common.coco.fixture OUTDIR [--train 300] [--val 60] [--image-size 128] ...

Writes ``OUTDIR/annotations/instances_{train,val}2017.json`` and
``OUTDIR/{train,val}2017/<12-digit id>.jpg``. Each class is one shape in one colour
(``class_style``), drawn as a filled polygon on a grey, noisy background; the polygon is
also the annotation's segmentation, its extent the box (xywh) and its rasterised area
(pycocotools) the area. Objects are ``sizes`` (default 15-60%) of the image side, at random
positions, up to
``MAX_OBJECTS`` per image, overlapping a little (box IoU at most ``MAX_IOU``; later
objects occlude earlier ones); one image in ``EMPTY_EVERY`` has none, so the train reader
must drop it. Image sizes vary from 3/4 of ``image_size`` up to it, so images are not
square. Category ids are K of COCO's 80 ids, evenly spaced (1, 18, 37, 54, 74 for K=5), so
the mapping to contiguous labels is exercised. A ``FIXTURE_COMPLETE`` file records the parameters; a
folder that already holds the same fixture is reused (``common.fixture_cache``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from pycocotools import mask as mask_utils

from common.fixture_cache import cached_fixture, fixture_command

# COCO's 80 category ids: 1..90 without the 10 ids it never used
COCO_CATEGORY_IDS = tuple(i for i in range(1, 91)
                          if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83))
COLOURS = {"red": (220, 40, 40), "green": (40, 190, 60), "blue": (40, 70, 220),
           "yellow": (235, 215, 40), "magenta": (210, 50, 200), "cyan": (40, 210, 220)}
EMPTY_EVERY = 10
MAX_OBJECTS = 3
MAX_IOU = 0.3
SIZE_RANGE = (0.15, 0.6)  # object extent as a fraction of the image side


def _regular(n: int, phase: float = 0.0) -> np.ndarray:
    t = phase + 2 * np.pi * np.arange(n) / n
    return np.stack([np.cos(t), np.sin(t)], 1)


def _star() -> np.ndarray:
    radius = np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
    return _regular(10, -np.pi / 2) * radius[:, None]


# outlines; _unit_to_box stretches each over its box, so the box is the polygon's extent
SHAPES = {
    "rectangle": np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], float),
    "ellipse": _regular(32),
    "triangle": np.array([[0, -1], [1, 1], [-1, 1]], float),
    "diamond": _regular(4),
    "cross": np.array([[-0.35, -1], [0.35, -1], [0.35, -0.35], [1, -0.35], [1, 0.35],
                       [0.35, 0.35], [0.35, 1], [-0.35, 1], [-0.35, 0.35], [-1, 0.35],
                       [-1, -0.35], [-0.35, -0.35]], float),
    "star": _star(),
}
MAX_CLASSES = len(SHAPES) * len(COLOURS)


def class_style(k: int) -> tuple[str, str]:
    """(shape, colour) of class k (0-based): the first six classes differ in both."""
    shapes, colours = list(SHAPES), list(COLOURS)
    return shapes[k % len(shapes)], colours[(k + k // len(shapes)) % len(colours)]


def unit_to_box(unit: np.ndarray, box) -> np.ndarray:
    lo, hi = unit.min(0), unit.max(0)
    x0, y0, w, h = box
    return (unit - lo) / (hi - lo) * (w, h) + (x0, y0)


def _iou(a, b) -> float:
    ix = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def _place(width: int, height: int, count: int, sizes: tuple[float, float],
           rng: np.random.Generator) -> list:
    boxes, side = [], min(width, height)
    for _ in range(20 * count):  # a crowded image may end up with fewer objects
        if len(boxes) == count:
            break
        w, h = (rng.uniform(*sizes, 2) * side).round(1)
        box = (round(rng.uniform(0, width - w), 1), round(rng.uniform(0, height - h), 1), w, h)
        if all(_iou(box, other) <= MAX_IOU for other in boxes):
            boxes.append(box)
    return boxes


def draw_image(width: int, height: int, objects: list, rng: np.random.Generator) -> Image.Image:
    grey = rng.uniform(90, 170)
    base = np.full((height, width, 3), grey) + rng.normal(0, 12, 3)
    im = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for k, polygon in objects:
        colour = np.clip(np.array(COLOURS[class_style(k)[1]]) + rng.normal(0, 12, 3), 0, 255)
        draw.polygon([tuple(p) for p in polygon], fill=tuple(int(c) for c in colour))
    noisy = np.asarray(im, np.float32) + rng.normal(0, 6, (height, width, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def _split(folder: Path, image_ids, ann_ids, category_ids, image_size: int,
           sizes: tuple[float, float], rng: np.random.Generator) -> tuple[list, list]:
    images, annotations = [], []
    for n, image_id in enumerate(image_ids):
        width, height = (int(v) for v in rng.integers(image_size * 3 // 4, image_size + 1, 2))
        count = 0 if n % EMPTY_EVERY == EMPTY_EVERY - 1 else int(rng.integers(1, MAX_OBJECTS + 1))
        objects = []
        for box in _place(width, height, count, sizes, rng):
            k = int(rng.integers(len(category_ids)))
            polygon = unit_to_box(SHAPES[class_style(k)[0]], box).round(2)
            flat = polygon.ravel().tolist()
            rle = mask_utils.merge(mask_utils.frPyObjects([flat], height, width))
            x0, y0 = polygon.min(0)
            x1, y1 = polygon.max(0)
            annotations.append({
                "id": next(ann_ids), "image_id": image_id,
                "category_id": category_ids[k], "segmentation": [flat],
                "area": float(mask_utils.area(rle)),
                "bbox": [round(float(v), 2) for v in (x0, y0, x1 - x0, y1 - y0)],
                "iscrowd": 0})
            objects.append((k, polygon))
        name = f"{image_id:012d}.jpg"
        draw_image(width, height, objects, rng).save(folder / name, quality=90)
        images.append({"id": image_id, "file_name": name, "width": width, "height": height})
    return images, annotations


def write_fixture(root, train: int = 300, val: int = 60, image_size: int = 128,
                  classes: int = 5, seed: int = 0,
                  sizes: tuple[float, float] = SIZE_RANGE) -> Path:
    """Write the fixture under ``root`` (reused when the same one is already there)."""
    if not 1 <= classes <= MAX_CLASSES:
        raise ValueError(f"classes must lie in 1..{MAX_CLASSES}")
    if not 0 < sizes[0] <= sizes[1] <= 1:
        raise ValueError(f"object sizes {sizes} must satisfy 0 < smallest <= largest <= 1")
    params = dict(train=train, val=val, image_size=image_size, classes=classes, seed=seed,
                  sizes=list(sizes), version=1)

    def write(tmp: Path) -> None:
        rng = np.random.default_rng(seed)
        # COCO-like ids: unique, unordered, not contiguous
        image_ids = (rng.permutation(600_000)[:train + val] + 1).tolist()
        ann_ids = itertools.count(1)
        category_ids = COCO_CATEGORY_IDS[::len(COCO_CATEGORY_IDS) // classes][:classes]
        categories = [{"id": category_ids[k], "name": " ".join(class_style(k)[::-1]),
                       "supercategory": "shape"} for k in range(classes)]
        (tmp / "annotations").mkdir()
        for split, ids in (("train", image_ids[:train]), ("val", image_ids[train:])):
            folder = tmp / f"{split}2017"
            folder.mkdir()
            images, annotations = _split(folder, ids, ann_ids, category_ids, image_size,
                                         tuple(sizes), rng)
            doc = {"info": {"description": "synthetic COCO-format fixture (not COCO)"},
                   "licenses": [], "images": images, "annotations": annotations,
                   "categories": categories}
            (tmp / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(doc))
    return cached_fixture(root, params, write)


def _fractions(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two fractions like 0.15,0.6, got {text!r}"
                                         ) from None
    if not 0 < lo <= hi <= 1:
        raise argparse.ArgumentTypeError(f"need 0 < smallest <= largest <= 1, got {text!r}")
    return lo, hi


@fixture_command
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m common.coco.fixture",
                                description="Write the COCO-format detection fixture.")
    p.add_argument("outdir", type=Path)
    p.add_argument("--train", type=int, default=300, help="train images")
    p.add_argument("--val", type=int, default=60, help="val images")
    p.add_argument("--image-size", type=int, default=128, help="largest image side")
    p.add_argument("--classes", type=int, default=5, help=f"1..{MAX_CLASSES}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--object-sizes", type=_fractions, default=SIZE_RANGE,
                   help="smallest,largest object extent as a fraction of the image side")
    a = p.parse_args(argv)
    write_fixture(a.outdir, a.train, a.val, a.image_size, a.classes, a.seed, a.object_sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
