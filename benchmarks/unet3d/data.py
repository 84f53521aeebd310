"""KiTS19 as the MLPerf reference's preprocessing writes it, and the training augmentations.

On disk: ``case_XXXXX_x.npy`` (float32, (1, D, H, W), normalised CT) and
``case_XXXXX_y.npy`` (uint8, same shape, 0 background, 1 kidney, 2 tumour).
The 42 cases of ``EVAL_CASES`` (the reference's ``evaluation_cases.txt``)
are the evaluation set, every other case trains.

Training samples follow the reference: a random crop of the training shape,
with probability ``oversampling`` one around a foreground object (one of the
two largest connected components of a randomly chosen foreground class),
then random flips of each axis (p = 1/3), and with p = 0.1 each a brightness
scaling by ``1 + U(0.7, 1.3)`` and Gaussian noise of std ``U(0, 0.1)``. Every
random draw comes from a generator seeded by (seed, epoch, case), so a
sample does not depend on the number of loader processes.

``load`` refuses, naming the case, a label value outside {0, 1, 2} and a NaN or
infinite voxel in the image (checked as each volume is read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common.errors import UserError

EVAL_CASES = frozenset(f"{i:05d}" for i in (
    0, 3, 5, 6, 12, 24, 34, 41, 44, 49, 52, 56, 61, 65, 66, 70, 76, 78, 80, 84, 86,
    87, 92, 111, 112, 125, 128, 138, 157, 160, 161, 162, 169, 171, 176, 185, 187, 189,
    198, 203, 206, 207))
LABELS = (0, 1, 2)
_NAME = re.compile(r"case_(\d{5})_([xy])\.npy$")


@dataclass(frozen=True)
class Case:
    case_id: str
    image: Path
    label: Path
    shape: tuple[int, ...]


def _header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable .npy file ({exc}); re-run prepare_data.py") \
            from exc
    return arr.shape, arr.dtype


def _check_pair(case_id: str, image: Path, label: Path) -> Case:
    xs, xt = _header(image)
    ys, yt = _header(label)
    if len(xs) != 4 or xs[0] != 1:
        raise UserError(f"{image}: shape {xs}, expected (1, D, H, W)")
    if xt != np.float32 or yt != np.uint8:
        raise UserError(f"case {case_id}: dtypes {xt}/{yt}, expected float32 image and uint8 "
                        f"label ({image.parent}); re-run prepare_data.py")
    if xs != ys:
        raise UserError(f"case {case_id}: image {image.name} has shape {xs} but label "
                        f"{label.name} has shape {ys}")
    return Case(case_id, image, label, tuple(xs))


def scan(root: Path) -> tuple[list[Case], list[Case]]:
    """(training cases, evaluation cases), sorted by case id; checks names, shapes, dtypes,
    and that neither split is empty.

    Reads file names and .npy headers only, no voxels: it runs before run_start, and MLPerf
    starts the clock before any part of the system touches the data."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: dataset directory not found (run prepare_data.py or unset "
                        f"DATADIR for the fixture)")
    files: dict[str, dict[str, Path]] = {}
    for path in root.glob("case_*.npy"):
        m = _NAME.search(path.name)
        if m:
            files.setdefault(m.group(1), {})[m.group(2)] = path
    if not files:
        raise UserError(f"{root}: no case_XXXXX_x.npy / case_XXXXX_y.npy files")
    train, val = [], []
    for case_id in sorted(files):
        pair = files[case_id]
        for kind in "xy":
            if kind not in pair:
                raise UserError(f"{root / f'case_{case_id}_{kind}.npy'}: missing (its pair "
                                f"{next(iter(pair.values())).name} exists)")
        case = _check_pair(case_id, pair["x"], pair["y"])
        (val if case_id in EVAL_CASES else train).append(case)
    # Without evaluation cases every evaluation logs mean Dice nan and training goes on.
    if not val:
        raise UserError(f"{root}: none of the reference's {len(EVAL_CASES)} evaluation cases "
                        "(case_00000, case_00003, ...) is here, so nothing can be evaluated; "
                        "preprocess all of KiTS19 with prepare_data.py")
    if not train:
        raise UserError(f"{root}: only evaluation cases, no training case (every case outside "
                        f"the reference's {len(EVAL_CASES)} evaluation cases trains); "
                        "preprocess all of KiTS19 with prepare_data.py")
    return train, val


def load(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """The case's (image, label) as ``scan`` checked them; a label value outside ``LABELS`` or
    a NaN or infinite voxel (which the model would train on and Dice would score) is a
    ``UserError`` naming the case."""
    image = np.load(case.image, allow_pickle=False)
    label = np.load(case.label, allow_pickle=False)
    if label.max(initial=0) > max(LABELS):  # uint8: one pass, not a sort (np.unique)
        bad = np.setdiff1d(np.unique(label), LABELS)
        raise UserError(f"{case.label}: label values {bad.tolist()} outside {{0, 1, 2}}")
    flat = image.reshape(-1)
    # NaN and inf carry through a dot product: one vectorised pass, no temporary the size of
    # the volume; a finite volume whose squares overflow is told apart by the exact test
    with np.errstate(over="ignore", invalid="ignore"):
        energy = np.dot(flat, flat)
    if not np.isfinite(energy) and not np.isfinite(flat).all():
        bad = int(flat.size - np.isfinite(flat).sum())
        raise UserError(f"case {case.case_id}: {case.image} holds {bad} NaN or infinite voxels "
                        f"of {flat.size}; re-run prepare_data.py for this case (its CT volume "
                        "is damaged)")
    return image, label


# -- augmentations --------------------------------------------------------------------------
def _randrange(rng: np.random.Generator, n: int) -> int:
    return 0 if n <= 0 else int(rng.integers(n))


def random_crop(rng, shape, patch) -> list[tuple[int, int]]:
    starts = [_randrange(rng, s - p) for s, p in zip(shape, patch)]
    return [(s, s + p) for s, p in zip(starts, patch)]


def foreground(label: np.ndarray) -> tuple[np.ndarray, dict[int, list[tuple[slice, ...]]]]:
    """The foreground classes of ``label`` and each one's two largest objects (smaller
    first): what the balanced crop draws from, a function of the case alone."""
    from scipy import ndimage

    classes = np.unique(label[label > 0])
    objects = {}
    for c in classes:
        found = [s for s in ndimage.find_objects(ndimage.label(label[0] == c)[0]) if s is not None]
        found.sort(key=lambda sl: np.prod([s.stop - s.start for s in sl]))
        objects[int(c)] = found[-2:]
    return classes, objects


def foreground_crop(rng, found, shape, patch) -> list[tuple[int, int]] | None:
    """A patch of a volume of ``shape`` (D, H, W) around one of the two largest objects of a
    random foreground class, drawn from ``foreground(label)``."""
    classes, objects = found
    if classes.size == 0:
        return None
    largest = objects[int(rng.choice(classes))]
    chosen = largest[_randrange(rng, len(largest))]
    bounds = []
    for sl, p, size in zip(chosen, patch, shape):
        diff = p - (sl.stop - sl.start)
        sign, diff = (-1 if diff < 0 else 1), abs(diff)
        left = _randrange(rng, diff)
        low = max(0, sl.start - sign * left)
        high = min(size, sl.stop + sign * (diff - left))
        short = p - (high - low)
        if short > 0 and low == 0:
            high += short
        elif short > 0:
            low -= short
        bounds.append((low, high))
    return bounds


def augment(rng, image: np.ndarray, label: np.ndarray, found, patch, oversampling: float):
    """One training sample: balanced crop, flips, brightness, noise (the reference's order);
    ``found`` is ``foreground(label)``. Only the crop of ``image`` and ``label`` is read, so
    they may be memory-mapped."""
    box = (foreground_crop(rng, found, image.shape[1:], patch)
           if rng.random() < oversampling else None)
    box = box or random_crop(rng, image.shape[1:], patch)
    sl = (slice(None),) + tuple(slice(lo, hi) for lo, hi in box)
    image, label = image[sl], label[sl]
    for axis in (1, 2, 3):
        if rng.random() < 1 / 3:
            image, label = np.flip(image, axis), np.flip(label, axis)
    # copies: a patch of a memory map may be a read-only view of the file
    image = np.array(image, dtype=np.float32, order="C")
    label = np.array(label, dtype=np.uint8, order="C")
    if rng.random() < 0.1:
        image = image * np.float32(1 + rng.uniform(0.7, 1.3))
    if rng.random() < 0.1:
        image = image + rng.normal(0.0, rng.uniform(0.0, 0.1), image.shape).astype(np.float32)
    return image, label


class TrainSet(torch.utils.data.Dataset):
    """Indexed by (epoch, case index): one augmented (image, label) patch.

    Each process reads and checks a case whole (``load``) and finds its foreground objects
    the first time it meets it; after that it reads only the patch from memory-mapped files
    (a KiTS19 case is about 150 MB, a 128^3 patch 8 MB)."""

    def __init__(self, cases: list[Case], patch, oversampling: float, seed: int):
        self.cases, self.patch = cases, tuple(patch)
        self.oversampling, self.seed = oversampling, seed
        self._found: dict[int, tuple] = {}
        for case in cases:
            if any(s < p for s, p in zip(case.shape[1:], self.patch)):
                raise UserError(f"{case.image}: volume {case.shape[1:]} is smaller than the "
                                f"training patch {self.patch}")

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        rng = np.random.default_rng([self.seed, epoch, index])
        case = self.cases[index]
        if index not in self._found:
            self._found[index] = foreground(load(case)[1])
        image = np.load(case.image, mmap_mode="r", allow_pickle=False)
        label = np.load(case.label, mmap_mode="r", allow_pickle=False)
        image, label = augment(rng, image, label, self._found[index], self.patch,
                               self.oversampling)
        return torch.from_numpy(image), torch.from_numpy(label)


def epoch_order(num_cases: int, seed: int, epoch: int, global_batch: int, replica: int,
                replicas: int) -> list[list[tuple[int, int]]]:
    """This data-parallel replica's batches of an epoch: a seeded shuffle, whole steps only."""
    perm = np.random.default_rng([seed, epoch, 1 << 20]).permutation(num_cases)
    local = global_batch // replicas
    steps = num_cases // global_batch
    return [[(epoch, int(i)) for i in perm[t * global_batch + replica * local:
                                           t * global_batch + (replica + 1) * local]]
            for t in range(steps)]


def synthetic_batch(batch_size: int, shape, device) -> tuple[torch.Tensor, torch.Tensor]:
    image = torch.randn(batch_size, 1, *shape, device=device)
    label = torch.randint(0, 3, (batch_size, 1, *shape), device=device, dtype=torch.uint8)
    return image, label



def as_channels_last_3d(x: torch.Tensor) -> torch.Tensor:
    """``x`` [N, C, D, H, W] in channels_last_3d strides even for one channel (``contiguous``
    keeps a one-channel image's NCDHW strides, and cuDNN then runs the first convolution's
    backward in NCDHW, transposing its 32-channel gradient: 3 ms a step at 128^3)."""
    out = torch.empty_like(x, memory_format=torch.channels_last_3d)
    return x if x.stride() == out.stride() else out.copy_(x)
