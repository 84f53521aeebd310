"""KiTS19 at its preprocessed scale, for dry runs (``DRY_RUN``) of the 3D U-Net configs: the
real case count and volume sizes, not a learnable dataset and not KiTS19.

    python -m benchmarks.unet3d.standin OUTDIR [--fraction 1.0] [--workers N] [--seed 0]

The preprocessed format of ``benchmarks.unet3d.fixture`` (``case_NNNNN_x.npy`` float32
(1, D, H, W), ``case_NNNNN_y.npy`` uint8) for the 210 cases, or ``--fraction`` of the 168
training and of the 42 evaluation cases (the reference's split), at least one of each. Axes
are drawn uniformly, depth 128-450 and height and width 270-370 voxels, so that the 210 cases
hold about the 31 GB that the reference's preprocessing writes (its MLCube README), none under
the 128-voxel training patch. Each holds one kidney (an ellipsoid, label 1) with a tumour (a
ball, label 2) in noise, for the foreground-oversampling crops. Cases are written by
``--workers`` processes, each from its own seeded generator, so the output does not depend on
the worker count.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from benchmarks.unet3d.data import EVAL_CASES
from benchmarks.unet3d.fixture import BACKGROUND, KIDNEY, NOISE, NUM_CASES, TUMOUR
from common.fixture_cache import cached_fixture, fixture_command, in_processes, standin_parser

KIND = "kits19-standin"
DEPTH, SIDE = (128, 450), (270, 370)


def case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(image, label) of one case, each (1, D, H, W)."""
    shape = (int(rng.integers(*DEPTH, endpoint=True)),
             *(int(v) for v in rng.integers(*SIDE, size=2, endpoint=True)))
    radii = rng.uniform(0.08, 0.13, 3) * shape
    centre = [rng.uniform(r + 1, s - r - 1) for r, s in zip(radii, shape)]
    lo = [max(0, int(c - r)) for c, r in zip(centre, radii)]
    hi = [min(s, int(c + r) + 2) for c, r, s in zip(centre, radii, shape)]
    z, y, x = np.ogrid[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
    d = [(v - c) / r for v, c, r in zip((z, y, x), centre, radii)]
    inside = d[0] ** 2 + d[1] ** 2 + d[2] ** 2 <= 1
    ball = (d[0] * radii[0]) ** 2 + (d[1] * radii[1]) ** 2 + (d[2] * radii[2]) ** 2 \
        <= (0.5 * radii.min()) ** 2
    label = np.zeros(shape, np.uint8)
    box = label[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
    box[inside] = 1
    box[inside & ball] = 2
    image = rng.normal(0, NOISE, shape).astype(np.float32)
    image += np.take(np.array([BACKGROUND, KIDNEY, TUMOUR], np.float32), label)
    return image[None], label[None]


def _write_case(job) -> None:
    folder, number, seed = job
    image, label = case(np.random.default_rng([seed, number]))
    np.save(Path(folder) / f"case_{number:05d}_x.npy", image, allow_pickle=False)
    np.save(Path(folder) / f"case_{number:05d}_y.npy", label, allow_pickle=False)


def cases(fraction: float) -> list[int]:
    """The case numbers written: ``fraction`` of the training and of the evaluation cases."""
    numbers = range(NUM_CASES)
    split = ([n for n in numbers if f"{n:05d}" not in EVAL_CASES],
             [n for n in numbers if f"{n:05d}" in EVAL_CASES])
    return sorted(n for part in split for n in part[:max(1, round(len(part) * fraction))])


def write_standin(root, fraction: float = 1.0, workers: int = 1, seed: int = 0) -> Path:
    """Write the stand-in under ``root`` (reused when the same one is already there)."""
    numbers = cases(fraction)
    params = dict(kind=KIND, cases=len(numbers), seed=seed, version=1)

    def write(tmp: Path) -> None:
        in_processes(_write_case, [(str(tmp), n, seed) for n in numbers], workers, 1)
    return cached_fixture(root, params, write)


@fixture_command
def main(argv=None) -> int:
    p = standin_parser("python -m benchmarks.unet3d.standin",
                       "Write KiTS19 at its preprocessed scale (not KiTS19).",
                       1.0, "the 168 training and the 42 evaluation cases")
    write_standin(**vars(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
