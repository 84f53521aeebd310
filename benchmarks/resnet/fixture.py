"""A tiny synthetic dataset in ImageNet's on-disk format (not ImageNet).

    python -m benchmarks.resnet.fixture OUTDIR [--classes 10] [--train-per-class 100] ...
    python -m benchmarks.resnet.fixture OUTDIR --imagenet-like --train-per-class 500

Writes ``OUTDIR/train/<wnid>/<wnid>_<i>.JPEG`` and
``OUTDIR/val/<wnid>/ILSVRC2012_val_<n>.JPEG``. Each class has its own
background hue and its own stripe orientation, drawn with random jitter in
hue, brightness, stripe phase and width, a random disc, and pixel noise, so
validation images are fresh samples of the class, not copies. The hue alone
survives any crop or flip, so the real ResNet-50 learns the classes in a few
epochs. Like real data, the fixture has label noise: one image in twenty of
every class (in train and val) is drawn with the next class's appearance, so
top-1 stays below 1.0 (which the MLPerf rules reject as a result) while the
0.759 target remains well within reach. A ``FIXTURE_COMPLETE`` file records
the parameters; a folder that already holds the same fixture is reused.

``--imagenet-like`` writes JPEGs shaped like ILSVRC2012's instead of squares of
``--image-size``, for measuring input pipelines: mostly 500 px on the longer side
(4:3, 3:2, square and others; a quarter portrait), 8% large (1000-2000 px) and
8% small (120-350 px), with smooth colour fields, fine texture and noise over
the class drawing so that quality 90 gives ImageNet's file sizes (about 110 KB
on average); one image in 50 is greyscale and one in 200 CMYK, as a few of
ImageNet's are.
"""

from __future__ import annotations

import argparse
import colorsys
import os
import sys
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image

from common.fixture_cache import cached_fixture, fixture_command, in_processes

NOISY_EVERY = 20  # image i of a class with i % 20 == 19 looks like the next class
GREY_EVERY, CMYK_EVERY = 50, 200   # --imagenet-like: image n (counted over the whole fixture)
GREY_AT, CMYK_AT = 1, 3            # is greyscale when n % 50 == 1, CMYK when n % 200 == 3
LARGE, SMALL = 0.05, 0.12          # --imagenet-like: shares of large and small images


def _drawing(cls: int, num_classes: int, width: int, height: int,
             rng: np.random.Generator) -> np.ndarray:
    """The class's appearance as float RGB [height, width, 3] (0..255 before clipping)."""
    hue = (cls / num_classes + rng.uniform(-0.15, 0.15) / num_classes) % 1.0
    value = rng.uniform(0.55, 0.95)
    bg = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.6, 0.9), value)) * 255
    fg = np.array(colorsys.hsv_to_rgb((hue + 0.5) % 1.0, 0.5, 1.0 - value / 2)) * 255
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = np.pi * cls / num_classes
    period = rng.uniform(8, 14)
    phase = rng.uniform(0, period)
    stripes = ((xx * np.cos(angle) + yy * np.sin(angle) + phase) % period) < period / 3
    img = np.where(stripes[..., None], 0.75 * bg + 0.25 * fg, bg)
    cx, cy = rng.uniform(0.2, 0.8, 2) * (width, height)
    r = rng.uniform(0.1, 0.25) * min(width, height)
    disc = (xx - cx) ** 2 + (yy - cy) ** 2 < r ** 2
    img = np.where(disc[..., None], fg, img)
    return img + rng.normal(0, 8, img.shape)


def _to_image(pixels: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _image(cls: int, num_classes: int, size: int, rng: np.random.Generator) -> Image.Image:
    return _to_image(_drawing(cls, num_classes, size, size, rng))


def _imagenet_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) drawn from a mix like ILSVRC2012's train set."""
    u = rng.uniform()
    if u < LARGE:
        long = int(rng.integers(800, 1601))
    elif u < LARGE + SMALL:
        long = int(rng.integers(120, 351))
    else:
        long = 500
    short_ratio = rng.choice([0.75, 2 / 3, 1.0, rng.uniform(0.5, 0.96)], p=[0.6, 0.15, 0.1, 0.15])
    w, h = long, max(1, round(long * short_ratio))
    return (h, w) if rng.uniform() < 0.25 else (w, h)


def _field(width: int, height: int, cell: float, channels: int,
           rng: np.random.Generator) -> np.ndarray:
    """A smooth random field [height, width, channels] of unit scale, varying over ``cell``
    pixels (normal noise on a coarse grid, bilinearly enlarged)."""
    gw, gh = max(2, round(width / cell)), max(2, round(height / cell))
    grid = rng.normal(0, 1, (gh, gw, channels)).astype(np.float32)
    return np.stack([np.asarray(Image.fromarray(grid[..., c], mode="F").resize(
        (width, height), Image.BILINEAR)) for c in range(channels)], -1)


def _imagenet_like(cls: int, num_classes: int, n: int, rng: np.random.Generator) -> Image.Image:
    """Image ``n`` of the fixture: the class drawing at an ImageNet-like size, with broad
    colour fields, fine texture and noise (the entropy of a photograph at quality 90)."""
    width, height = _imagenet_size(rng)
    pixels = (_drawing(cls, num_classes, width, height, rng)
              + 35 * _field(width, height, max(width, height) / 4, 3, rng)
              + rng.uniform(20, 60) * _field(width, height, 3, 1, rng)
              + rng.normal(0, 5, (height, width, 3)))
    image = _to_image(pixels)
    if n % GREY_EVERY == GREY_AT:
        return image.convert("L")
    if n % CMYK_EVERY == CMYK_AT:
        return image.convert("CMYK")
    return image


def _write_imagenet_like(job: tuple[Path, int, int], num_classes: int, seed: int) -> None:
    path, drawn, n = job
    rng = np.random.default_rng((seed, n))
    _imagenet_like(drawn, num_classes, n, rng).save(path, quality=90)


def write_fixture(root, num_classes: int = 10, train_per_class: int = 100,
                  val_per_class: int = 50, image_size: int = 80, seed: int = 0,
                  imagenet_like: bool = False) -> Path:
    """Write the fixture under ``root`` (reused when the same one is already there);
    ``imagenet_like``: ImageNet's image sizes, file sizes and colour modes, not
    ``image_size`` squares."""
    params = dict(num_classes=num_classes, train_per_class=train_per_class,
                  val_per_class=val_per_class, image_size=image_size, seed=seed,
                  noisy_every=NOISY_EVERY)
    if imagenet_like:
        params.update(imagenet_like=True, grey_every=GREY_EVERY, cmyk_every=CMYK_EVERY)

    def write(tmp: Path) -> None:
        rng = np.random.default_rng(seed)
        wnids = [f"n{10_000_000 + 7919 * c:08d}" for c in range(num_classes)]
        jobs, val_no = [], 0   # (file, class drawn, image number n)
        for c, wnid in enumerate(wnids):
            for split, count in (("train", train_per_class), ("val", val_per_class)):
                folder = tmp / split / wnid
                folder.mkdir(parents=True)
                for i in range(count):
                    if split == "train":
                        name = f"{wnid}_{i}.JPEG"
                    else:
                        val_no += 1
                        name = f"ILSVRC2012_val_{val_no:08d}.JPEG"
                    drawn = (c + 1) % num_classes if i % NOISY_EVERY == NOISY_EVERY - 1 else c
                    jobs.append((folder / name, drawn, len(jobs)))
        if not imagenet_like:
            for path, drawn, _ in jobs:
                _image(drawn, num_classes, image_size, rng).save(path, quality=90)
            return
        # Each image has its own random stream, so the files do not depend on the processes.
        in_processes(partial(_write_imagenet_like, num_classes=num_classes, seed=seed), jobs,
                     min(os.cpu_count() or 1, 16))
    return cached_fixture(root, params, write)


@fixture_command
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.resnet.fixture",
                                description="Write the ImageNet-format ResNet fixture.")
    p.add_argument("outdir", type=Path)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--train-per-class", type=int, default=100)
    p.add_argument("--val-per-class", type=int, default=50)
    p.add_argument("--image-size", type=int, default=80,
                   help="side of the square images (not with --imagenet-like)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--imagenet-like", action="store_true",
                   help="ImageNet's mix of image sizes, file sizes (~110 KB), greyscale and "
                        "CMYK JPEGs, for input-pipeline measurements")
    a = p.parse_args(argv)
    write_fixture(a.outdir, a.classes, a.train_per_class, a.val_per_class, a.image_size, a.seed,
                  a.imagenet_like)
    return 0


if __name__ == "__main__":
    sys.exit(main())
