"""The SSD input pipeline of the MLPerf Training 1.1 reference, on tensors.

Follows mlcommons/training ``single_stage_detector/ssd/utils.py`` as of v1.1 (commit
b06269d9: ``SSDCropping``, ``RandomHorizontalFlip``, ``SSDTransformer``, ``COCODetection``),
rewritten with torch ops on a CHW tensor so that the same code runs on CPU tensors in
DataLoader workers and on GPU tensors after a GPU decode. Randomness comes from a per-sample
``torch.Generator`` (CPU) instead of Python's global ``random``, so a sample's augmentation
is a function of (seed, epoch, index).

Training: ``ssd_crop`` (the IoU-constrained crop), ``hflip`` (p=0.5), resize to 300x300
(bilinear, antialiased like PIL's), colour jitter (brightness 0.125, contrast 0.5,
saturation 0.5, hue 0.05 in a random order, as torchvision's ``ColorJitter``), ImageNet
normalisation; boxes come out ltrb, relative to the image (0..1), padded to ``max_boxes``
with a validity mask so a training step's shapes are static. A sample's random choices
(``augmentation``: crop window, flip, jitter factors and order, and the targets they give)
are drawn apart from the pixel work (``augment_image``), so the device image cache
(``image_cache.py``) applies the same choices to its cached pixels; the colour jitter runs
on batches (``apply_color_jitter``), one image being a batch of one. Evaluation: resize to
300x300, normalise; the image id and the original (height, width) travel with the image.

Deviations from the reference, all below a pixel or outside its behaviour: the crop window
is snapped to the pixel grid first and boxes are clipped and rescaled to that window (the
reference crops the image at ``int(left * W)`` but rescales boxes to the unsnapped window);
colour jitter runs on float pixels (the reference's PIL path rounds to uint8 after each
step); the crop's retry loop gives up after ``MAX_CROP_ROUNDS`` rounds and keeps the image
(the reference loops until it succeeds, which it does with probability 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from common.coco import pipeline
from common.coco.data import CocoSplit, decode_image_chw, imagenet_stats
from common.coco.pipeline import sample_generator
from common.errors import UserError

IMAGE_SIZE = 300
# SSDCropping.sample_options: None keeps the image; otherwise (min IoU, max IoU) that every
# ground truth must satisfy against the crop, (None, None) being a crop without constraint
CROP_OPTIONS = (None, (0.1, None), (0.3, None), (0.5, None), (0.7, None), (0.9, None),
                (None, None))
CROP_SCALE = (0.3, 1.0)        # crop width and height, each a fraction of the image's
CROP_ASPECT = (0.5, 2.0)       # bounds of (crop width fraction) / (crop height fraction)
MAX_SAMPLES = 1                # --num-cropping-iterations default; the 1.1 rules allow 1 or 50
MAX_SAMPLES_ALLOWED = (1, 50)
MAX_CROP_ROUNDS = 1000         # guard against an endless loop; see the module docstring
FLIP_P = 0.5
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0.125, 0.5, 0.5, 0.05
MAX_BOXES = 200                # SSDTransformer's max_num; COCO train2017 has at most ~93
GREY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


# -- randomness (a sample's generator: common.coco.pipeline.sample_generator) ----------------
def _uniform(g: torch.Generator, lo: float = 0.0, hi: float = 1.0) -> float:
    return lo + (hi - lo) * torch.rand((), generator=g).item()


# -- the IoU-constrained crop ------------------------------------------------------------------
def _iou_with(boxes: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """IoU of ltrb ``boxes`` [..., 4] and ``window`` [..., 4] (broadcast) -> [...]."""
    lt = torch.maximum(boxes[..., :2], window[..., :2])
    rb = torch.minimum(boxes[..., 2:], window[..., 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = (boxes[..., 2:] - boxes[..., :2]).prod(-1)
    win_area = (window[..., 2:] - window[..., :2]).prod(-1)
    return inter / (area + win_area - inter)


def crop_window(boxes: torch.Tensor, width: int, height: int, g: torch.Generator,
                max_samples: int = MAX_SAMPLES) -> tuple[int, int, int, int] | None:
    """``SSDCropping``'s choice for an image of ``width`` x ``height`` pixels with ltrb boxes
    relative to it: a pixel window (left, top, right, bottom), or None to keep the image.

    Each round draws one of ``CROP_OPTIONS``; for a constraint, ``max_samples`` windows of
    width and height in ``CROP_SCALE`` (fractions) at a uniform position are drawn at once
    and the first that passes is taken: its width/height ratio within ``CROP_ASPECT``, every
    box's IoU with it strictly within the bounds and at least one box's centre strictly
    inside it (the reference tries them one by one; the tries are independent, so taking
    the first passing one chooses alike). When none passes, the next round draws an option
    again.
    """
    extent = torch.tensor([width, height] * 2, dtype=torch.float64)
    boxes = boxes.double()
    for _ in range(MAX_CROP_ROUNDS):
        mode = CROP_OPTIONS[int(torch.randint(len(CROP_OPTIONS), (), generator=g))]
        if mode is None:
            return None
        min_iou = -math.inf if mode[0] is None else mode[0]
        max_iou = math.inf if mode[1] is None else mode[1]
        u = torch.rand(max_samples, 4, generator=g, dtype=torch.float64)
        wh = CROP_SCALE[0] + (CROP_SCALE[1] - CROP_SCALE[0]) * u[:, :2]
        lt = u[:, 2:] * (1 - wh)
        # the pixel window the image is cut to (the reference truncates the same way)
        px = (torch.cat((lt, lt + wh), 1) * extent).floor()
        window = px / extent
        ratio = wh[:, 0] / wh[:, 1]
        ok = (ratio >= CROP_ASPECT[0]) & (ratio <= CROP_ASPECT[1])
        ok &= (px[:, 2] > px[:, 0]) & (px[:, 3] > px[:, 1])
        ious = _iou_with(boxes[None], window[:, None])                    # [tries, boxes]
        ok &= ((ious > min_iou) & (ious < max_iou)).all(1)
        ok &= _centres_inside(boxes[None], window[:, None]).any(1)
        passed = ok.nonzero()
        if len(passed):
            return tuple(int(v) for v in px[passed[0, 0]].tolist())
    return None


def _centres_inside(boxes: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Whether each ltrb box's centre lies strictly inside ``window`` (broadcast) -> [...]."""
    centre = 0.5 * (boxes[..., :2] + boxes[..., 2:])
    return ((centre > window[..., :2]) & (centre < window[..., 2:])).all(-1)


def crop_boxes(boxes: torch.Tensor, labels: torch.Tensor, width: int, height: int,
               px: tuple[int, int, int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The targets of a ``width`` x ``height`` image cut to the pixel window ``px`` (None:
    unchanged): the boxes whose centre lies strictly inside, clipped to the window and made
    relative to it, and their labels."""
    if px is None:
        return boxes, labels
    l, t, r, b = px
    window = torch.tensor([l / width, t / height, r / width, b / height],
                          dtype=boxes.dtype, device=boxes.device)
    keep = _centres_inside(boxes, window)
    kept = torch.minimum(torch.maximum(boxes[keep], window[:2].repeat(2)), window[2:].repeat(2))
    size = (window[2:] - window[:2]).repeat(2)
    return (kept - window[:2].repeat(2)) / size, labels[keep]


def crop_image(image: torch.Tensor, px: tuple[int, int, int, int] | None) -> torch.Tensor:
    """``image`` [C, H, W] cut to the pixel window ``px`` (None: unchanged)."""
    if px is None:
        return image
    l, t, r, b = px
    return image[..., t:b, l:r]


def apply_crop(image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor,
               px: tuple[int, int, int, int] | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`crop_image` and :func:`crop_boxes`."""
    height, width = image.shape[-2:]
    return crop_image(image, px), *crop_boxes(boxes, labels, width, height, px)


def ssd_crop(image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor,
             g: torch.Generator, max_samples: int = MAX_SAMPLES
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``SSDCropping``: :func:`crop_window` then :func:`apply_crop`."""
    height, width = image.shape[-2:]
    return apply_crop(image, boxes, labels, crop_window(boxes, width, height, g, max_samples))


def flip_boxes(boxes: torch.Tensor) -> torch.Tensor:
    """Relative ltrb boxes mirrored left-right."""
    return torch.stack((1 - boxes[:, 2], boxes[:, 1], 1 - boxes[:, 0], boxes[:, 3]), 1)


def hflip(image: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mirror the image left-right and its relative ltrb boxes with it."""
    return image.flip(-1), flip_boxes(boxes)


# -- resize, colour and normalisation --------------------------------------------------------
def resize(image: torch.Tensor, size: int = IMAGE_SIZE) -> torch.Tensor:
    """uint8 or float [3, H, W] (0..255) -> float [3, size, size] in 0..1, bilinear with
    PIL's antialiasing when shrinking (torchvision's ``Resize`` on a PIL image)."""
    x = image.unsqueeze(0).float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False,
                      antialias=True)
    return (x[0] / 255).clamp_(0, 1)


def _grey(x: torch.Tensor) -> torch.Tensor:
    w = torch.tensor(GREY, dtype=x.dtype, device=x.device).view(3, 1, 1)
    return (x * w).sum(-3, keepdim=True)


def _blend(x: torch.Tensor, other, factor) -> torch.Tensor:
    return (factor * x + (1 - factor) * other).clamp(0, 1)


def _rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(-3)
    maxc, minc = x.max(-3).values, x.min(-3).values
    span = maxc - minc
    flat = span == 0
    s = span / torch.where(maxc == 0, torch.ones_like(maxc), maxc)
    d = torch.where(flat, torch.ones_like(span), span)
    rc, gc, bc = (maxc - r) / d, (maxc - g) / d, (maxc - b) / d
    h = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2 + rc - bc, 4 + gc - rc))
    h = torch.where(flat, torch.zeros_like(h), h)
    return torch.stack(((h / 6).remainder(1), s, maxc), -3)


def _hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    h, s, v = x.split(1, -3)
    n = torch.tensor([5.0, 3.0, 1.0], dtype=x.dtype, device=x.device).view(3, 1, 1)
    k = (n + h * 6).remainder(6)
    return v - v * s * torch.minimum(k, 4 - k).clamp(0, 1)


def adjust_hue(x: torch.Tensor, shift) -> torch.Tensor:
    """Float [..., 3, H, W] in 0..1 with its hue turned by ``shift`` (a float, or a tensor
    that broadcasts, such as [B, 1, 1, 1])."""
    h, sv = _rgb_to_hsv(x).split((1, 2), -3)
    return _hsv_to_rgb(torch.cat(((h + shift).remainder(1), sv), -3))


def jitter_params(g: torch.Generator) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """``ColorJitter(0.125, 0.5, 0.5, 0.05)``'s random choice: the brightness, contrast and
    saturation factors and the hue shift, drawn uniformly, then the order of the four."""
    factors = (_uniform(g, 1 - BRIGHTNESS, 1 + BRIGHTNESS),
               _uniform(g, 1 - CONTRAST, 1 + CONTRAST),
               _uniform(g, 1 - SATURATION, 1 + SATURATION),
               _uniform(g, -HUE, HUE))
    return factors, tuple(torch.randperm(4, generator=g).tolist())


def jitter_op(op: int, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """One colour-jitter op on float [..., 3, H, W] in 0..1: 0 brightness, 1 contrast,
    2 saturation (``factor`` broadcasting, e.g. [B, 1, 1, 1]), 3 hue (``factor`` a shift)."""
    if op == 0:
        return _blend(x, 0.0, factor)
    if op == 1:
        return _blend(x, _grey(x).mean((-3, -2, -1), keepdim=True), factor)
    if op == 2:
        return _blend(x, _grey(x), factor)
    return adjust_hue(x, factor)


def apply_color_jitter(x: torch.Tensor, factors: torch.Tensor, order: torch.Tensor
                       ) -> torch.Tensor:
    """torchvision's ``ColorJitter`` on a batch, float [B, 3, H, W] in 0..1: sample ``b``
    gets op ``order[b, k]`` (0 brightness, 1 contrast, 2 saturation, 3 hue) at step ``k``
    with its factor ``factors[b, op]`` (the hue's is a shift). No loop over samples: at each
    step every op runs once, on the samples that take it there (gathered, then written
    back), so a step costs one op over the batch. ``order`` lives on the CPU, where the
    groups are formed without a device sync."""
    f = factors.to(x.device, x.dtype, non_blocking=True).view(-1, 4, 1, 1, 1)
    if len(x) == 1:                            # the CPU path: no gathering
        for op in order[0].tolist():
            x = jitter_op(op, x, f[:, op])
        return x
    for k in range(4):
        out = torch.empty_like(x)
        for op in range(4):
            rows = (order[:, k] == op).nonzero()[:, 0]
            if len(rows):
                rows = rows.to(x.device, non_blocking=True)
                out.index_copy_(0, rows, jitter_op(op, x.index_select(0, rows),
                                                    f.index_select(0, rows)[:, op]))
        x = out
    return x


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Float 0..1 [..., 3, H, W] -> ImageNet-normalised."""
    mean, std = imagenet_stats(x.device, x.dtype)
    return (x - mean) / std


# -- whole transforms ------------------------------------------------------------------------
@dataclass(frozen=True)
class Augmentation:
    """One training sample's random choices and the targets they give."""
    crop: tuple[int, int, int, int] | None   # pixel window (l, t, r, b); None: whole image
    flip: bool
    factors: tuple[float, ...]               # brightness, contrast, saturation, hue shift
    order: tuple[int, ...]                   # the order of those four (jitter_params)
    boxes: torch.Tensor                      # kept boxes, ltrb relative to the output
    labels: torch.Tensor


def augmentation(boxes: torch.Tensor, labels: torch.Tensor, width: int, height: int,
                 g: torch.Generator, max_samples: int = MAX_SAMPLES) -> Augmentation:
    """``SSDTransformer``'s (training) random choices for a ``width`` x ``height`` image with
    ltrb boxes relative to it, drawn from ``g`` in its order: crop, flip, colour jitter."""
    crop = crop_window(boxes, width, height, g, max_samples)
    boxes, labels = crop_boxes(boxes, labels, width, height, crop)
    flip = _uniform(g) < FLIP_P
    if flip:
        boxes = flip_boxes(boxes)
    return Augmentation(crop, flip, *jitter_params(g), boxes, labels)


def augment_image(image: torch.Tensor, a: Augmentation, size: int = IMAGE_SIZE
                  ) -> torch.Tensor:
    """uint8 [3, H, W] -> float [3, size, size]: crop, flip, resize, colour jitter and
    normalise as ``a`` says."""
    image = crop_image(image, a.crop)
    if a.flip:
        image = image.flip(-1)
    x = apply_color_jitter(resize(image, size)[None], torch.tensor([a.factors]),
                           torch.tensor([a.order]))[0]
    return normalize(x)


def train_transform(image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor,
                    g: torch.Generator, max_samples: int = MAX_SAMPLES, size: int = IMAGE_SIZE
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``SSDTransformer`` (training) on uint8 [3, H, W] with ltrb boxes relative to the
    image: crop, flip, resize, colour jitter, normalise. Returns the float [3, size, size]
    image, the kept boxes (relative to the output, 0..1) and their labels."""
    a = augmentation(boxes, labels, image.shape[-1], image.shape[-2], g, max_samples)
    return augment_image(image, a, size), a.boxes, a.labels


def eval_transform(image: torch.Tensor, size: int = IMAGE_SIZE) -> torch.Tensor:
    """``SSDTransformer`` (validation): resize and normalise."""
    return normalize(resize(image, size))


def pad_targets(boxes: torch.Tensor, labels: torch.Tensor, max_boxes: int, name: str = "image"
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad to ``max_boxes``: (boxes [M, 4] float32, labels [M] int64, valid [M] bool)."""
    n = boxes.shape[0]
    if n > max_boxes:
        raise _too_many(name, n, max_boxes)
    out_boxes = boxes.new_zeros(max_boxes, 4, dtype=torch.float32)
    out_labels = labels.new_zeros(max_boxes, dtype=torch.int64)
    valid = torch.zeros(max_boxes, dtype=torch.bool, device=boxes.device)
    out_boxes[:n], out_labels[:n], valid[:n] = boxes, labels, True
    return out_boxes, out_labels, valid


def _too_many(name: str, n: int, max_boxes: int) -> UserError:
    return UserError(f"{name}: {n} boxes, more than --max-boxes {max_boxes}; raise --max-boxes "
                     f"to at least {n}")


# -- datasets, collation, loaders ------------------------------------------------------------
def relative_boxes(record) -> torch.Tensor:
    """A COCO record's pixel xyxy boxes as ltrb relative to its image."""
    scale = np.array([record.width, record.height] * 2, np.float32)
    return torch.from_numpy(record.boxes / scale)


class TrainDataset(torch.utils.data.Dataset):
    """Decoded, augmented, padded training samples of a COCO split; ``epoch`` is set with
    each batch (``pipeline.EpochBatches``, in the loader process that serves it)."""

    def __init__(self, split: CocoSplit, seed: int, max_boxes: int = MAX_BOXES,
                 max_samples: int = MAX_SAMPLES, size: int = IMAGE_SIZE):
        if max_samples not in MAX_SAMPLES_ALLOWED:
            raise UserError(f"--max-samples {max_samples}: the MLPerf 1.1 rules allow "
                            f"{' or '.join(map(str, MAX_SAMPLES_ALLOWED))}")
        for r in split.records:
            if len(r.boxes) > max_boxes:
                raise _too_many(r.path, len(r.boxes), max_boxes)
        self.records, self.seed, self.max_boxes = split.records, seed, max_boxes
        self.max_samples, self.size, self.epoch = max_samples, size, 0

    def __len__(self):
        return len(self.records)

    def plan(self, i: int) -> tuple[Augmentation, tuple[torch.Tensor, ...]]:
        """Sample ``i``'s augmentation in this epoch and its padded targets."""
        r = self.records[i]
        a = augmentation(relative_boxes(r), torch.from_numpy(r.labels), r.width, r.height,
                         sample_generator(self.seed, self.epoch, i), self.max_samples)
        return a, pad_targets(a.boxes, a.labels, self.max_boxes, r.path)

    def __getitem__(self, i):
        r = self.records[i]
        a, targets = self.plan(i)
        image = augment_image(decode_image_chw(r.path, (r.width, r.height)), a, self.size)
        return (image, *targets)


class EvalDataset(torch.utils.data.Dataset):
    """Decoded, resized, normalised evaluation images with their ids and (height, width)."""

    def __init__(self, split: CocoSplit, size: int = IMAGE_SIZE):
        self.records, self.size = split.records, size

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        r = self.records[i]
        image = eval_transform(decode_image_chw(r.path, (r.width, r.height)), self.size)
        return image, r.image_id, (r.height, r.width)


def collate_train(samples) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> images [B, 3, S, S] float, boxes [B, M, 4], labels [B, M], valid [B, M]."""
    return tuple(torch.stack(t) for t in zip(*samples))


def collate_eval(samples) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> images [B, 3, S, S] float, image_ids [B] int64, sizes [B, 2] int64 (height, width)."""
    images, ids, sizes = zip(*samples)
    return (torch.stack(images), torch.tensor(ids, dtype=torch.int64),
            torch.tensor(sizes, dtype=torch.int64))


def train_batches(n: int, batch_size: int, rank: int, world_size: int, seed: int, epoch: int
                  ) -> list[list[int]]:
    """This rank's batches of a training epoch: global batch ``s`` is positions
    ``[s * G, (s + 1) * G)`` of the epoch's order (G = batch_size * world_size), and rank
    ``r`` takes its slice ``[r * batch_size, (r + 1) * batch_size)``; the last incomplete
    global batch is dropped."""
    order, g = pipeline.epoch_order(n, seed, epoch), batch_size * world_size
    return [order[s * g + rank * batch_size:s * g + (rank + 1) * batch_size]
            for s in range(n // g)]


def eval_batches(n: int, batch_size: int, rank: int, world_size: int) -> list[list[int]]:
    """This rank's evaluation batches: every ``world_size``-th image from ``rank``, all kept."""
    mine = list(range(rank, n, world_size))
    return [mine[i:i + batch_size] for i in range(0, len(mine), batch_size)]


class Loader(pipeline.Loader):
    """Batches of one rank (``train``: :func:`train_batches`, else :func:`eval_batches`)."""

    def __init__(self, dataset, train: bool, batch_size: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, num_workers: int = 0,
                 device: torch.device | str = "cpu"):
        super().__init__(dataset, train, collate_train if train else collate_eval, batch_size,
                         rank, world_size, seed, num_workers, device)
        if train and len(dataset) < batch_size * world_size:
            raise UserError(f"{len(dataset)} training images cannot fill one global batch of "
                            f"{batch_size * world_size}; lower the batch size")

    def batches(self, epoch: int) -> list[list[int]]:
        n = len(self.dataset)
        if self.train:
            return train_batches(n, self.batch_size, self.rank, self.world_size, self.seed,
                                 epoch)
        return eval_batches(n, self.batch_size, self.rank, self.world_size)


def build_train_loader(split: CocoSplit, batch_size: int, rank: int = 0, world_size: int = 1,
                       seed: int = 0, num_workers: int = 0, device: torch.device | str = "cpu",
                       max_boxes: int = MAX_BOXES, max_samples: int = MAX_SAMPLES) -> Loader:
    """Training batches (images, boxes, labels, valid) of this rank."""
    return Loader(TrainDataset(split, seed, max_boxes, max_samples), True, batch_size, rank,
                  world_size, seed, num_workers, device)


def build_eval_loader(split: CocoSplit, batch_size: int, rank: int = 0, world_size: int = 1,
                      num_workers: int = 0, device: torch.device | str = "cpu") -> Loader:
    """Evaluation batches (images, image_ids, sizes) of this rank; all images, none twice."""
    return Loader(EvalDataset(split), False, batch_size, rank, world_size, 0, num_workers,
                  device)


def synthetic_batch(batch_size: int, num_classes: int, device: torch.device | str,
                    max_boxes: int = MAX_BOXES, boxes_per_image: int = 4,
                    size: int = IMAGE_SIZE, seed: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A device-resident random training batch in the loader's format, for throughput runs:
    ``boxes_per_image`` random boxes per image (labels 1..num_classes-1, the background
    counted in ``num_classes``), padded to ``max_boxes``."""
    if boxes_per_image > max_boxes:
        raise UserError(f"{boxes_per_image} synthetic boxes per image exceed --max-boxes "
                        f"{max_boxes}")
    g = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(batch_size, 3, size, size, device=device, generator=g)
    k = boxes_per_image
    lt = torch.rand(batch_size, k, 2, device=device, generator=g) * 0.7
    wh = 0.05 + torch.rand(batch_size, k, 2, device=device, generator=g) * 0.25
    boxes = torch.zeros(batch_size, max_boxes, 4, device=device)
    boxes[:, :k] = torch.cat((lt, lt + wh), -1)
    labels = torch.zeros(batch_size, max_boxes, dtype=torch.int64, device=device)
    labels[:, :k] = torch.randint(1, num_classes, (batch_size, k), device=device, generator=g)
    valid = torch.zeros(batch_size, max_boxes, dtype=torch.bool, device=device)
    valid[:, :k] = True
    return images, boxes, labels, valid
