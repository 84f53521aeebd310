"""COCO scoring: ground truth scores 1, the backends agree, the scorer runs when spawned."""

import multiprocessing

import numpy as np
import pytest

from common.coco import data, evaluation
from common.coco.evaluation import BACKENDS, Detections, ScoreRequest, encode_masks, score

BOTH = ("bbox", "segm")


# pycocotools 2.0.11 decodes masks with numpy 1 semantics; harmless under numpy 2
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")


@pytest.fixture(scope="module")
def val(coco_root):
    return data.load_split(coco_root, "val", masks=True)


def _ground_truth(val):
    return [Detections(r.image_id, r.boxes, np.ones(len(r.labels)), r.labels,
                       encode_masks(data.decode_masks(r))) for r in val]


def _perturbed(val, seed=0):
    """Jittered boxes and masks with random scores and labels, plus false positives."""
    rng = np.random.default_rng(seed)
    out = []
    for r in val:
        n_false = int(rng.integers(0, 3))
        jitter = rng.normal(0, 3, (len(r.labels), 4)).astype(np.float32)
        false = rng.uniform(0, 0.5, (n_false, 2)) * (r.width, r.height)
        false = np.concatenate([false, false + rng.uniform(10, 50, (n_false, 2))], 1)
        boxes = np.concatenate([r.boxes + jitter, false]).clip(0, (r.width, r.height) * 2)
        labels = np.concatenate([r.labels, rng.integers(1, 6, n_false)])
        swap = rng.random(len(labels)) < 0.1
        labels[swap] = rng.integers(1, 6, int(swap.sum()))
        masks = np.zeros((len(labels), r.height, r.width), np.uint8)
        for m, (x0, y0, x1, y1) in zip(masks, boxes.round().astype(int)):
            m[y0:y1, x0:x1] = 1  # box-shaped masks: wrong where the shape is not a box
        out.append(Detections(r.image_id, boxes, rng.random(len(labels)), labels,
                              encode_masks(masks)))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_ground_truth_as_detections_scores_one(val, backend, capsys):
    metrics = score(ScoreRequest(str(val.annotation_file), _ground_truth(val), BOTH, backend))
    assert metrics["bbox_map"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["segm_map"] == pytest.approx(1.0, abs=1e-6)
    assert set(metrics) == {f"{t}_{s}" for t in BOTH for s in evaluation.STATS}
    assert capsys.readouterr().out == ""


def test_backends_agree_on_perturbed_detections(val):
    detections = _perturbed(val)
    reference, fast = (score(ScoreRequest(str(val.annotation_file), detections, BOTH, b))
                       for b in BACKENDS)
    assert 0.2 < reference["bbox_map"] < 0.9 and 0.1 < reference["segm_map"] < 0.9
    assert fast.keys() == reference.keys()
    for key, value in reference.items():
        assert fast[key] == pytest.approx(value, abs=1e-6), key


def test_no_detections_score_zero(val):
    for backend in BACKENDS:
        metrics = score(ScoreRequest(str(val.annotation_file), [], BOTH, backend))
        assert metrics["bbox_map"] == 0.0 and metrics["segm_map"] == 0.0


def test_bad_requests_are_refused(val):
    path = str(val.annotation_file)
    with pytest.raises(ValueError, match="backend"):
        score(ScoreRequest(path, [], backend="detectron"))
    with pytest.raises(ValueError, match="iou_types"):
        score(ScoreRequest(path, [], ("keypoints",)))
    r = next(r for r in val if len(r.labels))
    with pytest.raises(ValueError, match="labels must lie in"):
        score(ScoreRequest(path, [Detections(r.image_id, r.boxes, np.ones(len(r.labels)),
                                             np.zeros_like(r.labels))]))
    with pytest.raises(ValueError, match="one RLE per detection"):
        score(ScoreRequest(path, [Detections(r.image_id, r.boxes, np.ones(len(r.labels)),
                                             r.labels)], ("segm",)))


def test_score_runs_in_a_spawned_process(val):
    request = ScoreRequest(str(val.annotation_file), _perturbed(val, seed=1), BOTH)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        remote = pool.apply(score, (request,))
    assert remote == score(request)


def test_inclusive_boxes_are_one_pixel_wider(val):
    """Mask R-CNN's boxes end on their last pixel (w = x2 - x1 + 1): its ground truth scores 1
    with ``inclusive_boxes``, SSD's convention stays the default."""
    inclusive = [Detections(r.image_id, r.boxes - np.float32([0, 0, 1, 1]), np.ones(len(r.labels)),
                            r.labels) for r in val]
    request = ScoreRequest(str(val.annotation_file), inclusive, inclusive_boxes=True)
    assert score(request)["bbox_map"] == pytest.approx(1.0, abs=1e-6)
    default = ScoreRequest(str(val.annotation_file), inclusive)
    assert score(default)["bbox_map"] < 0.99
