"""prepare_data: NIfTI case -> normalised, resampled, padded npy pair."""

import shutil

import nibabel
import numpy as np

from benchmarks.unet3d import data, prepare_data


def _write_case(root, shape, spacing):
    case = root / "case_00001"
    case.mkdir(parents=True)
    rng = np.random.default_rng(0)
    image = rng.uniform(-500, 500, shape)
    label = np.zeros(shape, np.uint8)
    label[2:6, 3:8, 3:8] = 1
    label[3:5, 4:6, 4:6] = 2
    for name, arr in (("imaging", image), ("segmentation", label)):
        nii = nibabel.Nifti1Image(arr, np.diag([*spacing, 1.0]))
        nii.header.set_zooms(spacing)
        nibabel.save(nii, str(case / f"{name}.nii.gz"))


def test_prepare_writes_the_reference_format(tmp_path):
    _write_case(tmp_path / "raw", (8, 12, 12), (3.2, 1.2, 1.2))
    assert prepare_data.main(["--data-dir", str(tmp_path / "raw"),
                              "--results-dir", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    for kind in "xy":  # scan needs an evaluation case too
        shutil.copy(out / f"case_00001_{kind}.npy", out / f"case_00000_{kind}.npy")
    (case,), _ = data.scan(out)
    image, label = data.load(case)
    # Depth resampled 3.2 -> 1.6 mm (8 -> 16 slices), then every axis edge-padded to 128.
    assert image.shape == label.shape == (1, 128, 128, 128)
    assert image.dtype == np.float32 and label.dtype == np.uint8
    lo, hi = ((np.array(prepare_data.CLIP) - prepare_data.MEAN) / prepare_data.STD)
    assert lo - 1e-5 <= image.min() and image.max() <= hi + 1e-5
    assert set(np.unique(label)) == {0, 1, 2}


def test_missing_raw_data_is_one_line(tmp_path, capsys):
    assert prepare_data.main(["--data-dir", str(tmp_path), "--results-dir",
                              str(tmp_path / "o")]) == 2
    assert "no case_XXXXX folders" in capsys.readouterr().err
