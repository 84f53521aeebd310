"""Folders in ImageNet's layout shared by the reader tests."""

import pytest
from PIL import Image

from benchmarks.resnet import data
from benchmarks.resnet.fixture import write_fixture


@pytest.fixture(scope="module")
def imagenet_like(tmp_path_factory) -> data.ImageFolderIndex:
    """30 ImageNet-like JPEGs (24 train, 6 val), greyscale and CMYK ones among them."""
    root = write_fixture(tmp_path_factory.mktemp("data") / "inl", num_classes=2,
                         train_per_class=12, val_per_class=3, imagenet_like=True)
    return data.ImageFolderIndex.scan(root)


@pytest.fixture
def bad_folder(tmp_path):
    """``make(content)``: a folder whose train/ and val/ each hold a good JPEG and
    ``x.JPEG`` with ``content``, scanned."""
    def make(content: bytes) -> data.ImageFolderIndex:
        for split in ("train", "val"):
            (tmp_path / split / "n1").mkdir(parents=True)
            Image.new("RGB", (40, 30)).save(tmp_path / split / "n1" / "a.JPEG")
            (tmp_path / split / "n1" / "x.JPEG").write_bytes(content)
        return data.ImageFolderIndex.scan(tmp_path)
    return make
