"""The Mask R-CNN input pipeline against the MLPerf 1.1 reference's transforms, worked by hand,
and on the COCO-format fixture: sizes, boxes, mask targets, padding, sharding, loaders."""

from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

from benchmarks.maskrcnn import data
from common.coco import fixture
from common.coco.data import MEAN, STD, Categories, CocoSplit, ImageRecord
from common.errors import UserError

# pycocotools 2.0.11 decodes masks with numpy 1 semantics; harmless under numpy 2
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")

MIN, MAX = 96, 160          # a tiny configuration's sizes for the 64-pixel fixture


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return fixture.write_fixture(tmp_path_factory.mktemp("maskrcnn") / "coco2017", train=20,
                                 val=6, image_size=64)


@pytest.mark.parametrize("width, height, min_size, max_size, expected", [
    (640, 480, 800, 1333, (800, 1066)),       # shorter side to 800, the other truncated
    (480, 640, 800, 1333, (1066, 800)),
    (427, 640, 800, 1333, (1199, 800)),       # 800 * 640 / 427 = 1199.06
    (800, 1000, 800, 1333, (1000, 800)),      # already there: unchanged
    (1000, 500, 800, 1333, (666, 1332)),      # 1333 * 500 / 1000 = 666.5 rounds half to even
    (2000, 100, 800, 1333, (67, 1340)),       # round(66.65) = 67: the longer side passes 1333
    (1333, 300, 800, 1333, (300, 1333)),      # max_size gives back the original
    (64, 48, MIN, MAX, (96, 128)),
    (64, 32, MIN, MAX, (80, 160)),            # 2 * 96 > 160: round(160 * 32 / 64) = 80
])
def test_resized_size_is_the_references(width, height, min_size, max_size, expected):
    assert data.resized_size(width, height, min_size, max_size) == expected


def _record(segmentations) -> ImageRecord:
    """A 100 x 80 image: a 30 x 40 box at (10, 20), a crowd, a box 1 pixel wide (the reference
    empties it) and a box that reaches the image's right and bottom edges."""
    boxes = np.array([[10, 20, 40, 60], [0, 0, 50, 50], [5, 5, 6, 30], [60, 10, 100, 80]],
                     np.float32)
    return ImageRecord(7, "unused.jpg", 100, 80, boxes, np.array([2, 1, 3, 4]),
                       np.array([False, True, False, False]), segmentations)


RECTANGLE = [np.array([10, 20, 40, 20, 40, 60, 10, 60], np.float32)]


def test_targets_are_the_references_boxes_scaled_and_flipped():
    record = _record(None)
    boxes, index = data.reference_targets(record)
    assert index.tolist() == [0, 3]
    # COCO xywh (10, 20, 30, 40) -> (10, 20, 10 + 29, 20 + 39); the last clipped to W-1, H-1
    np.testing.assert_array_equal(boxes, [[10, 20, 39, 59], [60, 10, 99, 79]])
    scaled = data.scale_boxes(torch.from_numpy(boxes), 2.0, 2.0)
    torch.testing.assert_close(scaled, torch.tensor([[20., 40, 78, 118], [120, 20, 198, 158]]))
    flipped = data.flip_boxes(scaled, 200)             # x -> 200 - 1 - x, ends swapped
    torch.testing.assert_close(flipped, torch.tensor([[121., 40, 179, 118], [1, 20, 79, 158]]))
    torch.testing.assert_close(data.flip_boxes(flipped, 200), scaled)


def test_polygon_and_rle_rasterise_to_the_scaled_target():
    rle = mask_utils.encode(np.asfortranarray(np.pad(np.ones((40, 30), np.uint8),
                                                     ((20, 20), (10, 60)))))
    record = _record((RECTANGLE, None, RECTANGLE, rle))
    for flip in (False, True):
        size, boxes, labels, masks = data.train_targets(record, flip, 160, 1000)
        assert size == (160, 200) and labels.tolist() == [2, 4]
        assert masks.dtype == torch.uint8 and masks.shape == (2, 160, 200)
        expected = torch.zeros(160, 200, dtype=torch.uint8)
        # the rectangle (10..40, 20..60) at scale 2 covers pixels x 20..79, y 40..119; flipped
        # as the reference flips polygons, x -> 199 - x: pixels x 119..178
        cols = slice(119, 179) if flip else slice(20, 80)
        expected[40:120, cols] = 1
        assert torch.equal(masks[0], expected)
        assert torch.equal(masks[1], expected)          # the RLE: resized, then flipped alike
        assert torch.equal(boxes[0], torch.tensor([121., 40, 179, 118] if flip
                                                  else [20., 40, 78, 118]))


def test_unequal_ratios_scale_each_axis():
    # 33 x 20 -> 49 x 30 (int(30 * 33 / 20) = int(49.5)): x by 49/33, y by 3/2
    polygon = [np.array([0, 4, 33, 4, 33, 16, 0, 16], np.float32)]
    record = ImageRecord(1, "unused.jpg", 33, 20, np.array([[0, 4, 33, 16]], np.float32),
                         np.array([1]), np.array([False]), (polygon,))
    size, boxes, _, masks = data.train_targets(record, False, 30, 1000)
    assert size == (30, 49)
    torch.testing.assert_close(boxes, torch.tensor([[0, 6, 32 * 49 / 33, 22.5]]))
    expected = torch.zeros(1, 30, 49, dtype=torch.uint8)
    expected[0, 6:24] = 1
    assert torch.equal(masks, expected)


def test_padding_to_multiples_of_32():
    a, b = torch.rand(3, 50, 70), torch.rand(3, 64, 33)
    batch, sizes = data.pad_images([a, b])
    assert batch.shape == (2, 3, 64, 96) and sizes.tolist() == [[50, 70], [64, 33]]
    assert torch.equal(batch[0, :, :50, :70], a) and torch.equal(batch[1, :, :, :33], b)
    assert batch[0, :, 50:].abs().sum() == 0 and batch[0, :, :, 70:].abs().sum() == 0
    assert batch[1, :, :, 33:].abs().sum() == 0
    assert data.padded_shape([(64, 64)], 32) == (64, 64)
    assert data.padded_shape([(65, 1), (3, 97)], 32) == (96, 128)

    masks = [torch.ones(2, 50, 70, dtype=torch.uint8), torch.ones(1, 64, 33, dtype=torch.uint8)]
    boxes = [torch.tensor([[0., 0, 9, 9], [1, 1, 5, 5]]), torch.tensor([[2., 2, 8, 8]])]
    labels = [torch.tensor([3, 1]), torch.tensor([2])]
    out = data.collate_train(list(zip([a, b], boxes, labels, masks)))
    assert isinstance(out, data.TrainBatch) and out.images.shape == (2, 3, 64, 96)
    assert out.boxes.shape == (2, 2, 4) and out.labels.tolist() == [[3, 1], [2, 0]]
    assert torch.equal(out.boxes[1, 1], torch.zeros(4))
    assert out.masks.shape == (3, 64, 96) and out.masks.dtype == torch.uint8
    assert out.masks.sum((1, 2)).tolist() == [50 * 70, 50 * 70, 64 * 33]
    assert out.masks[2, :, :33].all()


def test_size_buckets_pad_batches_to_a_few_shapes(root):
    assert data.size_buckets(4, 800, 1333) == (800, 992, 1152, 1344)
    assert data.size_buckets(1, 800, 1333) == (800,)
    assert data.padded_shape([(800, 1066)], 32, (800, 992, 1152, 1344)) == (800, 1152)
    assert data.padded_shape([(801, 1400)], 32, (800, 1344)) == (1344, 1408)   # past the last
    with pytest.raises(UserError, match="--size-buckets 0"):
        data.size_buckets(0, 800, 1333)
    split = data.load_split(root, "train")
    buckets = data.size_buckets(3, MIN, MAX)
    plain = data.build_train_loader(split, 4, min_size=MIN, max_size=MAX, seed=3)
    bucketed = data.build_train_loader(split, 4, min_size=MIN, max_size=MAX, seed=3,
                                       buckets=buckets)
    shapes = set()
    for a, b in zip(plain.epoch(1), bucketed.epoch(1), strict=True):
        h, w = a.images.shape[-2:]
        shapes.add(tuple(b.images.shape[-2:]))
        assert set(b.images.shape[-2:]) <= set(buckets) and b.images.shape[-2] >= h
        assert torch.equal(b.images[..., :h, :w], a.images) and b.images[..., h:, :].eq(0).all()
        assert torch.equal(b.masks[..., :h, :w], a.masks) and b.masks[..., :, w:].eq(0).all()
        assert all(torch.equal(x, y) for x, y in zip(a[1:4], b[1:4]))
    assert len(shapes) <= len(buckets) ** 2


def test_grouped_batches_follow_the_reference_sampler():
    groups = np.array([0, 1, 0, 1, 1, 0, 0])
    order = np.array([6, 1, 0, 3, 2, 4, 5])
    # group 0 in order: 6, 0, 2, 5; group 1: 1, 3, 4; batches sorted by their first position
    assert data.grouped_batches(order, groups, 2, drop_last=False) == [[6, 0], [1, 3], [2, 5],
                                                                       [4]]
    assert data.grouped_batches(order, groups, 2, drop_last=True) == [[6, 0], [1, 3], [2, 5]]


def test_sharding_is_disjoint_and_complete():
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 2, 53)
    seen = [i for r in range(3) for b in data.eval_batches(groups, 4, r, 3) for i in b]
    assert sorted(seen) == list(range(53))                 # every image once
    for world, batch in ((1, 4), (2, 4), (4, 3)):
        steps = data.train_steps(53, groups, batch, world)
        assert steps == 53 // world // batch - 1
        for epoch in (0, 1):
            ranks = [data.train_batches(groups, batch, r, world, 5, epoch) for r in range(world)]
            assert all(len(mine) == steps for mine in ranks)
            flat = [i for mine in ranks for b in mine for i in b]
            assert len(flat) == len(set(flat)) == world * steps * batch
            assert all(len(set(groups[b])) == 1 for mine in ranks for b in mine)
        assert ranks == [data.train_batches(groups, batch, r, world, 5, 1) for r in range(world)]
        assert ranks != [data.train_batches(groups, batch, r, world, 5, 0) for r in range(world)]
    # without grouping, a set that fills the ranks' batches is used whole
    flat = [i for r in range(2) for b in data.train_batches(np.zeros(48, np.int64), 4, r, 2, 0, 3)
            for i in b]
    assert sorted(flat) == list(range(48))


def _split(records) -> CocoSplit:
    return CocoSplit("train", Path("instances_train2017.json"), Path("train2017"),
                     Categories((1, 2, 3, 4), ("a", "b", "c", "d")), records)


def test_images_without_targets_leave_training():
    crowd_only = ImageRecord(1, "a.jpg", 100, 80, np.array([[0, 0, 50, 50]], np.float32),
                             np.array([1]), np.array([True]), (None,))
    thin_only = ImageRecord(2, "b.jpg", 100, 80, np.array([[5, 5, 6, 30]], np.float32),
                            np.array([1]), np.array([False]), (RECTANGLE,))
    kept = _record((RECTANGLE, None, RECTANGLE, RECTANGLE))
    assert data.TrainDataset(_split([crowd_only, kept, thin_only])).records == [kept]
    with pytest.raises(UserError, match="instances_train2017.json: no image has a non-crowd"):
        data.TrainDataset(_split([crowd_only, thin_only]))
    with pytest.raises(ValueError, match="loaded without masks"):
        data.TrainDataset(_split([_record(None)]))


def test_train_loader_on_the_fixture(root):
    split = data.load_split(root, "train")
    loader = data.build_train_loader(split, 4, min_size=MIN, max_size=MAX, seed=3)
    dataset = loader.dataset
    assert len(dataset) == 18 and len(loader) == 18 // 4 - (len(set(loader.groups)) - 1)
    batches = list(loader.epoch(1))
    assert len(batches) == len(loader.epoch(1)) == len(loader)
    flips = []
    for indices, b in zip(loader.batches(1), batches):
        assert isinstance(b, data.TrainBatch)
        assert b.images.dtype == torch.uint8 and b.images.shape[:2] == (4, 3)
        assert b.images.shape[2] % 32 == 0 and b.images.shape[3] % 32 == 0
        records = [dataset.records[i] for i in indices]
        assert b.image_sizes.tolist() == [list(data.resized_size(r.width, r.height, MIN, MAX))
                                          for r in records]
        valid = b.labels > 0
        assert valid.sum(1).tolist() == [len(r.labels) for r in records]
        assert b.masks.shape == (int(valid.sum()), *b.images.shape[2:])
        owner = valid.nonzero()[:, 0]
        for mask, box, i in zip(b.masks, b.boxes[valid], owner):
            h, w = b.image_sizes[i].tolist()
            assert mask[h:].sum() == 0 and mask[:, w:].sum() == 0
            ys, xs = mask.nonzero(as_tuple=True)        # the mask fills its box
            extent = torch.stack((xs.min(), ys.min(), xs.max(), ys.max())).float()
            assert (extent[:2] >= box[:2] - 2).all() and (extent[2:] <= box[2:] + 2).all()
            assert mask.sum() > 0.25 * (box[2:] - box[:2] + 1).prod()   # a star: 0.38
        flips += [dataset.flip(i) for i in indices]
    assert 0 < sum(flips) < len(flips)
    parallel = data.build_train_loader(split, 4, min_size=MIN, max_size=MAX, seed=3,
                                       num_workers=2)
    for a, b in zip(batches, parallel.epoch(1)):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_image_transform_flips_and_normalises(root):
    record = data.load_split(root, "train")[0]
    image, boxes, labels, masks = data.train_sample(record, False, MIN, MAX)
    mirrored, flipped_boxes, _, flipped_masks = data.train_sample(record, True, MIN, MAX)
    h, w = data.resized_size(record.width, record.height, MIN, MAX)
    assert image.shape == (3, h, w) and torch.equal(mirrored, image.flip(-1))
    torch.testing.assert_close(flipped_boxes, data.flip_boxes(boxes, w))
    # the flipped polygon's mask is the mask mirrored and moved a pixel left, but for the
    # rasteriser's rounding of a few edge pixels (which is not mirror-symmetric)
    moved = torch.zeros_like(masks)
    moved[:, :, :-1] = masks.flip(-1)[:, :, 1:]
    assert (flipped_masks != moved).sum() <= 0.01 * masks.sum()
    assert image.dtype == torch.uint8
    pixels = image.float() / 255
    # the objects are saturated colours on grey: each mask's mean colour is far from grey
    for m in masks.bool():
        colour = pixels[:, m].mean(1)
        assert colour.max() - colour.min() > 0.2


def test_normalize_scales_to_0_1_normalises_and_keeps_the_padding_zero():
    """On the device, the reference's ``ToTensor`` and ``Normalize`` of each image, in the
    batch's memory format; the padding stays zero, as the reference pads normalised images."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 256, (3, 40, 70), generator=g, dtype=torch.uint8)
    b = torch.randint(0, 256, (3, 64, 33), generator=g, dtype=torch.uint8)
    batch, sizes = data.pad_images([a, b])
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    out = data.normalize(batch.contiguous(memory_format=torch.channels_last), sizes)
    assert out.dtype == torch.float32 and out.is_contiguous(memory_format=torch.channels_last)
    for x, (h, w), image in zip(out, sizes.tolist(), (a, b)):
        assert torch.equal(x[:, :h, :w], (image.float() / 255 - mean) / std)
        assert x[:, h:].eq(0).all() and x[:, :, w:].eq(0).all()


def test_eval_loader_keeps_every_image_with_its_id_and_size(root):
    split = data.load_split(root, "val")
    assert len(split) == 6 and split[0].segmentations is None
    seen = []
    for rank in range(2):
        loader = data.build_eval_loader(split, 2, rank=rank, world_size=2, min_size=MIN,
                                        max_size=MAX)
        for b in loader.epoch(0):
            assert isinstance(b, data.EvalBatch)
            for image_id, original, size in zip(b.image_ids.tolist(), b.original_sizes.tolist(),
                                                b.image_sizes.tolist()):
                r = next(r for r in split if r.image_id == image_id)
                assert original == [r.height, r.width]
                assert size == list(data.resized_size(r.width, r.height, MIN, MAX))
                seen.append(image_id)
    assert sorted(seen) == sorted(r.image_id for r in split)


def test_batch_too_large_for_the_split(root):
    split = data.load_split(root, "train")
    with pytest.raises(UserError, match="18 training images cannot fill a batch of 8 on each "
                                        "of 2 rank"):
        data.build_train_loader(split, 8, world_size=2, min_size=MIN, max_size=MAX)
