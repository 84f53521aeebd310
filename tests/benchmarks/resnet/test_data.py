"""The ImageNet JPEG-folder reader on the fixture: index, labels, shapes, normalisation, shards."""

import multiprocessing
import random

import numpy as np
import pytest
import torch
from PIL import Image

from benchmarks.resnet import data, nvjpeg, turbo
from benchmarks.resnet.fixture import write_fixture
from benchmarks.resnet.workload import ResNetWorkload
from common.dist import DistEnv
from common.errors import UserError
from common.precision import Precision
from common.training import build_parser

CPU = torch.device("cpu")
FIXTURE = dict(num_classes=3, train_per_class=10, val_per_class=5, image_size=48)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("data") / "imagenet", **FIXTURE)


@pytest.fixture(scope="module")
def index(root):
    return data.ImageFolderIndex.scan(root)


def loader(index, train=True, batch_size=4, rank=0, world_size=1, seed=5, size=32):
    return data.build_loader(index, train, size, batch_size, rank, world_size, 0, CPU,
                             seed=seed if train else 0)


def test_index_labels_follow_sorted_wnids(index):
    assert index.classes == sorted(index.classes) and len(index.classes) == 3
    assert len(index.train) == 30 and len(index.val) == 15
    for split in (index.train, index.val):
        for path, label in split:
            assert f"/{index.classes[label]}/" in path


def test_batches_have_the_model_input_format(index):
    ld = loader(index)
    images, labels = next(iter(ld.epoch(1)))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert images.is_contiguous()
    assert labels.dtype == torch.int64 and labels.shape == (4,)
    assert set(labels.tolist()) <= {0, 1, 2}
    ld.memory_format = torch.channels_last   # the channels-last optimisation
    channels_last, _ = next(iter(ld.epoch(1)))
    assert channels_last.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(channels_last, images)


def test_labels_match_the_files_read(index):
    ld = loader(index, batch_size=5)
    order = ld.shard(2)
    labels = torch.cat([y for _, y in ld.epoch(2)])
    assert labels.tolist() == [index.train[i][1] for i in order[:len(labels)]]


def test_normalisation_of_a_constant_colour_image(tmp_path):
    rgb = (200, 100, 50)
    for split in ("train", "val"):
        folder = tmp_path / split / "n00000001"
        folder.mkdir(parents=True)
        Image.new("RGB", (40, 30), rgb).save(folder / "a.JPEG", quality=100)
    index = data.ImageFolderIndex.scan(tmp_path)
    images, _ = next(iter(loader(index, train=False, batch_size=1, size=16).epoch(0)))
    expected = (torch.tensor(rgb, dtype=torch.float32) - torch.tensor(data.MEAN)) / \
        torch.tensor(data.STD)
    # JPEG chroma quantisation moves a flat colour by a pixel level or two.
    assert torch.allclose(images[0].mean(dim=(1, 2)), expected, atol=3 / 57)
    assert images[0].std(dim=(1, 2)).max() < 0.05


def test_evaluation_covers_every_image_once_across_ranks(index):
    seen = []
    for rank in range(2):
        ld = loader(index, train=False, batch_size=4, rank=rank, world_size=2)
        batches = list(ld.epoch(0))
        assert len(batches) == len(ld)
        seen += ld.shard(0)
        assert sum(len(y) for _, y in batches) == len(ld.shard(0))
    assert sorted(seen) == list(range(len(index.val)))


def test_training_shards_are_disjoint_and_reshuffled_per_epoch(index):
    shards = [loader(index, rank=r, world_size=2).shard(1) for r in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert len(shards[0]) == len(shards[1]) == 15
    ld = loader(index, world_size=2)
    assert ld.shard(1) != ld.shard(2)
    assert ld.shard(1) == loader(index, world_size=2).shard(1)  # same seed, same order
    assert ld.shard(1) != loader(index, world_size=2, seed=6).shard(1)
    assert len(ld) == 15 // 4  # the last partial batch is dropped


def test_random_crop_boxes_stay_inside_the_image():
    rng = random.Random(0)
    for w, h in ((500, 375), (64, 300), (300, 20)):
        for _ in range(50):
            left, top, cw, ch = data.random_resized_crop_box(w, h, rng)
            assert 0 <= left and left + cw <= w and 0 <= top and top + ch <= h and cw * ch > 0


def test_center_crop_is_the_central_0875_square():
    assert data.center_crop_box(256, 256, 224) == (16, 16, 224, 224)
    left, top, w, h = data.center_crop_box(512, 256, 224)
    assert (w, h) == (224, 224) and left == 144 and top == 16


def test_missing_split_and_empty_class_folder(tmp_path):
    (tmp_path / "train" / "n1").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "train" / "n1" / "a.JPEG")
    with pytest.raises(UserError, match="val: missing"):
        data.ImageFolderIndex.scan(tmp_path)
    (tmp_path / "val" / "n1").mkdir(parents=True)
    with pytest.raises(UserError, match="class folder without JPEG"):
        data.ImageFolderIndex.scan(tmp_path)


def test_corrupt_jpeg_is_named(tmp_path, root):
    bad = tmp_path / "bad"
    for split in ("train", "val"):
        (bad / split / "n1").mkdir(parents=True)
        (bad / split / "n1" / "x.JPEG").write_bytes(b"not a jpeg")
    index = data.ImageFolderIndex.scan(bad)
    with pytest.raises(UserError, match=r"x\.JPEG: cannot decode JPEG"):
        next(iter(loader(index, train=False, batch_size=1).epoch(0)))


def test_unknown_and_unavailable_readers(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser(ResNetWorkload).parse_args(["--opt", "opencv"])
    assert exc.value.code == 2 and "unknown optimisation 'opencv'" in capsys.readouterr().err
    args = build_parser(ResNetWorkload).parse_args(["--opt", "nvjpeg", "--device", "cpu"])
    with pytest.raises(UserError, match="optimisation nvjpeg needs CUDA"):
        ResNetWorkload(args, DistEnv(), Precision("fp32", "cpu"))


def test_synthetic_batch_is_device_resident_random_data():
    images, labels = data.synthetic_batch(2, 16, 1000, CPU)
    assert images.shape == (2, 3, 16, 16) and labels.max() < 1000
    assert images.is_contiguous()
    assert np.isfinite(images.numpy()).all()


@pytest.mark.parametrize("backend", ["nvjpeg", "turbo"])
def test_close_stops_the_loader_processes_kept_between_passes(imagenet_like, backend):
    """The backends whose loader processes serve every pass (nvjpeg with its Pillow
    stand-in for the GPU decode) stop them at ``close``."""
    samples = imagenet_like.train
    decoder = nvjpeg.BatchedDecoder(samples, 32, True, 7, 6, 2, CPU, nvjpeg.pillow_decode) \
        if backend == "nvjpeg" else turbo.TurboDecoder(samples, 32, True, 7, 6, 2, CPU)
    before = set(multiprocessing.active_children())
    loader = data.Loader(samples, True, 6, 0, 1, 7, decoder)
    for epoch in (1, 2):
        assert sum(1 for _ in loader.epoch(epoch)) == len(loader)
    workers = [p for p in multiprocessing.active_children() if p not in before]
    assert len(workers) == 2 and all(p.is_alive() for p in workers)
    loader.close()
    assert not any(p.is_alive() for p in workers)
