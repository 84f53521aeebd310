"""The COCO 2017 reader on the fixture: counts, label mapping, boxes, masks, images, bad input."""

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils

from common.coco import data, fixture
from common.errors import UserError
from common.fixture_cache import MARKER

# pycocotools 2.0.11 decodes masks with numpy 1 semantics; harmless under numpy 2
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")


@pytest.fixture(scope="module")
def train(coco_root):
    return data.load_split(coco_root, "train")


@pytest.fixture(scope="module")
def val(coco_root):
    return data.load_split(coco_root, "val", masks=True)


def _json(root, split):
    return json.loads(data.annotation_file(root, split).read_text())


def test_images_without_objects_leave_train_and_stay_in_val(coco_root, train, val):
    for split, index in (("train", train), ("val", val)):
        doc = _json(coco_root, split)
        annotated = {a["image_id"] for a in doc["annotations"]}
        assert len(annotated) < len(doc["images"])  # the fixture has empty images
        expected = annotated if split == "train" else {im["id"] for im in doc["images"]}
        assert [r.image_id for r in index] == sorted(expected)
    assert len(train) == 270 and len(val) == 60


def test_category_ids_map_to_contiguous_labels_and_back(coco_root, val):
    doc = _json(coco_root, "val")
    ids = sorted(c["id"] for c in doc["categories"])
    cats = val.categories
    assert cats.ids == tuple(ids) and ids != list(range(1, len(ids) + 1))
    assert cats.num_classes == 5
    assert cats.labels(ids).tolist() == [1, 2, 3, 4, 5]
    assert cats.category_ids([1, 2, 3, 4, 5]).tolist() == ids
    by_image = {}
    for a in doc["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a["category_id"])
    for r in val:
        assert r.labels.dtype == np.int64
        assert cats.category_ids(r.labels).tolist() == by_image.get(r.image_id, [])
    with pytest.raises(ValueError, match="labels must lie in 1..5"):
        cats.category_ids([0])


def test_boxes_are_xyxy_pixels_inside_their_images(coco_root, train):
    doc = _json(coco_root, "train")
    xywh = {}
    for a in doc["annotations"]:
        xywh.setdefault(a["image_id"], []).append(a["bbox"])
    for r in train:
        b = r.boxes
        assert b.dtype == np.float32 and b.shape == (len(r.labels), 4)
        assert (b[:, 2:] > b[:, :2]).all()
        assert (b >= 0).all() and (b <= [r.width, r.height] * 2).all()
        expected = np.array(xywh[r.image_id])
        expected[:, 2:] += expected[:, :2]
        np.testing.assert_allclose(b, expected, atol=1e-4)
        assert not r.iscrowd.any() and r.segmentations is None


def test_masks_cover_the_drawn_shapes(coco_root, val):
    areas = {}
    for a in _json(coco_root, "val")["annotations"]:
        areas.setdefault(a["image_id"], []).append(a["area"])
    checked = 0
    for r in val:
        masks = data.decode_masks(r)
        assert masks.dtype == np.uint8 and masks.shape == (len(r.labels), r.height, r.width)
        assert set(np.unique(masks)) <= {0, 1}
        if not len(r.labels):
            continue
        # the annotation's area is the mask's pixel count
        np.testing.assert_allclose(masks.sum((1, 2)), areas[r.image_id], rtol=0.02, atol=2)
        for m, box in zip(masks, r.boxes):  # the mask fills its box (less a pointed tip)
            ys, xs = np.nonzero(m)
            extent = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
            assert (extent[:2] >= box[:2] - 1).all() and (extent[2:] <= box[2:] + 1).all()
            assert np.prod(extent[2:] - extent[:2]) > 0.8 * np.prod(box[2:] - box[:2])
        # the last object drawn is never occluded: its mask holds its class's colour
        image = data.decode_image(r.path, (r.width, r.height)).astype(float)
        mean = image[masks[-1].astype(bool)].mean(0)
        nearest = min(fixture.COLOURS, key=lambda c: np.abs(mean - fixture.COLOURS[c]).sum())
        assert nearest == fixture.class_style(int(r.labels[-1]) - 1)[1]
        checked += 1
    assert checked > 40


def test_crowd_and_empty_boxes(tmp_path):
    root = fixture.write_fixture(tmp_path / "coco", train=4, val=2)
    path = data.annotation_file(root, "train")
    doc = json.loads(path.read_text())
    doc["annotations"][0]["iscrowd"] = 1
    doc["annotations"][1]["bbox"][3] = 0.0  # height 0: two such boxes in real train2017
    path.write_text(json.dumps(doc))
    total = len(doc["annotations"])
    kept = data.load_split(root, "train")
    assert sum(len(r.labels) for r in kept) == total - 1
    assert sum(int(r.iscrowd.sum()) for r in kept) == 1
    dropped = data.load_split(root, "train", keep_crowd=False)
    assert sum(len(r.labels) for r in dropped) == total - 2
    assert len(dropped) == len(kept)  # images keep their place, as in the references


def test_decode_image_converts_to_rgb(tmp_path, val):
    r = val[0]
    hwc = data.decode_image(r.path, (r.width, r.height))
    assert hwc.dtype == np.uint8 and hwc.shape == (r.height, r.width, 3)
    chw = data.decode_image_chw(r.path)
    assert chw.dtype == torch.uint8 and torch.equal(chw, torch.from_numpy(hwc).permute(2, 0, 1))
    for mode in ("L", "CMYK"):
        path = tmp_path / f"{mode}.jpg"
        Image.new(mode, (5, 4)).save(path)
        assert data.decode_image(path).shape == (4, 5, 3)
    with pytest.raises(UserError, match=r"L\.jpg: image is 5x4, the annotation file says 4x5"):
        data.decode_image(tmp_path / "L.jpg", (4, 5))


def test_fixture_is_written_once(tmp_path):
    root = fixture.write_fixture(tmp_path / "f", train=3, val=2, classes=2)
    marker = root / MARKER
    stamp = marker.stat().st_mtime_ns
    assert fixture.main([str(root), "--train", "3", "--val", "2", "--classes", "2"]) == 0
    assert marker.stat().st_mtime_ns == stamp
    fixture.write_fixture(root, train=3, val=2, classes=3)
    assert json.loads(marker.read_text())["params"]["classes"] == 3
    assert len(_json(root, "val")["categories"]) == 3


# -- bad input: one line naming the file ------------------------------------------------
def _edit_annotations(edit):
    def apply(root):
        path = data.annotation_file(root, "train")
        doc = json.loads(path.read_text())
        edit(doc, doc["annotations"][0])
        path.write_text(json.dumps(doc))
    return apply


def _set(key, value):
    return _edit_annotations(lambda doc, ann: ann.__setitem__(key, value))


def _all_boxes_empty(doc, ann):
    for a in doc["annotations"]:
        a["bbox"][2] = 0.0


def _reorder_categories(doc, ann):
    doc["categories"].reverse()  # same ids and names; file order is what the references number


def _drop_image(root):
    first = _json(root, "train")["images"][0]["file_name"]
    (data.image_dir(root, "train") / first).unlink()


BAD_INPUTS = {
    "missing image": (_drop_image, "1 of its 6 images are missing from"),
    "box outside": (_set("bbox", [200.0, 10.0, 20.0, 20.0]), "outside its"),
    "negative width": (_set("bbox", [10.0, 10.0, -3.0, 20.0]), "negative or non-finite"),
    "unknown category": (_set("category_id", 999), "category_id 999, not in the file's"),
    "unknown image": (_set("image_id", 999_999_999), "image_id not in the file's images"),
    "invalid json": (lambda root: data.annotation_file(root, "train").write_text("{oops"),
                     "not valid JSON"),
    "missing file": (lambda root: data.annotation_file(root, "train").unlink(), "missing"),
    "not coco": (lambda root: data.annotation_file(root, "train").write_text("[]"),
                 "no 'images' list"),
    "empty file": (lambda root: data.annotation_file(root, "train").write_text(""),
                   "empty file (0 bytes)"),
    "no annotations": (_edit_annotations(lambda doc, ann: doc.__setitem__("annotations", [])),
                       "its 'annotations' list is empty"),
    "no images": (_edit_annotations(lambda doc, ann: doc.update(images=[], annotations=[])),
                  "its 'images' list is empty"),
    "image without file_name": (_edit_annotations(lambda doc, ann: doc["images"][2].pop(
        "file_name")), "image entry 2 has no 'file_name' (id "),
    "image width text": (_edit_annotations(lambda doc, ann: doc["images"][1].update(
        width="wide")), "image entry 1 has width 'wide' (id "),
    "image width 0": (_edit_annotations(lambda doc, ann: doc["images"][1].update(width=0)),
                      "is 0x"),
    "image height NaN": (_edit_annotations(lambda doc, ann: doc["images"][1].update(
        height=float("nan"))), "xnan; an image's width and height are whole numbers"),
    "image width 1.5": (_edit_annotations(lambda doc, ann: doc["images"][1].update(
        width=1.5)), "is 1.5x"),
    "annotation bbox of 3": (_set("bbox", [1.0, 2.0, 3.0]),
                             "annotation entry 0 has bbox [1.0, 2.0, 3.0] (id 1)"),
    "annotation a list": (_edit_annotations(lambda doc, ann: doc["annotations"].append([1])),
                          "is list, not an object; a COCO annotation has image_id"),
    "category without name": (_edit_annotations(lambda doc, ann: doc["categories"][3].pop(
        "name")), "category entry 3 has no 'name' (id "),
    "every box of zero size": (_edit_annotations(_all_boxes_empty), "every box has zero width"),
    "categories reordered": (_edit_annotations(_reorder_categories),
                             "its categories differ from "),
    "category renamed": (_edit_annotations(lambda doc, ann: doc["categories"][1].update(
        name="grey ellipse")), "(entry 1: {'id': 18, 'name': 'grey ellipse'"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_annotations_name_the_file(tmp_path, case):
    root = fixture.write_fixture(tmp_path / "coco", train=6, val=2)
    break_it, message = BAD_INPUTS[case]
    break_it(root)
    with pytest.raises(UserError) as caught:
        data.load_split(root, "train")
    text = str(caught.value)
    assert "\n" not in text and message in text
    assert text.startswith(str(data.annotation_file(root, "train")))


BAD_SEGMENTATIONS = {
    "two points": ([[10.0, 10.0, 20.0, 10.0]], "has a polygon of 4 coordinates; a polygon "
                                                "needs an even number, at least 6 (3 points)"),
    "odd length": ([[10.0, 10.0, 20.0, 10.0, 20.0, 20.0, 5.0]], "has a polygon of 7"),
    "no polygons": ([], "unknown format (neither a non-empty list of polygons"),
    "string": ("10 10 20 10 20 20", "unknown format (neither"),
    "flat polygon": ([10.0, 10.0, 20.0, 10.0, 20.0, 20.0], "unknown format (a polygon that"),
    "text polygon": ([["a", "b", "c", "d", "e", "f"]], "unknown format (a polygon that"),
    "dict": ({"polygon": [1, 2]}, "unknown format (neither"),
    "rle size": ({"counts": [0, 4], "size": [2, 2]}, "has an RLE of size [2, 2], not its "
                                                    "image's [height, width]"),
}


def test_every_box_of_zero_size_is_refused_by_ssd_and_maskrcnn_alike(tmp_path):
    root = fixture.write_fixture(tmp_path / "coco", train=6, val=2)
    _edit_annotations(_all_boxes_empty)(root)
    for kwargs in ({}, {"masks": True, "keep_crowd": False}):  # SSD's read, Mask R-CNN's
        with pytest.raises(UserError, match="none of its .* boxes is a target"):
            data.load_split(root, "train", **kwargs)


def test_val_categories_are_checked_when_train_is_read(tmp_path):
    root = fixture.write_fixture(tmp_path / "coco", train=6, val=2)
    path = data.annotation_file(root, "val")
    doc = json.loads(path.read_text())
    doc["categories"].pop()
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"differ from .*instances_val2017.json's .* 5 vs 4"):
        data.load_split(root, "train")
    path.unlink()  # train alone (the throughput tools) is still read
    assert data.load_split(root, "train")


def test_unreadable_annotations_folder_is_one_line(tmp_path, monkeypatch):
    root = fixture.write_fixture(tmp_path / "coco", train=2, val=2)
    folder = data.annotation_file(root, "train").parent
    if os.geteuid() == 0:  # root reads through chmod 000: the denial is simulated
        def denied(path, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(path))
        monkeypatch.setattr(data, "open", denied, raising=False)
    folder.chmod(0)
    try:
        with pytest.raises(UserError) as caught:
            data.load_split(root, "train")
    finally:
        folder.chmod(0o755)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(str(data.annotation_file(root, "train")))
    assert "cannot be read (Permission denied); make it and" in text and "chmod" in text


BAD_RLE_COUNTS = {
    "garbage string": "garbage!!",
    "empty string": "",
    "string cut short": "01X10",
    "string ending inside a number": "01X1m",
    "short list": [0, 3, 2],
    "negative run": [-5, 10],
    "text runs": ["a", "b"],
}


@pytest.mark.parametrize("case", BAD_RLE_COUNTS)
def test_rle_counts_must_cover_the_image(tmp_path, case):
    root = fixture.write_fixture(tmp_path / "coco", train=6, val=2)
    doc = _json(root, "train")
    first = doc["annotations"][0]
    image = next(im for im in doc["images"] if im["id"] == first["image_id"])
    h, w = image["height"], image["width"]
    _set("segmentation", {"counts": BAD_RLE_COUNTS[case], "size": [h, w]})(root)
    with pytest.raises(UserError) as caught:
        data.load_split(root, "train", masks=True)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(
        f"{data.annotation_file(root, 'train')}: annotation {first['id']} ")
    assert f"has an RLE whose counts are not non-negative run lengths adding up to its {w}x{h}" \
        in text


def test_rle_strings_are_read_as_pycocotools_writes_them():
    rng = np.random.default_rng(0)
    for _ in range(20):
        h, w = rng.integers(1, 60, 2)
        mask = (rng.random((h, w)) < rng.random()).astype(np.uint8)
        rle = mask_utils.encode(np.asfortranarray(mask))
        flat = mask.flatten(order="F")  # column-major runs, starting with zeros
        edges = np.flatnonzero(np.diff(np.concatenate([[0], flat, [2]])))
        expected = np.diff(np.concatenate([[0], edges])).tolist()
        assert data._rle_string_runs(rle["counts"].decode()) == expected


@pytest.mark.parametrize("case", BAD_SEGMENTATIONS)
def test_bad_segmentations_name_the_file(tmp_path, case):
    root = fixture.write_fixture(tmp_path / "coco", train=6, val=2)
    segmentation, message = BAD_SEGMENTATIONS[case]
    _set("segmentation", segmentation)(root)
    assert data.load_split(root, "train")  # SSD reads no masks: unchanged
    with pytest.raises(UserError) as caught:
        data.load_split(root, "train", masks=True)
    text = str(caught.value)
    first = _json(root, "train")["annotations"][0]
    assert "\n" not in text and message in text
    assert text.startswith(f"{data.annotation_file(root, 'train')}: annotation {first['id']} "
                           f"(image {first['image_id']})")


def test_only_target_segmentations_are_checked_and_rle_decodes(tmp_path):
    root = fixture.write_fixture(tmp_path / "coco", train=6, val=2)
    before = data.load_split(root, "train", masks=True)
    path = data.annotation_file(root, "train")
    doc = json.loads(path.read_text())
    first, second = doc["annotations"][:2]
    image = next(im for im in doc["images"] if im["id"] == second["image_id"])
    rle = data.segmentation_rle(second["segmentation"], image["height"], image["width"])
    second["segmentation"] = {"counts": rle["counts"].decode(), "size": rle["size"]}
    first["iscrowd"], first["segmentation"] = 1, "not looked at: a dropped crowd annotation"
    path.write_text(json.dumps(doc))
    after = data.load_split(root, "train", masks=True, keep_crowd=False)
    masks = {r.image_id: data.decode_masks(r) for r in after}
    for r in before:
        expected = data.decode_masks(r)[~np.isin(np.arange(len(r.labels)),
                                                 [0] if r.image_id == first["image_id"] else [])]
        np.testing.assert_array_equal(masks[r.image_id], expected)


def test_undecodable_image_is_named_when_read(tmp_path):
    root = fixture.write_fixture(tmp_path / "coco", train=2, val=2)
    record = data.load_split(root, "val")[0]
    with open(record.path, "r+b") as f:
        f.write(b"not a jpeg")
    index = data.load_split(root, "val")  # the index does not open images
    with pytest.raises(UserError, match="cannot decode image") as caught:
        data.decode_image(index[0].path)
    assert str(caught.value).startswith(record.path) and "\n" not in str(caught.value)
