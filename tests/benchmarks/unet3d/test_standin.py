"""``benchmarks.unet3d.standin``: KiTS19's cases at their preprocessed sizes (a fraction of
the reference's split) in the preprocessed format, for dry runs."""

from types import SimpleNamespace

import numpy as np

from benchmarks.unet3d import data, standin
from benchmarks.unet3d.workload import Unet3DWorkload


def test_a_fraction_of_the_split_in_the_preprocessed_format(tmp_path, monkeypatch):
    numbers = standin.cases(0.1)   # 17 of the 168 training cases, 4 of the 42 evaluation ones
    assert len(numbers) == 21 and sum(f"{n:05d}" in data.EVAL_CASES for n in numbers) == 4
    monkeypatch.setattr(standin, "DEPTH", (40, 50))   # the real sizes: about 150 MB a case
    monkeypatch.setattr(standin, "SIDE", (30, 36))
    one = standin.write_standin(tmp_path / "one", fraction=0.01, workers=1)
    two = standin.write_standin(tmp_path / "two", fraction=0.01, workers=2)
    train, evaluation = data.scan(one)
    assert (len(train), len(evaluation)) == (2, 1)
    for c in train + evaluation:
        image, label = np.load(c.image), np.load(c.label)
        assert image.dtype == np.float32 and label.dtype == np.uint8
        assert image.shape == label.shape and 40 <= image.shape[1] <= 50
        assert set(np.unique(label)) == {0, 1, 2}                  # kidney and tumour
        assert np.array_equal(image, np.load(two / c.image.name))  # any number of writers
    wl = SimpleNamespace(synthetic=False, train_cases=train, val_cases=evaluation,
                         args=SimpleNamespace(data_dir=one))
    assert Unet3DWorkload.dataset.fget(wl).startswith("stand-in: KiTS19's case sizes")


def test_one_case_at_the_real_size():
    image, label = standin.case(np.random.default_rng(1))
    assert 128 <= image.shape[1] <= 450 and all(270 <= s <= 370 for s in image.shape[2:])
    assert set(np.unique(label)) == {0, 1, 2}
