"""ResNet's DALI reader against the Pillow reader.

The tests marked ``dali`` need NVIDIA DALI: ``make test-dali`` installs it (the extra "dali",
about 790 MB) and runs them with REQUIRE_DALI=1, which turns their skip into a failure. They
run the DALI reader in DALI's CPU mode, the reader's path on a CPU device (pipelines built
with ``device_id=None``, JPEG decode on the CPU), against the Pillow reader (``cpu``) on the
ResNet fixture. DALI's GPU mode (``device='mixed'``) is not run by any test here.

Tolerances are in pixel levels (0-255, before normalisation). The figures quoted as measured
are from nvidia-dali-cuda120 2.4.0 and Pillow 13.0.0 on these fixtures.
"""

import os
from pathlib import Path

import pytest
import torch

from benchmarks.resnet import data
from benchmarks.resnet.dali import decoder as dali_decoder
from benchmarks.resnet.fixture import write_fixture

REPO = Path(__file__).resolve().parents[3]
CPU = torch.device("cpu")
MEAN = torch.tensor(data.MEAN).view(1, 3, 1, 1)
STD = torch.tensor(data.STD).view(1, 3, 1, 1)


# -- the DALI reader in DALI's CPU mode against Pillow --------------------------------------
@pytest.fixture(scope="module")
def dali():
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        if os.environ.get("REQUIRE_DALI"):
            pytest.fail("REQUIRE_DALI is set and nvidia.dali does not import: run make test-dali")
        pytest.skip("needs NVIDIA DALI: make test-dali installs it")


@pytest.fixture(scope="module")
def imagenet_sized(tmp_path_factory):
    """256 px images: evaluation at 224 resizes the shorter side to 256 (no resampling) and
    takes the centre 224, so both readers decode, crop and normalise the same pixels."""
    root = write_fixture(tmp_path_factory.mktemp("dali") / "imagenet256", num_classes=4,
                         train_per_class=2, val_per_class=6, image_size=256)
    return data.ImageFolderIndex.scan(root)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The fixture of `make run` (config_cpu_tiny.sh: 10 classes, 100 train and 50 val images
    per class, 80 px), read at the config's 64 px."""
    root = write_fixture(tmp_path_factory.mktemp("dali") / "tiny", num_classes=10,
                         train_per_class=100, val_per_class=50, image_size=80)
    return data.ImageFolderIndex.scan(root)


def epoch(index, backend, train, size, batch_size, rank=0, world_size=1, seed=1):
    decoder = {"cpu": data.pillow_decoder, "dali": dali_decoder}[backend]
    loader = data.build_loader(index, train, size, batch_size, rank, world_size, 1, CPU,
                               seed=seed if train else 0, decoder=decoder)
    loader.memory_format = torch.channels_last
    batches = list(loader.epoch(1))
    assert len(batches) == len(loader)
    return batches


def pixels(batches) -> torch.Tensor:
    """The batches' images in pixel levels (normalisation undone), float64."""
    return (torch.cat([x for x, _ in batches]) * STD + MEAN).double()


def assert_same_batches(pillow, dali_batches):
    """Same number of batches, shapes, dtypes, layout and labels in the same order."""
    assert [(x.shape, y.tolist()) for x, y in dali_batches] == \
        [(x.shape, y.tolist()) for x, y in pillow]
    for x, y in dali_batches:
        assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.device == CPU
        assert x.is_contiguous(memory_format=torch.channels_last)


def channel_stats(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return p.mean(dim=(0, 2, 3)), p.std(dim=(0, 2, 3))


@pytest.mark.dali
def test_dali_evaluation_equals_pillow_at_imagenet_sizes(dali, imagenet_sized):
    # 24 images in batches of 5: the last batch is partial.
    pillow = epoch(imagenet_sized, "cpu", train=False, size=224, batch_size=5)
    ours = epoch(imagenet_sized, "dali", train=False, size=224, batch_size=5)
    assert_same_batches(pillow, ours)
    assert len(ours) == 5 and len(ours[-1][1]) == 4
    # Measured: at most 1.5e-5 levels apart (float rounding of the normalisation).
    assert (pixels(ours) - pixels(pillow)).abs().max() < 0.01


@pytest.mark.dali
def test_dali_evaluation_matches_pillow_on_the_tiny_fixture(dali, tiny):
    pillow = epoch(tiny, "cpu", train=False, size=64, batch_size=100)
    ours = epoch(tiny, "dali", train=False, size=64, batch_size=100)
    assert_same_batches(pillow, ours)
    p, d = pixels(pillow), pixels(ours)
    # 80 -> 73 px, centre 64: Pillow resamples the 70 px source square to 64 in one step, DALI
    # resizes the whole image to 73 and crops, so pixels shift by a fraction of a pixel over
    # stripes and noise. Measured on these 500 images: each image's channel means at most 0.94
    # levels apart, the set's channel means 0.03 and standard deviations 0.01, the mean
    # absolute pixel difference 4.4 levels.
    assert (p.mean(dim=(2, 3)) - d.mean(dim=(2, 3))).abs().max() < 1.5
    for a, b in zip(channel_stats(p), channel_stats(d)):
        assert (a - b).abs().max() < 0.25
    assert (p - d).abs().mean() < 6


@pytest.mark.dali
def test_dali_training_batches_match_pillow_in_labels_shapes_and_statistics(dali, tiny):
    # 1000 images in batches of 32: 31 batches, the last 8 images dropped.
    pillow = epoch(tiny, "cpu", train=True, size=64, batch_size=32)
    ours = epoch(tiny, "dali", train=True, size=64, batch_size=32)
    assert len(ours) == 31
    assert_same_batches(pillow, ours)   # both read the loader's shard order
    p, d = pixels(pillow), pixels(ours)
    # Random-resized crops and flips drawn by different generators: only the statistics can
    # agree. Measured over seeds 1-5 of each reader, any DALI seed against any Pillow seed:
    # channel means at most 1.4 levels apart, standard deviations 0.5 (Pillow against Pillow
    # with another seed: 1.1 and 0.45). The bounds are twice that.
    mean_p, std_p = channel_stats(p)
    mean_d, std_d = channel_stats(d)
    assert (mean_p - mean_d).abs().max() < 3.0
    assert (std_p - std_d).abs().max() < 1.0


@pytest.mark.dali
def test_dali_training_shards_carry_the_pillow_labels(dali, tiny):
    for rank in range(2):
        pillow = epoch(tiny, "cpu", train=True, size=32, batch_size=50, rank=rank, world_size=2,
                       seed=7)
        ours = epoch(tiny, "dali", train=True, size=32, batch_size=50, rank=rank, world_size=2,
                     seed=7)
        assert len(ours) == 10
        assert_same_batches(pillow, ours)
