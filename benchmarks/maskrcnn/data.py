"""The Mask R-CNN input pipeline of the MLPerf Training 1.1 reference, on the shared COCO reader.

Follows mlcommons/training ``object_detection/pytorch/maskrcnn_benchmark`` as of v1.1 (commit
d0a86d67): ``data/datasets/coco.py``, ``data/transforms/{build,transforms}.py``,
``structures/{bounding_box,segmentation_mask,image_list}.py``, ``data/collate_batch.py``,
``data/build.py``, ``data/samplers/grouped_batch_sampler.py``; sizes from
``config/defaults.py`` and ``configs/e2e_mask_rcnn_R_50_FPN_1x.yaml``.

Targets (``COCODataset``): crowd annotations are dropped; COCO's ``[x, y, w, h]`` becomes the
inclusive-pixel box ``(x, y, x + max(w - 1, 0), y + max(h - 1, 0))``, clipped to
``[0, W - 1] x [0, H - 1]`` and kept when ``x2 > x1`` and ``y2 > y1`` (``clip_to_image``);
labels are the reader's 1..C. Training drops the images left without a target: the reference
drops those whose every box is at most 1 pixel wide or high and cannot train on an image
without targets (its matcher raises), so wherever the reference trains the two rules agree.

Training transform (``build_transforms``): resize so that the shorter side is ``min_size`` (800)
unless the longer would then pass ``max_size`` (1333) (``Resize.get_size``, rounding included;
PIL's bilinear resize of the uint8 image, which is what torchvision's ``F.resize`` does to the
reference's PIL images), horizontal flip with probability ``FLIP_P``; the image stays uint8 on
its way to the GPU, where :func:`normalize` makes it float in 0..1 and normalises it (a quarter
of the bytes to collate, pin and copy). Boxes are scaled by the new-to-old size ratio of each
axis, inclusive ends like any coordinate (``BoxList.resize``), and flipped to ``(W - 1 - x2, y1,
W - 1 - x1, y2)`` (``BoxList.transpose``). Polygons are scaled alike, flipped as the reference
flips them, ``x -> W - 1 - x`` (one pixel left of the mirrored image, as there), and rasterised
by pycocotools at the resized size into full-image masks; an RLE segmentation (COCO uses them
for crowds only) is decoded, resized (nearest) and flipped with the same one-pixel shift.
Evaluation transform: the same resize, no flip; the image id and original size travel with the
image, for pasting masks and scoring.

Normalisation: the backbone starts from torchvision's ``resnet50`` ImageNet weights, trained
on RGB in 0..1 normalised by ImageNet's ``MEAN`` and ``STD`` (``common.coco.data``); the
reference's ``TO_BGR255`` with Caffe2 pixel means (BGR 102.98, 115.95, 122.77, std 1) belongs
to its MSRA weights.

Batches (``BatchCollator``, ``to_image_list``): the images, zero-padded at the bottom and right
(zero after :func:`normalize` too, as the reference pads its normalised images) to the batch's
largest height and width, each rounded up to a multiple of ``SIZE_DIVISIBILITY``; each image's
own (height, width) is kept. With size buckets (:func:`size_buckets`, ``--size-buckets``) each
padded side is rounded up further, to the next of a few sizes, so batches come in a few shapes
instead of one per size. Boxes and labels are padded to the batch's largest count (label 0 marks
padding), and the masks of all images are one tensor padded like the images, so the whole batch
is a few tensors (:class:`TrainBatch`).

Sampling: an epoch's order is a permutation seeded by (seed, epoch), the same on every rank;
rank ``r`` takes the ``r``-th of ``world_size`` contiguous equal slices (the reference's
``DistributedSampler`` pads by wrapping instead) and batches it as ``GroupedBatchSampler``:
images with height/width below 1 and the others form two groups, each cut into batches in
sampler order, the batches ordered by their first image's position. Training drops incomplete
batches and takes the same number of batches, ``slice // batch - (groups - 1)``, in every
epoch and on every rank (the reference keeps the uneven ones and counts iterations);
evaluation keeps every image once. A sample's flip is drawn from a generator seeded by (seed,
epoch, index), so it does not depend on the worker that loads it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from pycocotools import mask as mask_utils

from benchmarks.maskrcnn.boxes import TO_REMOVE
from common.coco import data as coco
from common.coco import pipeline
from common.coco.data import CocoSplit, ImageRecord, imagenet_stats
from common.coco.pipeline import epoch_order, sample_generator
from common.errors import UserError

MIN_SIZE = 800              # INPUT.MIN_SIZE_TRAIN (800,) and MIN_SIZE_TEST
MAX_SIZE = 1333             # INPUT.MAX_SIZE_TRAIN and MAX_SIZE_TEST
SIZE_DIVISIBILITY = 32      # DATALOADER.SIZE_DIVISIBILITY
FLIP_P = 0.5
ASPECT_BINS = (1.0,)        # DATALOADER.ASPECT_RATIO_GROUPING: height / width below 1 or not


# -- sizes, boxes and masks --------------------------------------------------------------------
def resized_size(width: int, height: int, min_size: int = MIN_SIZE,
                 max_size: int = MAX_SIZE) -> tuple[int, int]:
    """(height, width) of a ``width`` x ``height`` image resized as the reference's
    ``Resize.get_size``: the shorter side becomes ``min_size`` unless the longer would then
    exceed ``max_size``, in which case the longer becomes about ``max_size``; the other side
    is truncated."""
    size = min_size
    short, long = float(min(width, height)), float(max(width, height))
    if long / short * size > max_size:
        size = int(round(max_size * short / long))
    if (width <= height and width == size) or (height <= width and height == size):
        return height, width
    if width < height:
        return int(size * height / width), size
    return size, int(size * width / height)


def reference_targets(record: ImageRecord) -> tuple[np.ndarray, np.ndarray]:
    """The record's targets as the reference makes them: inclusive-pixel boxes float32
    [n, 4] in the original image and the indices [n] of their annotations in the record
    (crowds and boxes that ``clip_to_image`` empties left out)."""
    w, h = record.width, record.height
    # the reader's x2 = x + w, clipped to W; the reference's x + max(w - 1, 0), clipped to W - 1
    boxes = record.boxes - np.array([0, 0, TO_REMOVE, TO_REMOVE], np.float32)
    boxes = np.clip(boxes, 0, np.array([w, h, w, h], np.float32) - TO_REMOVE)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1]) & ~record.iscrowd
    index = np.flatnonzero(keep)
    return boxes[index], index


def scale_boxes(boxes: torch.Tensor, ratio_w: float, ratio_h: float) -> torch.Tensor:
    """Boxes [n, 4] of a resized image, each coordinate times its axis' ratio."""
    return boxes * boxes.new_tensor([ratio_w, ratio_h, ratio_w, ratio_h])


def flip_boxes(boxes: torch.Tensor, width: int) -> torch.Tensor:
    """Inclusive-pixel boxes [n, 4] of an image ``width`` pixels wide, mirrored left-right."""
    x1, y1, x2, y2 = boxes.unbind(1)
    return torch.stack((width - TO_REMOVE - x2, y1, width - TO_REMOVE - x1, y2), 1)


def _polygons_rle(polygons: list[np.ndarray], ratio_w: float, ratio_h: float,
                  size: tuple[int, int], flip: bool) -> dict:
    height, width = size
    moved = []
    for p in polygons:
        q = p.astype(np.float64)            # pycocotools rasterises double coordinates
        q[0::2] *= ratio_w
        q[1::2] *= ratio_h
        if flip:
            q[0::2] = width - TO_REMOVE - q[0::2]
        moved.append(q)
    return mask_utils.merge(mask_utils.frPyObjects(moved, height, width))


def _rle_mask(segmentation: dict, record: ImageRecord, size: tuple[int, int],
              flip: bool) -> np.ndarray:
    height, width = size
    mask = mask_utils.decode(coco.segmentation_rle(segmentation, record.height, record.width))
    mask = np.asarray(Image.fromarray(mask).resize((width, height), Image.NEAREST))
    if flip:
        shifted = np.zeros_like(mask)
        shifted[:, :-TO_REMOVE] = mask[:, ::-1][:, TO_REMOVE:]
        mask = shifted
    return mask


def instance_masks(record: ImageRecord, index: np.ndarray, size: tuple[int, int],
                   flip: bool = False) -> np.ndarray:
    """uint8 [n, height, width] masks of the record's annotations ``index`` in its image
    resized to ``size`` (height, width) and flipped when ``flip``."""
    if record.segmentations is None:
        raise ValueError("the split was loaded without masks; use load_split(root, 'train')")
    height, width = size
    ratio_w, ratio_h = width / record.width, height / record.height
    out = np.zeros((len(index), height, width), np.uint8)
    polygons = {}
    for k, j in enumerate(index.tolist()):
        seg = record.segmentations[j]
        if isinstance(seg, list):
            polygons[k] = _polygons_rle(seg, ratio_w, ratio_h, size, flip)
        else:
            out[k] = _rle_mask(seg, record, size, flip)
    if polygons:
        out[list(polygons)] = mask_utils.decode(list(polygons.values())).transpose(2, 0, 1)
    return out


# -- images ----------------------------------------------------------------------------------
def resize_image(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 [H, W, 3] resized to ``size`` (height, width), PIL's bilinear (with its
    antialiasing when shrinking), as torchvision's ``F.resize`` on a PIL image."""
    if image.shape[:2] == tuple(size):
        return image
    return np.array(Image.fromarray(image).resize(size[::-1], Image.BILINEAR))


def to_tensor(image: np.ndarray, flip: bool = False) -> torch.Tensor:
    """uint8 [H, W, 3] RGB -> uint8 [3, H, W] (mirrored when ``flip``)."""
    if flip:
        image = image[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).contiguous()


def normalize(images: torch.Tensor, image_sizes: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, H, W] padded images -> float32 in 0..1 normalised with ImageNet's
    ``MEAN`` and ``STD``, each image's padding (outside its ``image_sizes`` (height, width))
    zero; the memory format is kept."""
    mean, std = imagenet_stats(images.device)
    x = images.float().div_(255).sub_(mean).div_(std)
    rows = torch.arange(x.shape[-2], device=x.device) < image_sizes[:, :1]
    cols = torch.arange(x.shape[-1], device=x.device) < image_sizes[:, 1:]
    return x.mul_((rows[:, :, None] & cols[:, None, :]).unsqueeze(1))


# -- samples ---------------------------------------------------------------------------------
def train_targets(record: ImageRecord, flip: bool, min_size: int = MIN_SIZE,
                  max_size: int = MAX_SIZE
                  ) -> tuple[tuple[int, int], torch.Tensor, torch.Tensor, torch.Tensor]:
    """A training image's resized (height, width) and its targets there: inclusive-pixel
    boxes float32 [n, 4], labels int64 [n] in 1..C and masks uint8 [n, height, width]."""
    size = resized_size(record.width, record.height, min_size, max_size)
    boxes, index = reference_targets(record)
    boxes = scale_boxes(torch.from_numpy(boxes), size[1] / record.width,
                        size[0] / record.height)
    if flip:
        boxes = flip_boxes(boxes, size[1])
    masks = torch.from_numpy(instance_masks(record, index, size, flip))
    return size, boxes, torch.from_numpy(record.labels[index]), masks


def train_sample(record: ImageRecord, flip: bool, min_size: int = MIN_SIZE,
                 max_size: int = MAX_SIZE
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training transform: (image uint8 [3, h, w], boxes, labels, masks)."""
    size, boxes, labels, masks = train_targets(record, flip, min_size, max_size)
    image = resize_image(coco.decode_image(record.path, (record.width, record.height)), size)
    return to_tensor(image, flip), boxes, labels, masks


def eval_image(record: ImageRecord, min_size: int = MIN_SIZE,
               max_size: int = MAX_SIZE) -> torch.Tensor:
    """The evaluation transform: the image resized, uint8 [3, h, w]."""
    size = resized_size(record.width, record.height, min_size, max_size)
    image = resize_image(coco.decode_image(record.path, (record.width, record.height)), size)
    return to_tensor(image)


def load_split(root, split: str) -> CocoSplit:
    """A COCO 2017 split as Mask R-CNN reads it: "train" with its segmentations and without
    crowd annotations; "val" with all its images (scored against its annotation file)."""
    if split == "train":
        return coco.load_split(root, split, masks=True, keep_crowd=False)
    return coco.load_split(root, split)


class TrainDataset(torch.utils.data.Dataset):
    """Training samples ``(image, boxes, labels, masks)`` of the split's images that have a
    target; ``epoch`` is set with each batch (``pipeline.EpochBatches``)."""

    def __init__(self, split: CocoSplit, seed: int = 0, min_size: int = MIN_SIZE,
                 max_size: int = MAX_SIZE):
        if any(r.segmentations is None for r in split.records):
            raise ValueError("the split was loaded without masks; use load_split(root, 'train')")
        self.records = [r for r in split.records if len(reference_targets(r)[1])]
        if not self.records:
            raise UserError(f"{split.annotation_file}: no image has a non-crowd box of more "
                            "than 1 pixel a side; nothing to train on")
        self.seed, self.min_size, self.max_size, self.epoch = seed, min_size, max_size, 0

    def __len__(self) -> int:
        return len(self.records)

    def flip(self, i: int) -> bool:
        """Whether sample ``i`` is flipped in this epoch."""
        g = sample_generator(self.seed, self.epoch, i)
        return bool(torch.rand((), generator=g) < FLIP_P)

    def __getitem__(self, i: int):
        return train_sample(self.records[i], self.flip(i), self.min_size, self.max_size)


class EvalDataset(torch.utils.data.Dataset):
    """Evaluation samples ``(image, image_id, (original height, original width))``."""

    def __init__(self, split: CocoSplit, min_size: int = MIN_SIZE, max_size: int = MAX_SIZE):
        self.records, self.min_size, self.max_size = split.records, min_size, max_size

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        r = self.records[i]
        return eval_image(r, self.min_size, self.max_size), r.image_id, (r.height, r.width)


# -- batches ---------------------------------------------------------------------------------
class TrainBatch(NamedTuple):
    """A training batch of B images holding K objects in all (M at most per image)."""
    images: torch.Tensor        # uint8 [B, 3, H, W], H and W multiples of size_divisibility
                                # (``normalize`` on the device)
    image_sizes: torch.Tensor   # int64 [B, 2]: each resized image's (height, width)
    boxes: torch.Tensor         # float32 [B, M, 4] inclusive-pixel x1, y1, x2, y2 in the
                                # resized image; zeros as padding
    labels: torch.Tensor        # int64 [B, M] in 1..C; 0 marks padding
    masks: torch.Tensor         # uint8 [K, H, W], K = (labels > 0).sum(): the masks of
                                # boxes[labels > 0] in that order, padded like the images

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(*(t.to(device, non_blocking=True) for t in self))


class EvalBatch(NamedTuple):
    """An evaluation batch of B images."""
    images: torch.Tensor          # uint8 [B, 3, H, W], padded as in training
    image_sizes: torch.Tensor     # int64 [B, 2]: each resized image's (height, width)
    image_ids: torch.Tensor       # int64 [B]: COCO image ids
    original_sizes: torch.Tensor  # int64 [B, 2]: each original image's (height, width)

    def to(self, device: torch.device | str) -> EvalBatch:
        return EvalBatch(*(t.to(device, non_blocking=True) for t in self))

    def filled(self, size: int) -> EvalBatch:
        """The batch grown to ``size`` images with copies of its last one (a compiled
        backbone has a graph per batch size: short last batches would each build one)."""
        extra = size - len(self.images)
        return EvalBatch(*(torch.cat((t, t[-1:].expand(extra, *t.shape[1:])))
                           for t in self)) if extra > 0 else self


def size_buckets(count: int, min_size: int, max_size: int,
                 size_divisibility: int = SIZE_DIVISIBILITY) -> tuple[int, ...]:
    """``count`` padded side lengths, multiples of ``size_divisibility``, evenly spread from
    the resize's shorter side (``min_size``) to its longer one (``max_size``), both rounded
    up: every resized image fits the largest."""
    d = size_divisibility
    low, high = -(-min_size // d), -(-max_size // d)
    if count < 1 or high < low:
        raise UserError(f"--size-buckets {count}: give at least 1 bucket for sides "
                        f"{min_size}-{max_size}")
    steps = [low + round(i * (high - low) / max(count - 1, 1)) for i in range(count)]
    return tuple(sorted({d * s for s in steps}))


def bucket_shapes(buckets: Sequence[int]) -> list[tuple[int, int]]:
    """The padded (height, width) of aspect-grouped batches under ``buckets``: the shorter
    side at the first bucket, the longer at any (2 x buckets - 1 shapes)."""
    short = buckets[0]
    return list(dict.fromkeys([(short, b) for b in buckets] + [(b, short) for b in buckets]))


def padded_shape(sizes: Sequence[tuple[int, int]], size_divisibility: int,
                 buckets: Sequence[int] = ()) -> tuple[int, int]:
    """The batch's largest height and width, each rounded up to a multiple of
    ``size_divisibility`` (``to_image_list``), then to the smallest of ``buckets`` that
    holds it (a side longer than every bucket keeps its own)."""
    d = size_divisibility

    def side(n: int) -> int:
        n = -(-n // d) * d
        return min((b for b in buckets if b >= n), default=n)
    return side(max(h for h, _ in sizes)), side(max(w for _, w in sizes))


def pad_images(images: Sequence[torch.Tensor], size_divisibility: int = SIZE_DIVISIBILITY,
               buckets: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensors [..., h_i, w_i] zero-padded at the bottom and right into one
    [B, ..., H, W] (``padded_shape``), and their sizes int64 [B, 2] (h_i, w_i)."""
    sizes = [tuple(x.shape[-2:]) for x in images]
    height, width = padded_shape(sizes, size_divisibility, buckets)
    out = images[0].new_zeros(len(images), *images[0].shape[:-2], height, width)
    for x, pad in zip(images, out):
        pad[..., :x.shape[-2], :x.shape[-1]].copy_(x)
    return out, torch.tensor(sizes, dtype=torch.int64).reshape(len(images), 2)


def collate_train(samples, size_divisibility: int = SIZE_DIVISIBILITY,
                  buckets: Sequence[int] = ()) -> TrainBatch:
    """Training samples ``(image, boxes, labels, masks)`` -> :class:`TrainBatch`."""
    images, boxes, labels, masks = zip(*samples)
    batch, sizes = pad_images(images, size_divisibility, buckets)
    most = max(len(b) for b in boxes)
    padded_boxes = torch.zeros(len(samples), most, 4)
    padded_labels = torch.zeros(len(samples), most, dtype=torch.int64)
    for i, (b, l) in enumerate(zip(boxes, labels)):
        padded_boxes[i, :len(b)], padded_labels[i, :len(l)] = b, l
    all_masks = torch.zeros(sum(len(m) for m in masks), *batch.shape[-2:], dtype=torch.uint8)
    start = 0
    for m in masks:
        all_masks[start:start + len(m), :m.shape[-2], :m.shape[-1]] = m
        start += len(m)
    return TrainBatch(batch, sizes, padded_boxes, padded_labels, all_masks)


def collate_eval(samples, size_divisibility: int = SIZE_DIVISIBILITY,
                 buckets: Sequence[int] = ()) -> EvalBatch:
    """Evaluation samples ``(image, image_id, original size)`` -> :class:`EvalBatch`."""
    images, ids, original = zip(*samples)
    batch, sizes = pad_images(images, size_divisibility, buckets)
    return EvalBatch(batch, sizes, torch.tensor(ids, dtype=torch.int64),
                     torch.tensor(original, dtype=torch.int64))


# -- sampling --------------------------------------------------------------------------------
def aspect_groups(records: Sequence[ImageRecord]) -> np.ndarray:
    """Each image's aspect-ratio group (int64 [N]): the number of ``ASPECT_BINS`` at or
    below its height / width (0: wider than high, 1: the others)."""
    ratios = np.array([r.height / r.width for r in records], np.float64)
    return np.searchsorted(np.asarray(ASPECT_BINS), ratios, side="right")


def grouped_batches(indices: np.ndarray, groups: np.ndarray, batch_size: int,
                    drop_last: bool) -> list[list[int]]:
    """``GroupedBatchSampler``: the sample ``indices`` (in sampler order) cut into batches
    of one group each (``groups`` maps a sample index to its group), in sampler order within
    a group; batches ordered by the position of their first sample; with ``drop_last``,
    incomplete batches are dropped."""
    indices = np.asarray(indices, np.int64)
    position = np.arange(len(indices))
    batches = []
    for g in np.unique(groups[indices]):
        mine = groups[indices] == g
        members, first = indices[mine], position[mine]
        for k in range(0, len(members), batch_size):
            if not drop_last or k + batch_size <= len(members):
                batches.append((first[k], members[k:k + batch_size].tolist()))
    return [batch for _, batch in sorted(batches, key=lambda b: b[0])]


def train_steps(n: int, groups: np.ndarray, batch_size: int, world_size: int) -> int:
    """Batches per rank and epoch: a rank's slice of ``n // world_size`` samples, in whole
    batches, less one per group beyond the first (what incomplete group batches can cost)."""
    return n // world_size // batch_size - (len(np.unique(groups)) - 1)


def train_batches(groups: np.ndarray, batch_size: int, rank: int, world_size: int, seed: int,
                  epoch: int) -> list[list[int]]:
    """This rank's batches of a training epoch: its contiguous slice of the epoch's order,
    grouped and batched (``grouped_batches``, incomplete ones dropped), the first
    ``train_steps`` of them."""
    n = len(groups)
    per_rank = n // world_size
    mine = epoch_order(n, seed, epoch)[rank * per_rank:(rank + 1) * per_rank]
    steps = train_steps(n, groups, batch_size, world_size)
    return grouped_batches(mine, groups, batch_size, drop_last=True)[:steps]


def eval_batches(groups: np.ndarray, batch_size: int, rank: int, world_size: int
                 ) -> list[list[int]]:
    """This rank's evaluation batches: every ``world_size``-th image from ``rank``, grouped
    and batched, all kept."""
    return grouped_batches(np.arange(rank, len(groups), world_size), groups, batch_size,
                           drop_last=False)


class Loader(pipeline.Loader):
    """Batches (:class:`TrainBatch` or :class:`EvalBatch`) of one rank, aspect-grouped."""

    def __init__(self, dataset: TrainDataset | EvalDataset, batch_size: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, num_workers: int = 0,
                 device: torch.device | str = "cpu",
                 size_divisibility: int = SIZE_DIVISIBILITY, aspect_grouping: bool = True,
                 buckets: Sequence[int] = ()):
        train = isinstance(dataset, TrainDataset)
        collate = functools.partial(collate_train if train else collate_eval,
                                    size_divisibility=size_divisibility, buckets=tuple(buckets))
        super().__init__(dataset, train, collate, batch_size, rank, world_size, seed,
                         num_workers, device)
        self.groups = (aspect_groups(dataset.records) if aspect_grouping
                       else np.zeros(len(dataset), np.int64))
        if self.train and train_steps(len(dataset), self.groups, batch_size, world_size) < 1:
            raise UserError(f"{len(dataset)} training images cannot fill a batch of "
                            f"{batch_size} on each of {world_size} rank(s) in each aspect "
                            "group; lower the batch size")

    def batches(self, epoch: int) -> list[list[int]]:
        if self.train:
            return train_batches(self.groups, self.batch_size, self.rank, self.world_size,
                                 self.seed, epoch)
        return eval_batches(self.groups, self.batch_size, self.rank, self.world_size)

    def __len__(self) -> int:
        if self.train:
            return train_steps(len(self.dataset), self.groups, self.batch_size,
                               self.world_size)
        return len(self.batches(0))


def build_train_loader(split: CocoSplit, batch_size: int, rank: int = 0, world_size: int = 1,
                       seed: int = 0, num_workers: int = 0, device: torch.device | str = "cpu",
                       min_size: int = MIN_SIZE, max_size: int = MAX_SIZE,
                       size_divisibility: int = SIZE_DIVISIBILITY,
                       aspect_grouping: bool = True, buckets: Sequence[int] = ()) -> Loader:
    """This rank's training batches (:class:`TrainBatch`) of a split from ``load_split``."""
    return Loader(TrainDataset(split, seed, min_size, max_size), batch_size, rank, world_size,
                  seed, num_workers, device, size_divisibility, aspect_grouping, buckets)


def build_eval_loader(split: CocoSplit, batch_size: int, rank: int = 0, world_size: int = 1,
                      num_workers: int = 0, device: torch.device | str = "cpu",
                      min_size: int = MIN_SIZE, max_size: int = MAX_SIZE,
                      size_divisibility: int = SIZE_DIVISIBILITY,
                      aspect_grouping: bool = True, buckets: Sequence[int] = ()) -> Loader:
    """This rank's evaluation batches (:class:`EvalBatch`): every image once over the ranks."""
    return Loader(EvalDataset(split, min_size, max_size), batch_size, rank, world_size, 0,
                  num_workers, device, size_divisibility, aspect_grouping, buckets)


def synthetic_batch(batch_size: int, num_classes: int, min_size: int = MIN_SIZE,
                    max_size: int = MAX_SIZE, objects: int = 4,
                    device: torch.device | str = "cpu",
                    image_size: tuple[int, int] | None = None) -> TrainBatch:
    """A :class:`TrainBatch` of random images at the training size of a 640 x 480 image
    (COCO's commonest) or at ``image_size`` (height, width), each with ``objects`` random
    boxes of labels 1..C-1 and their rectangles as masks, for throughput runs and warm-up
    steps (never for training)."""
    g = torch.Generator().manual_seed(0)
    height, width = image_size or resized_size(640, 480, min_size, max_size)
    samples = []
    for _ in range(batch_size):
        corner = torch.rand(objects, 2, generator=g) * torch.tensor([width, height]) / 2
        side = (torch.rand(objects, 2, generator=g) * 0.4 + 0.1) * torch.tensor([width, height])
        boxes = torch.cat((corner, corner + side), 1).floor()
        masks = torch.zeros(objects, height, width, dtype=torch.uint8)
        for m, (x1, y1, x2, y2) in zip(masks, boxes.long().tolist()):
            m[y1:y2 + 1, x1:x2 + 1] = 1
        labels = torch.randint(1, num_classes, (objects,), generator=g)
        # mid-grey noise: normalised, about unit variance
        image = (128 + 58 * torch.randn(3, height, width, generator=g)).clamp_(0, 255).byte()
        samples.append((image, boxes, labels, masks))
    return collate_train(samples).to(device)
