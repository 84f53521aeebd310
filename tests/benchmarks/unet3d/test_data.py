"""The KiTS19 npy reader and augmentations on the fixture."""

import re
import shutil

import numpy as np
import pytest
import torch

from benchmarks.unet3d import data
from benchmarks.unet3d.fixture import NUM_CASES
from common.errors import UserError

PATCH = (64, 32, 32)


def test_split_is_the_references(kits_fixture):
    train, val = data.scan(kits_fixture)
    assert (len(train), len(val)) == (168, 42) and len(train) + len(val) == NUM_CASES
    assert {c.case_id for c in val} == data.EVAL_CASES
    assert "00000" in data.EVAL_CASES and "00001" not in data.EVAL_CASES


def test_cases_have_the_reference_format(kits_fixture):
    train, _ = data.scan(kits_fixture)
    image, label = data.load(train[0])
    assert image.dtype == np.float32 and label.dtype == np.uint8
    assert image.shape == label.shape == train[0].shape and image.shape[0] == 1
    assert set(np.unique(label)) == {0, 1, 2}
    assert image[label == 2].mean() > image[label == 1].mean() > image[label == 0].mean()


def test_training_samples_are_patches_and_reproducible(kits_fixture):
    train, _ = data.scan(kits_fixture)
    ds = data.TrainSet(train, PATCH, oversampling=0.4, seed=3)
    image, label = ds[(1, 5)]
    assert image.shape == label.shape == (1, *PATCH)
    assert image.dtype == torch.float32 and label.dtype == torch.uint8
    again, _ = ds[(1, 5)]
    other, _ = ds[(2, 5)]
    assert torch.equal(image, again) and not torch.equal(image, other)


def test_training_samples_read_from_memory_maps_equal_those_of_whole_volumes(kits_fixture):
    train, _ = data.scan(kits_fixture)
    # patches as wide as the volumes: a crop of the memory map is then a contiguous,
    # read-only view, which the sample must not be
    patch = (PATCH[0], *min(c.shape[2:] for c in train[:4]))
    ds = data.TrainSet(train[:4], patch, oversampling=1.0, seed=3)
    for epoch in (0, 1):          # the first meeting of each case, then the cached one
        for index, case in enumerate(train[:4]):
            image, label = data.load(case)
            rng = np.random.default_rng([3, epoch, index])
            want = data.augment(rng, image, label, data.foreground(label), patch, 1.0)
            got = ds[(epoch, index)]
            assert np.array_equal(got[0].numpy(), want[0])
            assert np.array_equal(got[1].numpy(), want[1]) and want[1].any()
    for index, case in enumerate(train[:4]):   # samples are copies, whatever the draws
        mapped = [np.load(path, mmap_mode="r") for path in (case.image, case.label)]
        found = data.foreground(np.asarray(mapped[1]))
        for epoch in range(8):
            rng = np.random.default_rng([3, epoch, index])
            for out, source in zip(data.augment(rng, *mapped, found, patch, 1.0), mapped):
                assert out.flags.writeable and not np.shares_memory(out, source)


def test_foreground_crop_contains_foreground(kits_fixture):
    train, _ = data.scan(kits_fixture)
    _, label = data.load(train[0])
    rng = np.random.default_rng(0)
    for _ in range(10):
        box = data.foreground_crop(rng, data.foreground(label), label.shape[1:], PATCH)
        assert [hi - lo for lo, hi in box] == list(PATCH)
        assert all(0 <= lo and hi <= s for (lo, hi), s in zip(box, label.shape[1:]))
        assert label[(0, *(slice(lo, hi) for lo, hi in box))].any()


def test_epoch_order_gives_whole_disjoint_batches():
    order = [data.epoch_order(168, 7, 1, 8, r, 2) for r in (0, 1)]
    assert len(order[0]) == 21 and all(len(b) == 4 for b in order[0])
    seen = [i for rank in order for batch in rank for _, i in batch]
    assert sorted(seen) == list(range(168))


def test_bad_label_value_is_reported(tmp_path, kits_fixture):
    train, _ = data.scan(kits_fixture)
    case = train[0]
    label = np.load(case.label)
    label[0, 0, 0, 0] = 7
    np.save(tmp_path / "case_00001_y.npy", label)
    np.save(tmp_path / "case_00001_x.npy", np.load(case.image))
    copy_cases(kits_fixture, tmp_path, "00000")  # scan needs an evaluation case
    (bad,), _ = data.scan(tmp_path)
    with pytest.raises(UserError, match=r"case_00001_y\.npy: label values \[7\]"):
        data.load(bad)


@pytest.mark.parametrize("damage", ["all nan", "one inf", "one -inf"])
def test_non_finite_volume_is_refused_at_read(tmp_path, kits_fixture, damage):
    train, _ = data.scan(kits_fixture)
    image = np.load(train[0].image)
    if damage == "all nan":
        image[:] = np.nan
    else:
        image[0, 3, 4, 5] = np.inf if damage == "one inf" else -np.inf
    np.save(tmp_path / "case_00001_x.npy", image)
    shutil.copy(train[0].label, tmp_path / "case_00001_y.npy")
    copy_cases(kits_fixture, tmp_path, "00000")  # scan needs an evaluation case
    (bad,), _ = data.scan(tmp_path)  # headers only: the voxels are checked when read
    count = image.size if damage == "all nan" else 1
    with pytest.raises(UserError, match=re.escape(
            f"case 00001: {bad.image} holds {count} NaN or infinite voxels of {image.size}; ")):
        data.load(bad)
    huge = np.full_like(image, 3e30)  # finite, though its squares overflow float32
    np.save(bad.image, huge)
    assert np.array_equal(data.load(bad)[0], huge)


def copy_cases(src, dst, *case_ids):
    for case_id in case_ids:
        for kind in "xy":
            shutil.copy(src / f"case_{case_id}_{kind}.npy", dst)


@pytest.mark.parametrize("case_ids, words", [
    (("00001", "00002"), "none of the reference's 42 evaluation cases"),
    (("00000", "00003"), "only evaluation cases, no training case"),
])
def test_scan_refuses_an_empty_split(tmp_path, kits_fixture, case_ids, words):
    """Today: no evaluation cases log mean Dice nan at every evaluation and training goes on."""
    copy_cases(kits_fixture, tmp_path, *case_ids)
    with pytest.raises(UserError, match=re.escape(f"{tmp_path}: {words}")):
        data.scan(tmp_path)


def test_loader_processes_meet_each_case_once_a_run(kits_fixture, tmp_path, monkeypatch):
    """The training loader's processes serve every epoch: a case is read whole, checked and
    searched for its foreground once per process a run. New processes each epoch met every
    case anew each epoch (about 1 s a KiTS19-sized case), and fell far behind the GPU."""
    from benchmarks.unet3d import data
    from benchmarks.unet3d.workload import Unet3DWorkload
    from common.dist import DistEnv
    from common.precision import Precision
    from common.training import build_parser

    searched = tmp_path / "searched"
    real = data.foreground

    def counted(label):   # runs in the loader processes, forked after this patch
        with open(searched, "a") as f:
            f.write("x\n")
        return real(label)

    monkeypatch.setattr(data, "foreground", counted)
    args = build_parser(Unet3DWorkload).parse_args([
        "--data-dir", str(kits_fixture), "--device", "cpu", "--workers", "2",
        "--filters", "4,8,8,8,8", "--input-shape", "32,32,32", "--batch-size", "2", "--seed", "3"])
    wl = Unet3DWorkload(args, DistEnv(), Precision("fp32", "cpu"))
    wl.setup()
    try:
        epochs = 4
        for epoch in range(1, epochs + 1):
            assert sum(1 for _ in wl.epoch_batches(epoch)) == len(wl.train_cases) // 2
    finally:
        wl.close()
    calls = len(searched.read_text().splitlines())
    assert len(wl.train_cases) <= calls <= 2 * len(wl.train_cases) < epochs * len(wl.train_cases)
