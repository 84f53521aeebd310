"""``region-decode``: libjpeg-turbo 3 decoding only the crop's region gives the whole
decode's crop bit for bit (every chroma subsampling, crops at the image's edges and on MCU
boundaries), the same batches as plain ``turbo``, and one-line errors.
The library comes from ``make turbojpeg`` (``make test`` builds it first)."""

import ctypes.util
import io
import random

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from benchmarks.resnet import data, turbo
from benchmarks.resnet.region_decode import LIB_ENV, RegionDecoder
from benchmarks.resnet.workload import ResNetWorkload
from common.errors import UserError
from common.training import build_parser

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def region():
    return RegionDecoder()


def _jpeg(width, height, mode="RGB", subsampling=2, seed=0):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[:height, :width]
    smooth = np.stack([(x * 3 + y) % 256, (y * 5) % 256, (x * y) % 256], -1)
    pixels = np.clip(smooth + rng.integers(-40, 40, smooth.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90, **({"subsampling": subsampling} if mode != "L" else {}))
    return buf.getvalue()


def _whole_crop(blob, box):
    left, top, w, h = box
    return simplejpeg.decode_jpeg(blob, colorspace="RGB")[top:top + h, left:left + w]


def _boxes(width, height, rng):
    """Edge cases (the whole image, corners, left on 8- and 16-pixel boundaries, one pixel)
    and random boxes."""
    yield from ((0, 0, width, height), (0, 0, 1, 1), (width - 1, height - 1, 1, 1),
                (16, 8, width - 16, height - 8), (32, 5, 17, 40), (8, 0, 9, height),
                (width - 33, height - 20, 33, 20))
    for _ in range(40):
        w, h = rng.randint(1, width), rng.randint(1, height)
        yield rng.randint(0, width - w), rng.randint(0, height - h), w, h


@pytest.mark.parametrize("mode,subsampling", [("RGB", 0), ("RGB", 1), ("RGB", 2), ("L", 0)])
def test_region_equals_the_whole_decodes_crop_bit_for_bit(region, mode, subsampling):
    """4:4:4, 4:2:2, 4:2:0 and greyscale, sides that are not multiples of the MCU."""
    rng = random.Random(subsampling)
    for width, height in ((203, 141), (64, 300)):
        blob = _jpeg(width, height, mode, subsampling)
        for box in _boxes(width, height, rng):
            seen = []
            def plan(w, h, box=box, seen=seen):
                seen.append((w, h))
                return box, True
            pixels, flip = region.crop(blob, plan)
            assert seen == [(width, height)] and flip
            assert np.array_equal(pixels, _whole_crop(blob, box)), box


def test_fixture_crops_equal_the_whole_decodes(region, imagenet_like):
    """Every ImageNet-like fixture file with its training and evaluation crops; the CMYK
    files are declined (the caller decodes them as before)."""
    declined = 0
    for i, (path, _) in enumerate([*imagenet_like.train, *imagenet_like.val]):
        with open(path, "rb") as f:
            blob = f.read()
        for train in (True, False):
            def plan(w, h, train=train, i=i):
                return data.crop_plan(w, h, 64, train, 5, 1, i)
            got = region.crop(blob, plan)
            if got is None:
                assert Image.open(path).mode == "CMYK"
                declined += 1
                continue
            box, _ = plan(*Image.open(path).size)
            assert np.array_equal(got[0], _whole_crop(blob, box))
    assert declined


def _loader(index, train, workers, region_decode, batch=7):
    return data.build_loader(index, train, 64, batch, 0, 1, workers, CPU,
                             seed=11 if train else 0, decoder=turbo.TurboDecoder,
                             region_decode=region_decode)


@pytest.mark.parametrize("train,workers", [(True, 0), (True, 2), (False, 2)])
def test_batches_equal_the_turbo_backends(imagenet_like, train, workers):
    """The same batches, bit for bit, with and without region-decode, in one process or
    in loader processes (the decoder crosses to them and opens the library there)."""
    plain, regional = (_loader(imagenet_like, train, workers, r) for r in (False, True))
    try:
        pairs = list(zip(plain.epoch(1), regional.epoch(1), strict=True))
        assert pairs
        for (a, la), (b, lb) in pairs:
            assert torch.equal(la, lb) and torch.equal(a, b)
    finally:
        plain.close()
        regional.close()


@pytest.mark.parametrize("content", [b"", b"not a jpeg", _jpeg(64, 48)[:900]])
def test_unreadable_files_are_named(bad_folder, content):
    """Files the region decoder declines go to the plain route, which names them."""
    loader = _loader(bad_folder(content), False, 0, True, batch=2)
    try:
        with pytest.raises(UserError, match=r"x\.JPEG: cannot decode JPEG"):
            list(loader.epoch(0))
    finally:
        loader.close()


def test_a_missing_or_old_library_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(LIB_ENV, str(tmp_path / "libturbojpeg.so.0"))
    with pytest.raises(UserError, match=r"libturbojpeg\.so\.0: cannot load libturbojpeg.*"
                                        r"make turbojpeg"):
        RegionDecoder()
    monkeypatch.setenv(LIB_ENV, ctypes.util.find_library("c"))
    with pytest.raises(UserError, match=r"older than 3\.0"):
        RegionDecoder()


def test_it_needs_turbo(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser(ResNetWorkload).parse_args(["--opt", "region-decode"])
    assert exc.value.code == 2 and "region-decode requires turbo" in capsys.readouterr().err


def test_decode_crop_uses_the_region_where_it_can(region):
    """``turbo.decode_crop`` with the decoder: the same crop as without it."""
    blob = _jpeg(333, 250)
    for box in ((5, 6, 200, 150), (16, 0, 100, 250)):
        for flip in (False, True):
            def plan(w, h, box=box, flip=flip):
                return box, flip
            assert np.array_equal(turbo.decode_crop(blob, "x", 64, plan, region),
                                  turbo.decode_crop(blob, "x", 64, plan))
