"""KiTS19 raw NIfTI cases -> the MLPerf preprocessed npy files that ``data.py`` reads.

``python -m benchmarks.unet3d.prepare_data --data-dir kits19/data --results-dir DIR``

Follows the reference's ``preprocess_dataset.py``: for ``case_00000`` ..
``case_00209`` read ``imaging.nii.gz`` and ``segmentation.nii.gz`` (nibabel,
array order as stored), resample to 1.6 x 1.2 x 1.2 mm (trilinear with
aligned corners for the image, nearest for the label) unless the spacing
already is that, clip to [-79, 304] HU and normalise with mean 101 and std
76.9, pad every axis to at least 128 by repeating the edge, and save
``case_XXXXX_x.npy`` (float32) and ``case_XXXXX_y.npy`` (uint8), both (1, D, H, W).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from common.cli import OneLineParser, one_line_errors
from common.errors import UserError

MAX_ID = 210
MEAN, STD = 101.0, 76.9
CLIP = (-79.0, 304.0)
TARGET_SPACING = (1.6, 1.2, 1.2)
MIN_SHAPE = (128, 128, 128)


def resample(image: np.ndarray, label: np.ndarray, spacing) -> tuple[np.ndarray, np.ndarray]:
    if list(spacing) == list(TARGET_SPACING):
        return image, label
    shape = (np.array(spacing) / np.array(TARGET_SPACING) * np.array(image.shape)).astype(int)
    size = tuple(int(s) for s in shape)
    img = F.interpolate(torch.from_numpy(image)[None, None], size=size, mode="trilinear",
                        align_corners=True)
    lbl = F.interpolate(torch.from_numpy(label)[None, None], size=size, mode="nearest")
    return img[0, 0].numpy(), lbl[0, 0].numpy()


def preprocess(image: np.ndarray, label: np.ndarray, spacing) -> tuple[np.ndarray, np.ndarray]:
    """One case: (D, H, W) HU image and labels -> normalised (1, D', H', W') float32 / uint8."""
    image, label = resample(image.astype(np.float32), label.astype(np.uint8), spacing)
    image = (np.clip(image, *CLIP) - MEAN) / STD
    pads = [(0, 0)] + [(max(0, m - s) // 2, max(0, m - s) - max(0, m - s) // 2)
                       for s, m in zip(image.shape, MIN_SHAPE)]
    image = np.pad(image[None], pads, mode="edge").astype(np.float32)
    label = np.pad(label[None], pads, mode="edge").astype(np.uint8)
    return image, label


def prepare_case(case_dir: Path, out_dir: Path) -> tuple[int, ...]:
    import nibabel

    paths = [case_dir / "imaging.nii.gz", case_dir / "segmentation.nii.gz"]
    for p in paths:
        if not p.is_file():
            raise UserError(f"{p}: missing (expected the KiTS19 layout case_XXXXX/imaging.nii.gz "
                            f"and segmentation.nii.gz)")
    img_nii, lbl_nii = (nibabel.load(str(p)) for p in paths)
    spacing = img_nii.header["pixdim"][1:4].tolist()
    image, label = preprocess(img_nii.get_fdata(), lbl_nii.get_fdata(), spacing)
    np.save(out_dir / f"{case_dir.name}_x.npy", image, allow_pickle=False)
    np.save(out_dir / f"{case_dir.name}_y.npy", label, allow_pickle=False)
    return image.shape


@one_line_errors
def main(argv=None) -> int:
    p = OneLineParser(prog="python -m benchmarks.unet3d.prepare_data", description=__doc__)
    p.add_argument("--data-dir", type=Path, required=True, help="KiTS19 data/ with case_XXXXX/")
    p.add_argument("--results-dir", type=Path, required=True)
    a = p.parse_args(argv)
    cases = sorted(d for d in a.data_dir.glob("case_*") if d.is_dir()
                   and int(d.name.split("_")[1]) < MAX_ID) if a.data_dir.is_dir() else []
    if not cases:
        raise UserError(f"{a.data_dir}: no case_XXXXX folders (the KiTS19 data/ folder)")
    a.results_dir.mkdir(parents=True, exist_ok=True)
    for case in cases:
        print(f"{case.name}: {prepare_case(case, a.results_dir)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
