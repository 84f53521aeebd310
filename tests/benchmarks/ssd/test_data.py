"""The SSD input pipeline: crop, flip, colour, resize, padding, loaders over the COCO fixture."""

import numpy as np
import pytest
import torch
from PIL import Image

from benchmarks.ssd import data
from benchmarks.ssd.boxes import box_iou, dboxes300_coco, match
from common.coco.data import MEAN, STD, load_split
from common.coco.fixture import write_fixture
from common.coco.pipeline import epoch_order
from common.errors import UserError


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = write_fixture(tmp_path_factory.mktemp("coco") / "fx", train=14, val=5,
                         image_size=64, classes=3, seed=1)
    return load_split(root, "train"), load_split(root, "val")


def _image(h=100, w=100):
    return torch.arange(3 * h * w).reshape(3, h, w).remainder(251).to(torch.uint8)


def test_crop_keeps_boxes_with_centre_inside_and_clips_them():
    image = _image()
    boxes = torch.tensor([[0.1, 0.1, 0.4, 0.4],     # centre inside: clipped at left/top
                          [0.6, 0.6, 0.9, 0.9],     # centre (0.75, 0.75) outside
                          [0.5, 0.1, 0.9, 0.5],     # centre x 0.7 on the edge: dropped
                          [0.3, 0.3, 0.5, 0.6]])    # wholly inside
    labels = torch.tensor([1, 2, 3, 4])
    out, b, lab = data.apply_crop(image, boxes, labels, (20, 20, 70, 70))
    assert torch.equal(out, image[:, 20:70, 20:70])
    assert lab.tolist() == [1, 4]
    torch.testing.assert_close(b, torch.tensor([[0.0, 0.0, 0.4, 0.4], [0.2, 0.2, 0.6, 0.8]]))


def test_crop_window_meets_its_iou_constraint(monkeypatch):
    monkeypatch.setattr(data, "CROP_OPTIONS", ((0.5, None),))
    boxes = torch.tensor([[0.2, 0.2, 0.7, 0.8]])
    for s in range(20):
        px = data.crop_window(boxes, 120, 90, data.sample_generator(0, 0, s), max_samples=50)
        assert px is not None
        l, t, r, b = px
        assert 0 <= l < r <= 120 and 0 <= t < b <= 90
        assert 0.3 * 120 - 1 <= r - l and 0.3 * 90 - 1 <= b - t
        window = torch.tensor([[l / 120, t / 90, r / 120, b / 90]])
        assert box_iou(boxes, window).item() > 0.5


def test_random_crops_give_valid_boxes():
    image = _image(80, 120)
    boxes = torch.tensor([[0.1, 0.2, 0.5, 0.6], [0.4, 0.1, 0.9, 0.9], [0.0, 0.7, 0.2, 1.0]])
    labels = torch.tensor([1, 2, 3])
    for s in range(30):
        out, b, lab = data.ssd_crop(image, boxes, labels, data.sample_generator(3, 1, s))
        assert len(b) == len(lab) >= 1
        assert out.shape[0] == 3 and out.shape[1] >= 23 and out.shape[2] >= 35
        assert (b >= 0).all() and (b <= 1).all() and (b[:, 2:] > b[:, :2]).all()


def test_keep_the_image_choice_returns_it_unchanged(monkeypatch):
    monkeypatch.setattr(data, "CROP_OPTIONS", (None,))
    image, boxes, labels = _image(), torch.tensor([[0.1, 0.2, 0.3, 0.4]]), torch.tensor([5])
    out, b, lab = data.ssd_crop(image, boxes, labels, data.sample_generator(0, 0, 0))
    assert torch.equal(out, image) and torch.equal(b, boxes) and torch.equal(lab, labels)


def test_flip_mirrors_image_and_boxes():
    image = _image(4, 10)
    out, b = data.hflip(image, torch.tensor([[0.1, 0.2, 0.3, 0.9]]))
    assert torch.equal(out[..., 0], image[..., -1])
    torch.testing.assert_close(b, torch.tensor([[0.7, 0.2, 0.9, 0.9]]))


def test_resize_matches_pil_bilinear():
    rgb = np.random.default_rng(0).integers(0, 256, (77, 131, 3), dtype=np.uint8)
    ours = data.resize(torch.from_numpy(rgb).permute(2, 0, 1), 30)
    pil = np.asarray(Image.fromarray(rgb).resize((30, 30), Image.BILINEAR), np.float32) / 255
    assert (ours.permute(1, 2, 0).numpy() - pil).__abs__().mean() < 2 / 255


def test_hue_shift_of_zero_is_identity():
    x = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(data.adjust_hue(x, 0.0), x, atol=1e-5, rtol=0)
    assert not torch.allclose(data.adjust_hue(x, 0.05), x)


def test_train_transform_shapes_and_ranges():
    g = data.sample_generator(0, 0, 0)
    boxes = torch.tensor([[0.1, 0.1, 0.6, 0.5], [0.5, 0.5, 0.9, 0.95]])
    labels = torch.tensor([1, 2])
    image, b, lab = data.train_transform(_image(60, 90), boxes, labels, g)
    assert image.shape == (3, 300, 300) and image.dtype == torch.float32
    lo = (0 - torch.tensor(MEAN)) / torch.tensor(STD)
    hi = (1 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert (image >= lo.view(3, 1, 1) - 1e-5).all() and (image <= hi.view(3, 1, 1) + 1e-5).all()
    assert b.dtype == torch.float32 and (b >= 0).all() and (b <= 1).all()
    assert lab.dtype == torch.int64 and len(lab) == len(b)


def test_padding_and_too_many_boxes():
    b, lab, valid = data.pad_targets(torch.rand(3, 4), torch.tensor([1, 2, 3]), 5)
    assert b.shape == (5, 4) and lab.tolist() == [1, 2, 3, 0, 0]
    assert valid.tolist() == [True] * 3 + [False] * 2 and not b[3:].any()
    with pytest.raises(UserError, match=r"x\.jpg: 6 boxes, more than --max-boxes 5"):
        data.pad_targets(torch.rand(6, 4), torch.ones(6, dtype=torch.int64), 5, "x.jpg")


def test_dataset_names_the_image_with_too_many_boxes(coco):
    train, _ = coco
    most = max(train.records, key=lambda r: len(r.boxes))
    with pytest.raises(UserError, match="--max-boxes") as err:
        data.TrainDataset(train, 0, max_boxes=len(most.boxes) - 1)
    assert most.path in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="--max-samples"):
        data.TrainDataset(train, 0, max_samples=7)


def test_train_loader_batches_labels_and_boxes(coco, monkeypatch):
    monkeypatch.setattr(data, "CROP_OPTIONS", (None,))   # no crop: every box survives
    train, _ = coco
    loader = data.build_train_loader(train, batch_size=3, seed=4, max_boxes=8)
    batches = list(loader.epoch(2))
    assert len(batches) == len(loader) == len(train) // 3
    for (images, boxes, labels, valid), idx in zip(batches, loader.batches(2)):
        assert images.shape == (3, 3, 300, 300) and images.dtype == torch.float32
        assert boxes.shape == (3, 8, 4) and labels.shape == valid.shape == (3, 8)
        for j, i in enumerate(idx):
            r = train.records[i]
            n = len(r.labels)
            assert valid[j].sum() == n and labels[j, :n].tolist() == r.labels.tolist()
            rel = data.relative_boxes(r)
            flipped = torch.stack((1 - rel[:, 2], rel[:, 1], 1 - rel[:, 0], rel[:, 3]), 1)
            assert (torch.allclose(boxes[j, :n], rel, atol=1e-6)
                    or torch.allclose(boxes[j, :n], flipped, atol=1e-6))
    # the batch feeds the matcher as it is
    _, matched = match(boxes, labels, valid, dboxes300_coco())
    assert (matched > 0).any()


def test_loader_is_deterministic_per_seed_and_epoch(coco):
    train, _ = coco
    def first(seed, epoch):
        loader = data.build_train_loader(train, batch_size=2, seed=seed, max_boxes=8)
        return next(iter(loader.epoch(epoch)))
    a, b, c = first(1, 0), first(1, 0), first(1, 1)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_ranks_read_disjoint_slices_of_each_global_batch():
    n, bs = 23, 3
    r0 = data.train_batches(n, bs, 0, 2, seed=5, epoch=1)
    r1 = data.train_batches(n, bs, 1, 2, seed=5, epoch=1)
    assert len(r0) == len(r1) == n // 6
    order = epoch_order(n, 5, 1)
    for s, (a, b) in enumerate(zip(r0, r1)):
        assert sorted(a + b) == sorted(order[6 * s:6 * s + 6]) and not set(a) & set(b)
    assert data.train_batches(n, bs, 0, 2, seed=5, epoch=2) != r0
    e0, e1 = data.eval_batches(n, 4, 0, 2), data.eval_batches(n, 4, 1, 2)
    assert sorted(sum(e0, []) + sum(e1, [])) == list(range(n))


def test_eval_loader_keeps_ids_and_sizes(coco):
    _, val = coco
    loader = data.build_eval_loader(val, batch_size=2, rank=1, world_size=2)
    batches = list(loader.epoch(0))
    assert len(batches) == len(loader) == 1          # val 5 images: rank 1 holds 2
    images, ids, sizes = batches[0]
    assert images.shape == (2, 3, 300, 300) and images.dtype == torch.float32
    records = [val.records[1], val.records[3]]
    assert ids.tolist() == [r.image_id for r in records]
    assert sizes.tolist() == [[r.height, r.width] for r in records]


def test_synthetic_batch():
    images, boxes, labels, valid = data.synthetic_batch(2, 81, "cpu", max_boxes=10)
    assert images.shape == (2, 3, 300, 300) and boxes.shape == (2, 10, 4)
    assert valid.sum(1).tolist() == [4, 4] and (labels[valid] >= 1).all()
    assert (labels[valid] <= 80).all() and (boxes[valid][:, 2:] > boxes[valid][:, :2]).all()
    assert (boxes <= 1).all()
