"""COCO scoring of detections and instance masks, as the MLPerf SSD and Mask R-CNN references do.

Detections in original-image pixels (xyxy boxes, contiguous labels, RLE masks) become COCO
results (xywh boxes, ``w = x2 - x1`` as SSD's reference converts them, or ``w = x2 - x1 + 1``
for Mask R-CNN's inclusive-pixel boxes, ``ScoreRequest.inclusive_boxes``; category ids by the
reader's ``Categories`` of the annotation file) and are scored by ``COCOeval`` of
pycocotools (the references' evaluator) or by faster-coco-eval's ``COCOeval_faster`` (C++
matching and accumulation, mask IoUs on threads; the same statistics). Box and mask results
are loaded separately, as Mask R-CNN's reference does, so a mask's area, not its box's,
decides its size range.

``score`` is the module-level entry point for ``common.scoring.BackgroundScorer``: it takes
one picklable ``ScoreRequest`` and loads the ground truth itself, in whatever process runs it.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

import numpy as np
from faster_coco_eval import COCO as FastCOCO
from faster_coco_eval import COCOeval_faster
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from common.coco.data import Categories

IOU_TYPES = ("bbox", "segm")
BACKENDS = ("pycocotools", "faster-coco-eval")
# names of COCOeval.stats, in its order; "map" (AP at IoU .50:.95) is MLPerf's metric
STATS = ("map", "map50", "map75", "map_small", "map_medium", "map_large",
         "mar1", "mar10", "mar100", "mar_small", "mar_medium", "mar_large")


@dataclass
class Detections:
    """One image's detections: ``boxes`` [N, 4] xyxy in original-image pixels, ``scores``
    [N], ``labels`` [N] contiguous 1..C, ``masks`` N RLEs from ``encode_masks`` (for segm)."""
    image_id: int
    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    masks: list[dict] | None = None


def encode_masks(masks: np.ndarray) -> list[dict]:
    """Binary masks [N, H, W] at original-image size as compressed RLEs: a few hundred bytes
    each, cheap to send to the scoring process."""
    masks = np.asarray(masks, np.uint8)
    rles = mask_utils.encode(np.asfortranarray(masks.transpose(1, 2, 0)))
    for rle in rles:
        rle["counts"] = rle["counts"].decode("ascii")  # str, as in COCO's result files
    return rles


@dataclass(frozen=True)
class ScoreRequest:
    """Everything ``score`` needs, picklable: the ground-truth file and the detections."""
    annotation_file: str
    detections: list[Detections]
    iou_types: tuple[str, ...] = ("bbox",)
    backend: str = "pycocotools"
    inclusive_boxes: bool = False   # x2, y2 are the last pixels inside: w = x2 - x1 + 1


def _results(detections: list[Detections], categories: Categories, iou_type: str,
             inclusive_boxes: bool = False) -> list:
    results = []
    for d in detections:
        image_id = int(d.image_id)
        category_ids = categories.category_ids(d.labels).tolist()
        scores = np.asarray(d.scores, np.float64).tolist()
        if iou_type == "bbox":
            b = np.asarray(d.boxes, np.float64).reshape(-1, 4)
            sides = b[:, 2:] - b[:, :2] + (1 if inclusive_boxes else 0)
            shapes = np.concatenate([b[:, :2], sides], 1).tolist()
        elif d.masks is None or len(d.masks) != len(scores):
            raise ValueError(f"image {image_id}: segm scoring needs one RLE per detection "
                             "(encode_masks)")
        else:
            shapes = d.masks
        key = "bbox" if iou_type == "bbox" else "segmentation"
        results += [{"image_id": image_id, "category_id": c, key: shape, "score": s}
                    for c, shape, s in zip(category_ids, shapes, scores, strict=True)]
    return results


def _load_results(gt, results: list):
    if results:
        return gt.loadRes(results)
    # no detections at all: pycocotools' loadRes cannot take an empty list; AP is then 0
    dt = type(gt)()
    dt.dataset = {"images": gt.dataset["images"], "categories": gt.dataset["categories"],
                  "annotations": []}
    dt.createIndex()
    return dt


def _discard(*args, **kwargs) -> None:
    pass


def score(request: ScoreRequest) -> dict[str, float]:
    """COCO statistics of the request's detections, named ``<iou type>_<STATS name>``, e.g.
    ``{"bbox_map": ..., "segm_map": ...}``; -1 where no ground truth falls in a size range
    (as COCOeval reports it). Prints nothing."""
    if request.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {request.backend!r}")
    unknown = set(request.iou_types) - set(IOU_TYPES)
    if unknown:
        raise ValueError(f"iou_types must be among {IOU_TYPES}, not {sorted(unknown)}")
    fast = request.backend == "faster-coco-eval"
    metrics = {}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints every step
        gt = (FastCOCO if fast else COCO)(str(request.annotation_file))
        categories = Categories.from_json(gt.dataset["categories"], request.annotation_file)
        for iou_type in request.iou_types:
            dt = _load_results(gt, _results(request.detections, categories, iou_type,
                                            request.inclusive_boxes))
            if fast:
                evaluator = COCOeval_faster(gt, dt, iou_type, print_function=_discard)
            else:
                evaluator = COCOeval(gt, dt, iou_type)
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
            metrics.update({f"{iou_type}_{name}": float(v)
                            for name, v in zip(STATS, evaluator.stats)})
    return metrics
