"""ImageNet readers for ResNet-50: the JPEG folder layout, decoded on the CPU, the GPU or by DALI.

Backends: ``cpu`` (Pillow in loader processes, the reference), ``turbo`` (libjpeg-turbo in
loader processes, a batch's crops in one buffer; ``turbo.py``), ``nvjpeg`` (batched nvJPEG
and one batched crop and resize, overlapped with the step; ``nvjpeg.py``) and ``dali``.

Layout: ``ROOT/train/<wnid>/*.JPEG`` and ``ROOT/val/<wnid>/*.JPEG``; the class
index is the position of the wnid among the sorted train folders.

Training batches use a random-resized crop (8-100% of the area, aspect ratio
3/4-4/3, log-uniform) and a horizontal flip; evaluation resizes the shorter
side to ``size / 0.875`` and takes the centre crop. Every loader hands out
``(images, labels)`` on the device: images float32, NCHW in channels-last
memory, normalised with the ImageNet mean and standard deviation (pixel
scale), labels int64. Training drops each rank's last partial batch (static
shapes for CUDA graphs); evaluation sees every image exactly once across ranks.
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

MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)
BACKENDS = ("cpu", "turbo", "nvjpeg", "dali")
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


# -- crops shared by every backend ----------------------------------------------------------
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
    in ``epoch``: the same for every backend that plans its crops on the host."""
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


# -- CPU backend: Pillow in DataLoader workers -------------------------------------------
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
    """uint8 NHWC (any device) -> normalised float32 NCHW in channels-last memory on ``device``."""
    return normalize(nhwc_uint8.to(device, non_blocking=True).permute(0, 3, 1, 2).float())


def normalize(x: torch.Tensor) -> torch.Tensor:
    """float32 NCHW pixels (0-255) -> normalised with the ImageNet mean and standard
    deviation, in channels-last memory."""
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
    return ((x - mean) / std).contiguous(memory_format=torch.channels_last)


class _Epoch:
    """One pass of a loader: sized and iterable."""

    def __init__(self, n: int, it_factory):
        self._n, self._factory = n, it_factory

    def __len__(self):
        return self._n

    def __iter__(self):
        return self._factory()


class Loader:
    """Batches of one rank's shard; ``epoch(e)`` is that epoch's pass."""

    def __init__(self, samples, train: bool, batch_size: int, rank: int, world_size: int,
                 seed: int, decode):
        self.samples, self.train, self.batch_size = samples, train, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
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
        return _Epoch(n, lambda: self._decode(indices, epoch))

    def close(self) -> None:
        """Stop the decoder's loader processes, where it keeps them between passes."""
        close = getattr(self._decode, "close", None)
        if close is not None:
            close()


def _cpu_decoder(samples, size, train, seed, batch_size, workers, device):
    dataset = _PillowDataset(samples, size, train, seed)

    def decode(indices, epoch) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        dataset.epoch = epoch  # workers are re-created per epoch and pick this up
        batches = [indices[i:i + batch_size] for i in range(0, len(indices), batch_size)]
        loader = torch.utils.data.DataLoader(
            dataset, batch_sampler=batches, num_workers=workers,
            pin_memory=device.type == "cuda", prefetch_factor=4 if workers else None)
        for images, labels in loader:
            yield normalize_on_device(images, device), labels.to(device, non_blocking=True)
    return decode


# -- file bytes for the GPU decoders ----------------------------------------------------------
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


# -- DALI backend ---------------------------------------------------------------------------
def _dali_decoder(samples, size, train, seed, batch_size, workers, device):
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
    except ImportError:
        raise UserError("backend dali needs NVIDIA DALI: pip install nvidia-dali-cuda120 "
                        "(or use --data-backend cpu)") from None
    on_gpu = device.type == "cuda"

    def decode(indices, epoch):
        files = [samples[i][0] for i in indices]
        labels = [samples[i][1] for i in indices]

        @pipeline_def(batch_size=batch_size, num_threads=max(workers, 1),
                      device_id=device.index if on_gpu else None, seed=seed + epoch)
        def pipe():
            jpegs, lab = fn.readers.file(files=files, labels=labels, random_shuffle=False,
                                         name="reader")
            dev = "mixed" if on_gpu else "cpu"
            if train:
                imgs = fn.decoders.image_random_crop(jpegs, device=dev, output_type=types.RGB,
                                                     random_area=[0.08, 1.0],
                                                     random_aspect_ratio=[0.75, 4 / 3])
                imgs = fn.resize(imgs, resize_x=size, resize_y=size)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                imgs = fn.decoders.image(jpegs, device=dev, output_type=types.RGB)
                imgs = fn.resize(imgs, resize_shorter=round(size / EVAL_CROP_FRACTION))
                mirror = 0
            imgs = fn.crop_mirror_normalize(imgs, crop=(size, size), mean=list(MEAN),
                                            std=list(STD), mirror=mirror, output_layout="CHW",
                                            dtype=types.FLOAT)
            return imgs, lab

        p = pipe()
        p.build()
        n = len(files) // batch_size * batch_size if train else len(files)
        it = DALIGenericIterator(p, ["images", "labels"], size=n, auto_reset=False,
                                 last_batch_padded=False, last_batch_policy=_dali_policy(train))
        for out in it:
            images = out[0]["images"].to(device).contiguous(memory_format=torch.channels_last)
            yield images, out[0]["labels"].view(-1).long().to(device)
    return decode


def _dali_policy(train: bool):
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    return LastBatchPolicy.DROP if train else LastBatchPolicy.PARTIAL


def _nvjpeg_decoder(*args, cpu_share: float = 0.0):
    from benchmarks.resnet import nvjpeg
    nvjpeg.require_torchvision("--data-backend nvjpeg")
    return nvjpeg.BatchedDecoder(*args, cpu_share=cpu_share)


def _turbo_decoder(*args, region_decode: bool = False, resize_on_device: bool = False,
                   nvjpeg_share: float = 0.0):
    from benchmarks.resnet import turbo
    device_decode = None
    if nvjpeg_share:
        from benchmarks.resnet import nvjpeg
        nvjpeg.require_torchvision(f"--eval-nvjpeg-share {nvjpeg_share}")
        device_decode = nvjpeg.nvjpeg_decode
    return turbo.TurboDecoder(*args, region_decode=region_decode,
                              resize_on_device=resize_on_device, device_decode=device_decode,
                              device_share=nvjpeg_share)


_DECODERS = {"cpu": _cpu_decoder, "turbo": _turbo_decoder, "nvjpeg": _nvjpeg_decoder,
             "dali": _dali_decoder}


def _build(index, backend, image_size, batch_size, rank, world_size, seed, workers, device,
           train, cpu_decode_share, region_decode, resize_on_device,
           nvjpeg_share=0.0) -> Loader:
    if backend not in _DECODERS:
        raise UserError(f"unknown data backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "nvjpeg" and device.type != "cuda":
        raise UserError(f"--data-backend {backend} decodes with nvJPEG and needs a CUDA device; "
                        "use --data-backend cpu")
    if cpu_decode_share and backend != "nvjpeg":
        raise UserError(f"--cpu-decode-share splits the decoding of the nvjpeg backend; "
                        f"--data-backend {backend} has no such split: leave it out")
    for flag, on in (("--region-decode", region_decode),
                     ("--resize-on-device", resize_on_device)):
        if on and backend != "turbo":
            raise UserError(f"{flag} changes the turbo backend's loader; --data-backend "
                            f"{backend} has none: use --data-backend turbo or leave it out")
    if nvjpeg_share:
        _check_nvjpeg_share(nvjpeg_share, backend, resize_on_device, device)
    samples = index.train if train else index.val
    options = {"cpu_share": cpu_decode_share} if cpu_decode_share else {}
    if region_decode:
        options["region_decode"] = True
    if resize_on_device:
        options["resize_on_device"] = True
    if nvjpeg_share:
        options["nvjpeg_share"] = nvjpeg_share
    decode = _DECODERS[backend](samples, image_size, train, seed, batch_size, workers, device,
                                **options)
    return Loader(samples, train, batch_size, rank, world_size, seed, decode)


def _check_nvjpeg_share(share, backend, resize_on_device, device) -> None:
    flag = f"--eval-nvjpeg-share {share}"
    if not 0 <= share <= 1:
        raise UserError(f"{flag}: give a fraction from 0 to 1")
    if backend != "turbo" or not resize_on_device:
        raise UserError(f"{flag} hands part of the turbo backend's resized-on-device batches "
                        "to nvJPEG: add --data-backend turbo --resize-on-device, or leave it out")
    if device.type != "cuda":
        raise UserError(f"{flag} decodes with nvJPEG and needs a CUDA device; leave it out")


def build_train_loader(index, backend: str, image_size: int, batch_size: int, rank: int,
                       world_size: int, seed: int, workers: int, device: torch.device,
                       cpu_decode_share: float = 0.0, region_decode: bool = False,
                       resize_on_device: bool = False) -> Loader:
    return _build(index, backend, image_size, batch_size, rank, world_size, seed, workers,
                  device, True, cpu_decode_share, region_decode, resize_on_device)


def build_eval_loader(index, backend: str, image_size: int, batch_size: int, rank: int,
                      world_size: int, workers: int, device: torch.device,
                      cpu_decode_share: float = 0.0, region_decode: bool = False,
                      resize_on_device: bool = False, nvjpeg_share: float = 0.0) -> Loader:
    """``nvjpeg_share``: the share of each batch decoded by nvJPEG (``nvjpeg_share.py``)."""
    return _build(index, backend, image_size, batch_size, rank, world_size, 0, workers,
                  device, False, cpu_decode_share, region_decode, resize_on_device,
                  nvjpeg_share)


def synthetic_batch(batch_size: int, image_size: int, num_classes: int, device
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """A device-resident random batch in the loaders' format, for throughput runs."""
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    labels = torch.randint(0, num_classes, (batch_size,), device=device)
    return images.contiguous(memory_format=torch.channels_last), labels
