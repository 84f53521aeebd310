"""A tiny KiTS19-format dataset that a small 3D U-Net can learn.

``python -m benchmarks.unet3d.fixture DIR`` writes 210 cases ``case_00000`` ..
``case_00209`` in the preprocessed format (``_x.npy`` float32 (1, D, H, W),
``_y.npy`` uint8), so the reference's split
gives 168 training and 42 evaluation cases. Each volume holds one kidney (an
ellipsoid, label 1) with a tumour inside it (a ball, label 2) on a noisy
background, with intensities in the range of normalised CT. Sizes vary per
case: mostly one 64x32x32 window after the reference's crop of a remainder
under half a step, a fifth of the axes long enough for two overlapping
windows. No volume needs padding, which the reference only meets at the
edges of real scans (air, close to its -2.2 padding value). A ``FIXTURE_COMPLETE``
file records the parameters; a folder holding the same fixture is reused
(``common.fixture_cache``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from common.cli import OneLineParser
from common.fixture_cache import cached_fixture, fixture_command

NUM_CASES = 210
BACKGROUND, KIDNEY, TUMOUR, NOISE = -0.6, 0.9, 2.4, 0.3


def make_case(rng: np.random.Generator, shape) -> tuple[np.ndarray, np.ndarray]:
    grid = np.stack(np.meshgrid(*[np.arange(s, dtype=np.float32) for s in shape],
                                indexing="ij"))
    radii = np.array([rng.uniform(11.5, 16.5), *rng.uniform(7.0, 9.5, 2)])
    centre = np.array([rng.uniform(r + 1, s - r - 1) for r, s in zip(radii, shape)])
    kidney = (((grid - centre[:, None, None, None]) / radii[:, None, None, None]) ** 2).sum(0) <= 1
    # tumours of 0.5-0.7 of the kidney's least radius: 3 runs in 10 never learnt them
    t_radius = rng.uniform(0.7, 0.9) * radii.min()
    offset = rng.normal(size=3)
    offset *= rng.uniform(0, 0.9) * (radii.min() - t_radius) / np.linalg.norm(offset)
    t_centre = centre + offset
    tumour = ((grid - t_centre[:, None, None, None]) ** 2).sum(0) <= t_radius ** 2
    label = np.zeros(shape, np.uint8)
    label[kidney] = 1
    label[tumour & kidney] = 2
    image = np.choose(label, [BACKGROUND, KIDNEY, TUMOUR]).astype(np.float32)
    image += rng.normal(0, NOISE, shape).astype(np.float32)
    return image[None], label[None]


def case_shape(rng: np.random.Generator, window=(64, 32, 32)) -> tuple[int, ...]:
    """Per axis: one window plus under half a step (cropped), a fifth of the time two."""
    shape = []
    for w in window:
        step = w // 2
        base = w + step if rng.random() < 0.2 else w
        shape.append(base + int(rng.integers(0, step // 2)))
    return tuple(shape)


def write_fixture(root: Path, seed: int = 0) -> Path:
    """Write the fixture under ``root`` (reused when the same one is already there)."""
    def write(tmp: Path) -> None:
        rng = np.random.default_rng(seed)
        for i in range(NUM_CASES):
            image, label = make_case(rng, case_shape(rng))
            np.save(tmp / f"case_{i:05d}_x.npy", image, allow_pickle=False)
            np.save(tmp / f"case_{i:05d}_y.npy", label, allow_pickle=False)
    return cached_fixture(root, dict(version=4, seed=seed, cases=NUM_CASES), write)


@fixture_command
def main(argv=None) -> int:
    p = OneLineParser(prog="python -m benchmarks.unet3d.fixture", description=__doc__)
    p.add_argument("root", type=Path)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    write_fixture(a.root, a.seed)
    print(f"unet3d fixture ready in {a.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
