"""ImageNet's JPEG folder layout read for ResNet-50, decoded by Pillow: the reference reader.

The other decoders are input optimisations that select themselves in place of
:func:`pillow_decoder` (``turbo.py``, ``region_decode.py``, ``regions.py``, ``nvjpeg.py``,
``nvjpeg_share.py``, ``dali.py``); :func:`build_loader` takes the one chosen.

Layout: ``ROOT/train/<wnid>/*.JPEG`` and ``ROOT/val/<wnid>/*.JPEG``; the class
index is the position of the wnid among the sorted train folders.

Training batches use a random-resized crop (8-100% of the area, aspect ratio
3/4-4/3, log-uniform) and a horizontal flip; evaluation resizes the shorter
side to ``size / 0.875`` and takes the centre crop. Every loader hands out
``(images, labels)`` on the device: images float32 NCHW in the loader's
``memory_format`` (channels-last where the ``channels-last`` optimisation sets it),
normalised with the ImageNet mean and standard deviation (pixel scale), labels int64.
Training drops each rank's last partial batch (static shapes for CUDA graphs); evaluation
sees every image exactly once across ranks.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from common.errors import UserError
from common.loaders import quiet_on_stop

MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)
EVAL_CROP_FRACTION = 0.875
_EXTENSIONS = (".jpeg", ".jpg")


# -- the folder index -------------------------------------------------------------------
def _class_folders(split: Path) -> dict[str, list[str]]:
    classes = {}
    with os.scandir(split) as entries:
        for entry in entries:
            if entry.is_dir():
                with os.scandir(entry.path) as files:
                    classes[entry.name] = sorted(
                        f.path for f in files if f.name.lower().endswith(_EXTENSIONS))
    return classes


@dataclass
class ImageFolderIndex:
    root: Path
    classes: list[str]
    train: list[tuple[str, int]]
    val: list[tuple[str, int]]

    @classmethod
    def scan(cls, root) -> ImageFolderIndex:
        root = Path(root)
        if not root.exists():
            raise UserError(f"{root}: dataset directory does not exist; set DATADIR to the "
                            "ImageNet folder (train/ and val/)")
        if not root.is_dir():
            raise UserError(f"{root}: not a directory; set DATADIR to the ImageNet folder")
        splits = {}
        for split in ("train", "val"):
            path = root / split
            if not path.is_dir():
                raise UserError(f"{path}: missing; expected {root}/{split}/<wnid>/*.JPEG "
                                "(see docs/data.md)")
            folders = _class_folders(path)
            if not folders:
                raise UserError(f"{path}: no class folders; expected {path}/<wnid>/*.JPEG")
            empty = sorted(name for name, files in folders.items() if not files)
            if empty:
                raise UserError(f"{path / empty[0]}: class folder without JPEG files "
                                f"({len(empty)} such folders); remove them or re-extract")
            splits[split] = folders
        train_names, val_names = set(splits["train"]), set(splits["val"])
        for a, b, name_a, name_b in ((val_names, train_names, "val", "train"),
                                     (train_names, val_names, "train", "val")):
            only = sorted(a - b)
            if only:
                raise UserError(f"{root}: {len(only)} class folder(s) in {name_a}/ but not in "
                                f"{name_b}/ (e.g. {', '.join(only[:3])}); train and val must "
                                "have the same classes")
        classes = sorted(train_names)
        label = {c: i for i, c in enumerate(classes)}
        pairs = {s: [(f, label[c]) for c in classes for f in splits[s][c]] for s in splits}
        return cls(root, classes, pairs["train"], pairs["val"])


# -- crops shared by every decoder ----------------------------------------------------------
def random_resized_crop_box(width: int, height: int, rng: random.Random,
                            scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(left, top, w, h) of a random crop; centre crop of the clamped ratio after 10 misses."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def center_crop_box(width: int, height: int, size: int) -> tuple[int, int, int, int]:
    """(left, top, w, h) in source pixels of the evaluation crop: the centre ``size`` square
    after resizing the shorter side to ``size / 0.875``."""
    resized_short = round(size / EVAL_CROP_FRACTION)
    scale = min(width, height) / resized_short
    side = min(round(size * scale), width, height)
    return (width - side) // 2, (height - side) // 2, side, side


def crop_plan(width: int, height: int, size: int, train: bool, seed: int, epoch: int,
              i: int) -> tuple[tuple[int, int, int, int], bool]:
    """Sample ``i``'s crop box (left, top, w, h) in source pixels and whether it is mirrored,
    in ``epoch``: the same for every decoder that plans its crops on the host."""
    if not train:
        return center_crop_box(width, height, size), False
    rng = random.Random(hash((seed, epoch, i)))
    box = random_resized_crop_box(width, height, rng)
    return box, rng.random() < 0.5


def _decode_error(path: str, exc: Exception) -> UserError:
    return UserError(f"{path}: cannot decode JPEG ({exc}); remove or re-extract this file")


def check_decoded_size(image: torch.Tensor, height: int, width: int, path: str) -> None:
    """A one-line ``UserError`` where a decoded [C, H, W] image is not the header's size."""
    if tuple(image.shape[1:]) != (height, width):
        raise UserError(f"{path}: decoded as {tuple(image.shape[1:])} pixels but its "
                        f"header says {(height, width)}; re-extract this file")


# -- the reference: Pillow in DataLoader workers -----------------------------------------
class _PillowDataset(torch.utils.data.Dataset):
    def __init__(self, samples, size: int, train: bool, seed: int):
        self.samples, self.size, self.train, self.seed = samples, size, train, seed
        self.epoch = 0

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        try:
            with Image.open(path) as im:
                im = im.convert("RGB")
                (left, top, w, h), flip = crop_plan(*im.size, self.size, self.train, self.seed,
                                                    self.epoch, i)
                im = im.resize((self.size, self.size), Image.BILINEAR,
                               box=(left, top, left + w, top + h))
                if flip:
                    im = im.transpose(Image.FLIP_LEFT_RIGHT)
                pixels = np.asarray(im, dtype=np.uint8)
        except (OSError, SyntaxError, ValueError) as exc:
            raise _decode_error(path, exc) from None
        return torch.from_numpy(pixels.copy()), label


def normalize_on_device(nhwc_uint8: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 NHWC (any device) -> normalised float32 NCHW on ``device`` (in NHWC memory order,
    which the loader keeps or makes contiguous as its ``memory_format`` says)."""
    return normalize(nhwc_uint8.to(device, non_blocking=True).permute(0, 3, 1, 2).float())


def normalize(x: torch.Tensor) -> torch.Tensor:
    """float32 NCHW pixels (0-255) -> normalised with the ImageNet mean and standard
    deviation, in ``x``'s memory order."""
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


class _Epoch:
    """One pass of a loader: sized and iterable."""

    def __init__(self, n: int, it_factory):
        self._n, self._factory = n, it_factory

    def __len__(self):
        return self._n

    def __iter__(self):
        return self._factory()


class Loader:
    """Batches of one rank's shard; ``epoch(e)`` is that epoch's pass, its images in
    ``memory_format``."""

    def __init__(self, samples, train: bool, batch_size: int, rank: int, world_size: int,
                 seed: int, decode):
        self.samples, self.train, self.batch_size = samples, train, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.memory_format = torch.contiguous_format
        self._decode = decode   # (list of (path, label) indices, epoch) -> iterator of batches
        if train and hasattr(decode, "upcoming"):   # a decoder that reads on into the next pass
            decode.upcoming = self.indices

    def shard(self, epoch: int) -> list[int]:
        """Indices into ``samples`` that this rank reads in ``epoch`` (one permutation for all)."""
        if not self.train:
            return list(range(self.rank, len(self.samples), self.world_size))
        order = torch.randperm(len(self.samples),
                               generator=torch.Generator().manual_seed(self.seed * 100003 + epoch))
        per_rank = len(self.samples) // self.world_size
        return order[self.rank * per_rank:(self.rank + 1) * per_rank].tolist()

    def __len__(self) -> int:
        n = len(self.shard(1))
        return n // self.batch_size if self.train else math.ceil(n / self.batch_size)

    def indices(self, epoch: int) -> list[int]:
        """The shard's indices that ``epoch``'s pass reads, in order (training: whole batches)."""
        indices = self.shard(epoch)
        if self.train:
            indices = indices[:len(indices) // self.batch_size * self.batch_size]
        return indices

    def epoch(self, epoch: int) -> _Epoch:
        indices = self.indices(epoch)
        n = len(indices) // self.batch_size if self.train else math.ceil(
            len(indices) / self.batch_size)
        return _Epoch(n, lambda: self._formatted(self._decode(indices, epoch)))

    def _formatted(self, batches):
        for images, labels in batches:
            yield images.contiguous(memory_format=self.memory_format), labels

    def close(self) -> None:
        """Stop the decoder's loader processes, where it keeps them between passes."""
        close = getattr(self._decode, "close", None)
        if close is not None:
            close()


def pillow_decoder(samples, size, train, seed, batch_size, workers, device):
    """``Loader``'s decode function of the reference: Pillow in DataLoader worker processes."""
    dataset = _PillowDataset(samples, size, train, seed)

    def decode(indices, epoch) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        dataset.epoch = epoch  # workers are re-created per epoch and pick this up
        batches = [indices[i:i + batch_size] for i in range(0, len(indices), batch_size)]
        loader = torch.utils.data.DataLoader(
            dataset, batch_sampler=batches, num_workers=workers,
            pin_memory=device.type == "cuda", prefetch_factor=4 if workers else None,
            worker_init_fn=quiet_on_stop)
        for images, labels in loader:
            yield normalize_on_device(images, device), labels.to(device, non_blocking=True)
    return decode


# -- file bytes for the other decoders ----------------------------------------------------------
def read_files(samples, indices) -> list[bytes]:
    """The files of ``samples[i]`` for each ``i`` in ``indices``, as bytes."""
    blobs = []
    for i in indices:
        with open(samples[i][0], "rb") as f:
            blobs.append(f.read())
    return blobs


def pack(blobs: list[bytes]) -> torch.Tensor:
    """Byte strings as one uint8 tensor (its own memory, so it can be shared or pinned)."""
    return torch.from_numpy(np.frombuffer(b"".join(blobs), dtype=np.uint8).copy())


def build_loader(index: ImageFolderIndex, train: bool, image_size: int, batch_size: int,
                 rank: int, world_size: int, workers: int, device: torch.device, seed: int = 0,
                 decoder=pillow_decoder, **options) -> Loader:
    """The training (``train``) or evaluation loader of this rank, decoding with ``decoder``
    (``Loader``'s decode function made from the samples, the sizes, ``device`` and the
    decoder's ``options``)."""
    samples = index.train if train else index.val
    decode = decoder(samples, image_size, train, seed, batch_size, workers, device, **options)
    return Loader(samples, train, batch_size, rank, world_size, seed, decode)


def synthetic_batch(batch_size: int, image_size: int, num_classes: int, device
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """A device-resident random batch in the loaders' format, for throughput runs."""
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    return images, torch.randint(0, num_classes, (batch_size,), device=device)
