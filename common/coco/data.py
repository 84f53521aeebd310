"""COCO 2017 reader shared by SSD and Mask R-CNN: a compact, validated index of images and targets.

Layout, as unzipped from cocodataset.org: ``ROOT/annotations/instances_{train,val}2017.json``
and ``ROOT/{train,val}2017/<file_name>.jpg``. The index follows the MLPerf Training 1.1
references (SSD ``COCODetection``, Mask R-CNN ``COCODataset``):

- labels: the file's category ids in ascending order become 1..C, 0 is the background
  (both references number categories in file order, which is id order in COCO);
  ``Categories`` keeps the mapping both ways so evaluation can map labels back;
- boxes: COCO's ``[x, y, w, h]`` become float32 ``[x1, y1, x2, y2]`` pixels with
  ``x2 = x + w`` (the SSD reference's convention; evaluation converts back with
  ``w = x2 - x1``);
- images without any annotation are dropped from training, as both references do
  (117266 of train2017's 118287 images remain); validation keeps all 5000 (the SSD
  reference drops val2017's 48 empty images too, which changes no COCO metric: an image
  with neither ground truth nor detections does not count);
- crowd annotations: the SSD reference keeps them as ordinary targets, the Mask R-CNN
  reference drops them; ``keep_crowd`` chooses, and ``ImageRecord.iscrowd`` flags them;
- boxes with zero width or height (train2017 has two) are dropped from the targets, as
  Mask R-CNN's ``clip_to_image(remove_empty=True)`` does; boxes up to ``BOX_TOLERANCE``
  pixels outside their image are clipped to it.

Everything else that would make wrong targets stops the load with a one-line
``UserError`` naming the file: a missing, unreadable, empty or invalid annotation file (no
images or no annotations count as empty), an image or annotation entry lacking a field (named
by its position), images missing from the image folder, an annotation of an unknown image or
category, an image whose width or height is not a whole number of pixels, 1 or more, a box
with negative or non-finite size or more than ``BOX_TOLERANCE`` outside its image, a split in
which no box is a target (all of zero size, or crowd ones dropped), and a train file whose
category list differs from val's in any way, order included (labels are numbered from the
train file and scored against the val file). With ``masks=True`` the
segmentation of every target is checked too: a list of polygons (each an even number, at
least 6, of finite coordinates: 3 points enclose an area, and pycocotools would read 4
numbers as a box) or an RLE dict (``counts``, ``size`` = the image's [height, width]) whose
run lengths are non-negative and cover the image exactly; anything else, a polygon of fewer
than 3 points included, is an error. An image that cannot be decoded is named when it is
read. As in the references, EXIF orientation is ignored.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from pycocotools import mask as mask_utils

from common import fixture_cache, loaders
from common.errors import UserError

SPLITS = ("train", "val")
BOX_TOLERANCE = 1.0  # pixels; polygon-derived boxes may overshoot their image by rounding
COCO_TRAIN_IMAGES, COCO_EVAL_IMAGES = 117_266, 5_000   # train2017 with a target; val2017
STANDIN_KIND = "coco-standin"   # the marker of common.coco.standin's folders
MEAN = (0.485, 0.456, 0.406)    # torchvision's ImageNet statistics, RGB in 0..1 (both
STD = (0.229, 0.224, 0.225)     # workloads' backbones start from torchvision's weights)


@functools.cache
def imagenet_stats(device: torch.device, dtype: torch.dtype = torch.float32
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``MEAN`` and ``STD`` as [3, 1, 1] tensors of ``dtype`` on ``device``, made once (not a
    host-to-device copy each batch)."""
    return (torch.tensor(MEAN, dtype=dtype, device=device).view(3, 1, 1),
            torch.tensor(STD, dtype=dtype, device=device).view(3, 1, 1))


def describe(root, n_train: int, n_val: int) -> str:
    """What a COCO-format folder holding ``n_train`` / ``n_val`` images is, for the log:
    the fixture, COCO 2017 itself, or another folder."""
    record = fixture_cache.recorded(Path(root))
    if fixture_cache.kind(root) == STANDIN_KIND:
        return (f"stand-in: COCO-scale synthetic images from common.coco.standin, not COCO "
                f"({n_train} train / {n_val} eval images)")
    if record is not None:
        return (f"fixture: synthetic COCO-format images from common.coco.fixture, not "
                f"COCO ({n_train} train / {n_val} eval images)")
    if (n_train, n_val) == (COCO_TRAIN_IMAGES, COCO_EVAL_IMAGES):
        return "coco 2017"
    return f"COCO-format folder {root} ({n_train} train / {n_val} eval images)"


def annotation_file(root, split: str) -> Path:
    return Path(root) / "annotations" / f"instances_{split}2017.json"


def image_dir(root, split: str) -> Path:
    return Path(root) / f"{split}2017"


@dataclass(frozen=True)
class Categories:
    """COCO category ids <-> contiguous labels 1..C (label ``i`` is ``ids[i - 1]``)."""
    ids: tuple[int, ...]
    names: tuple[str, ...]

    @classmethod
    def from_json(cls, categories: list[dict], source) -> Categories:
        ordered = sorted(categories, key=lambda c: c["id"])
        ids = tuple(int(c["id"]) for c in ordered)
        if len(set(ids)) != len(ids) or not ids:
            raise UserError(f"{source}: category ids are empty or repeated; "
                            "not a COCO instances file")
        return cls(ids, tuple(c["name"] for c in ordered))

    @property
    def num_classes(self) -> int:
        """C, the background not counted."""
        return len(self.ids)

    def labels(self, category_ids) -> np.ndarray:
        """Contiguous labels (int64) of COCO category ids; -1 for an unknown id."""
        ids, wanted = np.asarray(self.ids, np.int64), np.asarray(category_ids, np.int64)
        pos = np.searchsorted(ids, wanted).clip(max=len(ids) - 1)
        return np.where(ids[pos] == wanted, pos + 1, -1)

    def category_ids(self, labels) -> np.ndarray:
        """COCO category ids (int64) of contiguous labels 1..C."""
        labels = np.asarray(labels, np.int64)
        if labels.size and (labels.min() < 1 or labels.max() > len(self.ids)):
            raise ValueError(f"labels must lie in 1..{len(self.ids)}, got "
                             f"{labels.min()}..{labels.max()}")
        return np.asarray(self.ids, np.int64)[labels - 1]


@dataclass(frozen=True, slots=True)
class ImageRecord:
    """One image and its targets (in annotation-file order)."""
    image_id: int
    path: str
    width: int
    height: int
    boxes: np.ndarray              # float32 [N, 4] xyxy pixels
    labels: np.ndarray             # int64 [N] in 1..C
    iscrowd: np.ndarray            # bool [N]
    segmentations: tuple | None    # per box: polygons (float32 arrays) or an RLE dict; None
                                   # unless loaded with masks=True


@dataclass
class CocoSplit:
    """One split's index: its files, its categories and its images sorted by id."""
    split: str
    annotation_file: Path
    image_dir: Path
    categories: Categories
    records: list[ImageRecord]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> ImageRecord:
        return self.records[i]


def _read_json(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"{path}: missing; unzip annotations_trainval2017.zip into "
                        f"{path.parent.parent} (ROOT/annotations/instances_*2017.json)") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror}); make it and "
                        f"{path.parent} readable (chmod u+rx {path.parent}; chmod u+r "
                        f"{path})") from None
    if not raw:
        raise UserError(f"{path}: empty file (0 bytes); re-extract annotations_trainval2017.zip")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); re-extract "
                        "annotations_trainval2017.zip") from None
    missing = [k for k in ("images", "annotations", "categories")
               if not isinstance(data, dict) or not isinstance(data.get(k), list)]
    if missing:
        raise UserError(f"{path}: no '{missing[0]}' list; not a COCO instances file")
    empty = [k for k in ("images", "annotations") if not data[k]]
    if empty:
        raise UserError(f"{path}: its '{empty[0]}' list is empty; use a COCO instances file "
                        "with annotated images")
    return data


def _segmentation(segmentation, height: int, width: int):
    """``segmentation`` parsed (polygons as float32 arrays, or the RLE dict) and None, or
    None and what is wrong with it."""
    if isinstance(segmentation, list) and segmentation:
        polygons = []
        for p in segmentation:
            try:
                # float32 keeps COCO's two decimals and halves train2017's polygon memory
                polygon = np.asarray(p, np.float32) if isinstance(p, list) else None
            except (TypeError, ValueError):
                polygon = None
            if polygon is None or polygon.ndim != 1:
                return None, ("has a segmentation in an unknown format (a polygon that is "
                              "not a list of numbers)")
            if len(polygon) % 2 or len(polygon) < 6:
                return None, (f"has a polygon of {len(polygon)} coordinates; a polygon needs "
                              "an even number, at least 6 (3 points)")
            if not np.isfinite(polygon).all():
                return None, "has a polygon with non-finite coordinates"
            polygons.append(polygon)
        return polygons, None
    if isinstance(segmentation, dict) and isinstance(segmentation.get("counts"), (str, list)):
        size = segmentation.get("size")
        if size != [height, width]:
            return None, (f"has an RLE of size {size}, not its image's [height, width] "
                          f"[{height}, {width}]")
        counts = segmentation["counts"]
        runs = _rle_string_runs(counts) if isinstance(counts, str) else counts
        if (runs is None or not all(type(n) is int and n >= 0 for n in runs)
                or sum(runs) != height * width):
            return None, (f"has an RLE whose counts are not non-negative run lengths adding "
                          f"up to its {width}x{height} image")
        return segmentation, None
    return None, ("has a segmentation in an unknown format (neither a non-empty list of "
                  "polygons nor an RLE dict with 'counts' and 'size')")


def _rle_string_runs(counts: str) -> list[int] | None:
    """The run lengths of a compressed RLE string, decoded as pycocotools' ``rleFrString``
    does (5 bits a character, offset by 48; runs after the second relative to the run two
    back), or None when a character is out of range or the string ends inside a number
    (pycocotools would read past its end)."""
    runs, x, k = [], 0, 0
    for ch in counts:
        c = ord(ch) - 48
        if not 0 <= c < 64:
            return None
        x |= (c & 0x1F) << (5 * k)
        k += 1
        if c & 0x20:  # more characters of this number follow
            continue
        if c & 0x10:  # negative: sign-extend
            x -= 1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
        x, k = 0, 0
    return runs if k == 0 else None


def load_split(root, split: str, *, masks: bool = False, keep_crowd: bool = True,
               drop_empty: bool | None = None) -> CocoSplit:
    """Index ``split`` ("train" or "val") of the COCO 2017 dataset at ``root``.

    ``masks``: keep each box's segmentation (for ``decode_masks``); ``keep_crowd``: keep
    iscrowd annotations as targets (SSD) or drop them (Mask R-CNN); ``drop_empty``: drop
    images without annotations (default: for "train" only). Records are sorted by image id.
    """
    if split not in SPLITS:
        raise UserError(f"unknown COCO split {split!r}; choose one of {', '.join(SPLITS)}")
    ann_path, img_dir = annotation_file(root, split), image_dir(root, split)
    data = _read_json(ann_path)
    anns = data["annotations"]
    try:
        categories = Categories.from_json(data["categories"], ann_path)
        images = sorted(data["images"], key=lambda im: im["id"])
        image_ids = np.array([im["id"] for im in images], np.int64)
        sizes = np.array([(im["width"], im["height"]) for im in images],
                         np.float64).reshape(len(images), 2)
        if not all(isinstance(im["file_name"], str) for im in images):
            raise TypeError("file_name")
        ann_image = np.array([a["image_id"] for a in anns], np.int64)
        ann_category = np.array([a["category_id"] for a in anns], np.int64)
        xywh = np.array([a["bbox"] for a in anns], np.float64).reshape(len(anns), 4)
        crowd = np.array([a.get("iscrowd", 0) for a in anns], bool)
    except (KeyError, TypeError, ValueError) as exc:
        raise _malformed(ann_path, data, exc) from None
    unsized = ~(np.isfinite(sizes) & (sizes >= 1) & (sizes == np.round(sizes))).all(1)
    if unsized.any():
        im = images[int(np.flatnonzero(unsized)[0])]
        raise UserError(f"{ann_path}: image {im['id']} ({im['file_name']}) is {im['width']}x"
                        f"{im['height']}; an image's width and height are whole numbers of "
                        f"pixels, 1 or more ({int(unsized.sum())} image(s) like this): fix or "
                        "remove them")
    if split == "train":
        _check_same_categories(ann_path, data["categories"], annotation_file(root, "val"))

    if not img_dir.is_dir():
        raise UserError(f"{img_dir}: missing; unzip {split}2017.zip into {Path(root)}")
    try:
        present = set(os.listdir(img_dir))
    except OSError as exc:
        raise UserError(f"{img_dir}: cannot be listed ({exc.strerror}); make it readable "
                        f"(chmod u+rx {img_dir})") from None
    absent = [im["file_name"] for im in images if im["file_name"] not in present]
    if absent:
        raise UserError(f"{ann_path}: {len(absent)} of its {len(images)} images are missing "
                        f"from {img_dir} (e.g. {absent[0]}); unzip {split}2017.zip there or "
                        "use the annotation file that matches these images")

    def bad(mask, what):
        j = int(np.flatnonzero(mask)[0])
        raise UserError(f"{ann_path}: annotation {anns[j].get('id')} (image "
                        f"{anns[j]['image_id']}) {what(j)} ({int(mask.sum())} annotation(s) like "
                        "this); fix or remove them")

    if len(np.unique(image_ids)) != len(image_ids):
        raise UserError(f"{ann_path}: repeated image ids; not a COCO instances file")
    known = np.isin(ann_image, image_ids)
    if not known.all():
        bad(~known, lambda j: "refers to an image_id not in the file's images")
    labels = categories.labels(ann_category)
    if (labels < 0).any():
        bad(labels < 0, lambda j: f"has category_id {ann_category[j]}, not in the file's "
                                  "categories")
    broken = ~np.isfinite(xywh).all(1) | (xywh[:, 2:] < 0).any(1)
    if broken.any():
        bad(broken, lambda j: f"has box xywh {anns[j]['bbox']} with a negative or "
                              "non-finite width/height")
    pos = np.searchsorted(image_ids, ann_image)
    wh = sizes[pos]
    xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1)
    outside = ((xyxy[:, :2] < -BOX_TOLERANCE) | (xyxy[:, 2:] > wh + BOX_TOLERANCE)).any(1)
    if outside.any():
        bad(outside, lambda j: f"has box xywh {anns[j]['bbox']} outside its "
                               f"{int(wh[j, 0])}x{int(wh[j, 1])} image")
    xyxy = np.clip(xyxy, 0, np.tile(wh, 2)).astype(np.float32)

    keep = (xyxy[:, 2:] > xyxy[:, :2]).all(1) & (keep_crowd | ~crowd)
    if not keep.any():
        raise UserError(f"{ann_path}: none of its {len(anns)} boxes is a target (every box has "
                        f"zero width or height{'' if keep_crowd else ' or is a crowd box'}); "
                        "nothing to train or score on: use an annotation file with real boxes")
    has_annotation = np.bincount(pos, minlength=len(images)) > 0
    order = np.argsort(pos, kind="stable")
    order = order[keep[order]]
    starts = np.searchsorted(pos[order], np.arange(len(images) + 1))
    if drop_empty is None:
        drop_empty = split == "train"
    segmentations = _target_segmentations(anns, order, wh, ann_path) if masks else None
    records = []
    for i, im in enumerate(images):
        if drop_empty and not has_annotation[i]:
            continue
        idx = order[starts[i]:starts[i + 1]]
        segs = tuple(segmentations[j] for j in idx) if masks else None
        records.append(ImageRecord(int(im["id"]), str(img_dir / im["file_name"]),
                                   int(im["width"]), int(im["height"]), xyxy[idx],
                                   labels[idx], crowd[idx], segs))
    return CocoSplit(split, ann_path, img_dir, categories, records)


IMAGE_FIELDS = {"id": (np.int64, ()), "file_name": str, "width": (np.float64, ()),
                "height": (np.float64, ())}
ANNOTATION_FIELDS = {"image_id": (np.int64, ()), "category_id": (np.int64, ()),
                     "bbox": (np.float64, (4,))}
CATEGORY_FIELDS = {"id": (np.int64, ()), "name": str}


def _fits(value, kind) -> bool:
    """Whether ``value`` reads as ``kind``: a non-empty str, or numbers of (dtype, shape)."""
    if kind is str:
        return isinstance(value, str) and bool(value)
    try:
        return np.asarray(value, kind[0]).shape == kind[1]
    except (TypeError, ValueError, OverflowError):
        return False


def _malformed(ann_path: Path, data: dict, exc: Exception) -> UserError:
    """The error naming the first category, image or annotation entry that lacks a field or
    holds one that is not what COCO puts there; ``exc`` (what the bulk read raised) when none
    does."""
    for what, entries, fields in (("category", data["categories"], CATEGORY_FIELDS),
                                  ("image", data["images"], IMAGE_FIELDS),
                                  ("annotation", data["annotations"], ANNOTATION_FIELDS)):
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                problem = f"is {type(entry).__name__}, not an object"
            else:
                key = next((k for k in fields if k not in entry), None)
                if key is None:
                    key = next((k for k, kind in fields.items() if not _fits(entry[k], kind)),
                               None)
                    if key is None:
                        continue
                    problem = f"has {key} {entry[key]!r}"
                else:
                    problem = f"has no '{key}'"
                problem += f" (id {entry.get('id')})"
            return UserError(f"{ann_path}: {what} entry {i} {problem}; a COCO {what} has "
                             f"{', '.join(fields)}: fix or remove it")
    return UserError(f"{ann_path}: malformed image or annotation entry ({exc!r}); not a COCO "
                     "instances file")


def _check_same_categories(train_path: Path, categories: list, val_path: Path) -> None:
    """Train labels are numbered from the train file's categories and scored against the val
    file's: the two lists must be equal, order included (checked when val exists)."""
    if not val_path.is_file():
        return
    other = _read_json(val_path)["categories"]
    if other == categories:
        return
    i = next((i for i, (a, b) in enumerate(zip(categories, other)) if a != b),
             min(len(categories), len(other)))
    here = categories[i] if i < len(categories) else "nothing"
    there = other[i] if i < len(other) else "nothing"
    raise UserError(f"{train_path}: its categories differ from {val_path}'s (entry {i}: {here} "
                    f"here, {there} there; {len(categories)} vs {len(other)} categories); use "
                    "the train and val annotation files of one dataset")


def _target_segmentations(anns: list, targets: np.ndarray, wh: np.ndarray, ann_path: Path
                          ) -> dict:
    """Annotation index -> parsed segmentation, for the annotations that are ``targets``;
    the first bad one stops the load (annotations that are no targets are not checked)."""
    parsed, problems = {}, []
    for j in targets.tolist():
        seg, problem = _segmentation(anns[j].get("segmentation"), int(wh[j, 1]), int(wh[j, 0]))
        if problem:
            problems.append((j, problem))
        parsed[j] = seg
    if problems:
        j, problem = problems[0]
        raise UserError(f"{ann_path}: annotation {anns[j].get('id')} (image "
                        f"{anns[j]['image_id']}) {problem} ({len(problems)} annotation(s) with "
                        "a bad segmentation); fix or remove them")
    return parsed


def segmentation_rle(segmentation, height: int, width: int) -> dict:
    """One instance's segmentation (polygons of at least 3 points, or an RLE) as one RLE
    of a ``height`` x ``width`` image."""
    if isinstance(segmentation, list):
        return mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    if isinstance(segmentation["counts"], list):
        return mask_utils.frPyObjects(segmentation, height, width)
    return segmentation


def decode_masks(record: ImageRecord) -> np.ndarray:
    """The record's instance masks as uint8 [N, H, W] (pycocotools' rasterisation)."""
    if record.segmentations is None:
        raise ValueError("the split was loaded without masks; use load_split(..., masks=True)")
    h, w = record.height, record.width
    if not record.segmentations:
        return np.zeros((0, h, w), np.uint8)
    rles = [segmentation_rle(seg, h, w) for seg in record.segmentations]
    return np.ascontiguousarray(mask_utils.decode(rles).transpose(2, 0, 1))


def decode_image(path, size: tuple[int, int] | None = None) -> np.ndarray:
    """The image as uint8 [H, W, 3] RGB (greyscale and CMYK converted); ``size``: the
    expected (width, height) from the annotation file."""
    try:
        with Image.open(path) as im:
            rgb = np.array(im.convert("RGB"))  # writable, for torch
    except (OSError, SyntaxError, ValueError) as exc:
        raise UserError(f"{path}: cannot decode image ({exc}); remove or re-extract this "
                        "file") from None
    if size is not None and (rgb.shape[1], rgb.shape[0]) != tuple(size):
        raise UserError(f"{path}: image is {rgb.shape[1]}x{rgb.shape[0]}, the annotation file "
                        f"says {size[0]}x{size[1]}; use the images that match the annotations")
    return rgb


def decode_image_chw(path, size: tuple[int, int] | None = None) -> torch.Tensor:
    """``decode_image`` as a uint8 [3, H, W] tensor."""
    return torch.from_numpy(decode_image(path, size)).permute(2, 0, 1).contiguous()


def batch_loader(dataset, batches: list[list[int]], collate, num_workers: int,
                 device: torch.device) -> torch.utils.data.DataLoader:
    """The DataLoader of ``dataset``'s ``batches`` (lists of indices) collated by
    ``collate`` in ``num_workers`` processes, 4 batches ahead each, pinned for a CUDA
    ``device``; a stop signal ends those processes quietly (``loaders.quiet_on_stop``)."""
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=batches, num_workers=num_workers, collate_fn=collate,
        pin_memory=device.type == "cuda", prefetch_factor=4 if num_workers else None,
        worker_init_fn=loaders.quiet_on_stop)


@dataclass
class Epoch:
    """One pass of a loader (anything with ``batches(epoch)`` and ``iterate(epoch)``): sized
    and iterable. SSD's and Mask R-CNN's loaders return it from ``epoch(e)``."""
    loader: Any
    epoch: int

    def __len__(self) -> int:
        return len(self.loader.batches(self.epoch))

    def __iter__(self):
        return self.loader.iterate(self.epoch)
