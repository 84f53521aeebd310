"""The ``nvjpeg`` backend's host and tensor parts against the Pillow reader and F.interpolate.

nvJPEG itself needs a GPU; here its place is taken by Pillow (``nvjpeg.pillow_decode``),
so everything else (headers, crop plans, the batched crop/resize, batching, errors) runs
on the CPU. The GPU test at the end compares the real backend with that stand-in."""

import itertools
import math
import random
import sys
import threading
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from scipy import stats

from benchmarks.resnet import data, nvjpeg, turbo
from benchmarks.resnet.workload import ResNetWorkload
from common.errors import UserError
from common.training import build_parser

CPU = torch.device("cpu")
STD = torch.tensor(data.STD).view(1, 3, 1, 1)
MEAN = torch.tensor(data.MEAN).view(1, 3, 1, 1)


@pytest.fixture(scope="module")
def index(imagenet_like):
    return imagenet_like


def _loaders(index, train, size=32, batch=6, workers=0):
    samples = index.train if train else index.val
    ref = data.Loader(samples, train, batch, 0, 1, 7,
                      data.pillow_decoder(samples, size, train, 7, batch, 0, CPU))
    new = data.Loader(samples, train, batch, 0, 1, 7,
                      nvjpeg.BatchedDecoder(samples, size, train, 7, batch, workers, CPU,
                                             nvjpeg.pillow_decode))
    ref.memory_format = new.memory_format = torch.channels_last
    return ref, new


def test_persistent_workers_serve_each_epoch_its_own_crops(index):
    """One set of loader processes serves epochs 1, 2 and 1 again (also after a pass left
    unfinished): each pass equals a fresh in-process reader's for that epoch, and the epoch
    in each item's key sets its crops."""
    planned = nvjpeg.PlannedBatches(index.train, 32, True, 7)
    batch = list(range(6))
    assert not torch.equal(planned[1, batch][3], planned[2, batch][3])
    _, new = _loaders(index, True, workers=2)
    _, fresh = _loaders(index, True)
    next(iter(new.epoch(3)))
    for epoch in (1, 2, 1):
        for (a, la), (b, lb) in zip(fresh.epoch(epoch), new.epoch(epoch), strict=True):
            assert torch.equal(la, lb) and torch.equal(a, b)


@pytest.mark.parametrize("train", [True, False])
def test_same_labels_shapes_and_ranges_as_the_pillow_reader(index, train):
    ref, new = _loaders(index, train)
    pairs = list(zip(ref.epoch(2), new.epoch(2)))
    assert len(pairs) == len(ref) == len(new)
    lo, hi = (0 - MEAN) / STD, (255 - MEAN) / STD
    for (a, la), (b, lb) in pairs:
        assert torch.equal(la, lb) and lb.dtype == torch.int64
        assert b.shape == a.shape and b.dtype == torch.float32
        assert b.is_contiguous(memory_format=torch.channels_last)
        assert ((b >= lo - 1e-4) & (b <= hi + 1e-4)).all()
        # Same crops and flips; only the filters differ (Pillow antialiases, see below), so
        # each image's channel means agree within a few pixel levels.
        means = ((a - b) * STD).mean(dim=(2, 3)).abs()
        assert means.max() < 6, means.max()


def test_batched_crop_resize_equals_interpolate_of_each_crop():
    """Max difference 1e-2 pixel levels (float rounding) from F.interpolate per image."""
    g = torch.Generator().manual_seed(0)
    shapes = [(37, 50), (120, 80), (64, 64), (300, 200), (5, 400)]
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
              for h, w in shapes]
    boxes = torch.tensor([[0, 0, 50, 37], [5, 7, 30, 100], [10, 3, 9, 11], [20, 30, 180, 250],
                          [100, 1, 250, 4]])
    flips = torch.tensor([False, True, True, False, True])
    dims = torch.tensor(shapes)
    n = 3 * dims[:, 0] * dims[:, 1]
    flat = torch.cat([im.reshape(-1) for im in images])
    out = nvjpeg.crop_resize_normalize(flat, torch.cumsum(n, 0) - n, dims, boxes, flips, 24)
    assert out.shape == (5, 3, 24, 24) and out.is_contiguous(memory_format=torch.channels_last)
    for b, image in enumerate(images):
        left, top, w, h = boxes[b].tolist()
        want = F.interpolate(image[None, :, top:top + h, left:left + w].float(), size=(24, 24),
                             mode="bilinear", align_corners=False)
        want = want.flip(3) if flips[b] else want
        assert ((out[b:b + 1] - (want - MEAN) / STD) * STD).abs().max() < 1e-2


def _smooth_photo(width, height, seed):
    """A smooth colour image (the low frequencies of a photograph)."""
    rng = np.random.default_rng(seed)
    grid = rng.uniform(0, 255, (6, 8, 3)).astype(np.uint8)
    return Image.fromarray(grid).resize((width, height), Image.BICUBIC)


@pytest.mark.parametrize("width, height", [(500, 375), (375, 500), (333, 500), (640, 480)])
def test_evaluation_transform_matches_pillow_resize_256_centre_crop_224(width, height):
    """Mean difference under 1.5 pixel levels, max under 8, from the reference's Pillow
    transform (shorter side bilinearly to 256, centre 224 crop) on smooth images: the crop
    (``center_crop_box``, whole source pixels) sits up to a source pixel from the
    reference's (whole pixels after the resize), and Pillow antialiases its 1.5-1.9x shrink."""
    im = _smooth_photo(width, height, width + height)
    scale = 256 / min(width, height)
    resized = im.resize((round(width * scale), round(height * scale)), Image.BILINEAR)
    left, top = (resized.width - 224) // 2, (resized.height - 224) // 2
    want = torch.from_numpy(np.array(resized.crop((left, top, left + 224, top + 224))))
    want = want.permute(2, 0, 1)[None].float()
    chw = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1)
    box, flip = data.crop_plan(width, height, 224, False, 0, 0, 0)
    got = nvjpeg.crop_resize_normalize(chw.reshape(-1), torch.tensor([0]),
                                       torch.tensor([[height, width]]), torch.tensor([box]),
                                       torch.tensor([flip]), 224) * STD + MEAN
    diff = (got - want).abs()
    assert diff.mean() < 1.5 and diff.max() < 8, (diff.mean(), diff.max())


def _boxes(width, height, n, seed=0):
    rng = random.Random(seed)
    return np.array([data.random_resized_crop_box(width, height, rng) for _ in range(n)])


def _expected(width, height, n, seed=1):
    """torchvision's RandomResizedCrop sampling (area uniform in 8-100%, aspect log-uniform
    in 3/4-4/3, 10 tries, then the fallback), drawn with numpy: (area fraction, aspect)."""
    rng = np.random.default_rng(seed)
    area = rng.uniform(0.08, 1.0, (n, 10)) * width * height
    aspect = np.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3), (n, 10)))
    w, h = np.round(np.sqrt(area * aspect)), np.round(np.sqrt(area / aspect))
    ok = (w <= width) & (h <= height) & (w > 0) & (h > 0)
    first = ok.argmax(1)
    rows = np.arange(n)
    w, h = w[rows, first], h[rows, first]
    fallback = ~ok.any(1)
    w[fallback], h[fallback] = width, height   # inputs here are within the ratio range
    return w * h / (width * height), w / h


@pytest.mark.parametrize("width, height", [(2000, 1500), (1500, 1500), (1200, 1600)])
def test_crop_boxes_follow_the_mlperf_distribution(width, height):
    """Area fraction and aspect ratio, as distributions (Kolmogorov-Smirnov, 4000 draws),
    match the reference sampling, and every box lies in the MLPerf ranges."""
    n = 4000
    b = _boxes(width, height, n)
    assert (b[:, 0] >= 0).all() and (b[:, 1] >= 0).all()
    assert (b[:, 0] + b[:, 2] <= width).all() and (b[:, 1] + b[:, 3] <= height).all()
    area, aspect = b[:, 2] * b[:, 3] / (width * height), b[:, 2] / b[:, 3]
    assert area.min() >= 0.08 - 2e-3 and area.max() <= 1
    assert aspect.min() >= 3 / 4 - 5e-3 and aspect.max() <= 4 / 3 + 5e-3
    want_area, want_aspect = _expected(width, height, n)
    assert stats.ks_2samp(area, want_area).pvalue > 1e-3
    assert stats.ks_2samp(np.log(aspect), np.log(want_aspect)).pvalue > 1e-3
    # and not some other law: uniform area without the rejection would fail on a square
    uniform_area = np.random.default_rng(2).uniform(0.08, 1.0, n)
    if width == height:
        assert stats.ks_2samp(area, uniform_area).pvalue < 1e-3
    # flips: half, independent of the box
    flips = [data.crop_plan(width, height, 224, True, 3, 1, i)[1] for i in range(n)]
    assert abs(np.mean(flips) - 0.5) < 0.03


def test_extreme_aspect_falls_back_to_the_clamped_centre_crop():
    b = _boxes(1000, 100, 500)
    fallback = b[(b == [(1000 - 133) // 2, 0, 133, 100]).all(1)]
    assert len(fallback) > 0   # 10 misses happen for a 10:1 image
    assert (b[:, 2] / b[:, 3] <= 4 / 3 + 0.02).all()


def test_jpeg_headers_and_the_colour_modes_the_worker_routes(index):
    modes = {}
    for path, _ in index.train + index.val:
        with open(path, "rb") as f:
            blob = f.read()
        with Image.open(path) as im:
            width, height, components = nvjpeg.jpeg_header(blob)
            assert (width, height) == im.size
            assert components == {"L": 1, "RGB": 3, "CMYK": 4}[im.mode]
            modes[im.mode] = modes.get(im.mode, 0) + 1
    assert modes.get("L") and modes.get("CMYK")
    for bad in (b"", b"not a jpeg", b"\xff\xd8\xff\xe0\x00\x10JFIF"):
        with pytest.raises(ValueError):
            nvjpeg.jpeg_header(bad)
    batch = list(range(len(index.train)))
    sizes, dims, decoded_at = (nvjpeg.PlannedBatches(index.train, 32, True, 0)[1, batch][i]
                               for i in (1, 2, 6))
    cmyk = [j for j, (path, _) in enumerate(index.train) if Image.open(path).mode == "CMYK"]
    assert decoded_at == cmyk and all(sizes[j] == 0 for j in cmyk)
    assert all(n > 0 for j, n in enumerate(sizes) if j not in cmyk)


@pytest.mark.parametrize("share", [0.25, 0.5, 1.0])
def test_a_cpu_decode_share_is_decoded_in_the_workers_as_the_turbo_backend_does(index, share):
    """``cpu_share`` of each batch's positions, spread evenly, is decoded, cropped and resized
    in the loader process (CMYK files too, wherever they are): those crops equal the
    ``turbo`` backend's bit for bit, the others the backend's without a share."""
    batch = list(range(8))
    cmyk = {j for j in batch if Image.open(index.train[j][0]).mode == "CMYK"}
    item = nvjpeg.PlannedBatches(index.train, 32, True, 0, share)[1, batch]
    sizes, dims, decoded_at, crops = item[1], item[2], item[6], item[7]
    chosen = {j for j in batch if int((j + 1) * share) > int(j * share)}
    assert len(chosen) == round(share * len(batch)) and set(decoded_at) == chosen | cmyk
    assert all((n == 0) == (j in chosen | cmyk) for j, n in enumerate(sizes))
    assert crops.shape == (len(decoded_at), 32, 32, 3) and len(dims) == 8 - len(decoded_at)
    samples = index.train
    _, plain = _loaders(index, True, workers=1)
    ref = data.build_loader(index, True, 32, 6, 0, 1, 0, CPU, seed=7, decoder=turbo.TurboDecoder)
    split = data.Loader(samples, True, 6, 0, 1, 7, nvjpeg.BatchedDecoder(
        samples, 32, True, 7, 6, 1, CPU, nvjpeg.pillow_decode, cpu_share=share))
    split.memory_format = torch.channels_last
    on_cpu = torch.tensor([int((j + 1) * share) > int(j * share) for j in range(6)])
    for (r, lr), (a, la), (b, lb) in zip(ref.epoch(1), plain.epoch(1), split.epoch(1),
                                         strict=True):
        assert torch.equal(la, lb) and torch.equal(lr, lb)
        assert torch.equal(b[on_cpu], r[on_cpu]) and torch.equal(b[~on_cpu], a[~on_cpu])
        assert b.is_contiguous(memory_format=torch.channels_last)
    plain.close()
    split.close()


@pytest.mark.parametrize("items, message", [
    ("nvjpeg,cpu-decode-share=1.5", "optimisation cpu-decode-share=1.5: must be between 0 and 1"),
    ("cpu-decode-share=0.5", "optimisation cpu-decode-share requires nvjpeg"),
])
def test_a_cpu_decode_share_is_checked(capsys, items, message):
    with pytest.raises(SystemExit) as exc:
        build_parser(ResNetWorkload).parse_args(["--opt", items])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_imagenet_like_fixture_has_imagenet_like_sizes(index):
    files = [p for p, _ in index.train + index.val]
    sizes = [Image.open(p).size for p in files]
    kb = np.array([len(open(p, "rb").read()) for p in files]) / 1e3
    assert 50 < np.median(kb) < 160, np.median(kb)
    assert max(max(s) for s in sizes) <= 1600 and min(min(s) for s in sizes) >= 40
    assert any(w > h for w, h in sizes) and any(w < h for w, h in sizes)
    assert sum(max(s) == 500 for s in sizes) > len(sizes) / 2


@pytest.mark.parametrize("content", [b"", b"not a jpeg", b"\xff\xd8\xff\xdb\x00\x43"])
def test_unreadable_files_are_named(bad_folder, content):
    index = bad_folder(content)
    decode = nvjpeg.BatchedDecoder(index.val, 32, False, 0, 2, 0, CPU, nvjpeg.pillow_decode)
    with pytest.raises(UserError, match=r"x\.JPEG: cannot decode JPEG"):
        list(decode([0, 1], 0))


def test_files_nvjpeg_rejects_go_to_pillow_and_a_file_both_reject_is_named(monkeypatch,
                                                                            tmp_path):
    """A stand-in torchvision whose decoder fails on the whole batch and on one file:
    that file is decoded by Pillow; a truncated file that Pillow rejects too is named."""
    good = tmp_path / "good.JPEG"
    Image.new("RGB", (20, 10), (10, 200, 30)).save(good, quality=95)
    blob = good.read_bytes()
    refused = blob + b"x"        # valid for Pillow; the stand-in nvJPEG takes only ``blob``

    def decode_jpeg(x, mode, device):
        if isinstance(x, list) or bytes(x.numpy()) != blob:
            raise RuntimeError("nvjpeg status 2")
        return nvjpeg.pillow_chw(bytes(x.numpy()), "?")

    io_module = types.SimpleNamespace(decode_jpeg=decode_jpeg,
                                      ImageReadMode=types.SimpleNamespace(RGB=1))
    monkeypatch.setitem(sys.modules, "torchvision", types.ModuleType("torchvision"))
    monkeypatch.setitem(sys.modules, "torchvision.io", io_module)
    blobs = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in (blob, refused)]
    images = nvjpeg.nvjpeg_decode(blobs, ["a", "b"], CPU)
    assert [tuple(im.shape) for im in images] == [(3, 10, 20)] * 2
    truncated = torch.frombuffer(bytearray(blob[:len(blob) // 2]), dtype=torch.uint8)
    with pytest.raises(UserError, match="cut.JPEG: cannot decode JPEG"):
        nvjpeg.nvjpeg_decode([blobs[0], truncated], ["a", "cut.JPEG"], CPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("train,share", [(True, 0.0), (False, 0.0), (True, 0.5)])
def test_nvjpeg_backend_matches_its_pillow_stand_in_on_the_gpu(index, train, share):
    """Same labels and crops; nvJPEG's and libjpeg's IDCT and chroma upsampling differ by
    a pixel level or two, so the images agree within 3 levels on average (also with half
    of each batch decoded in the loader processes, on both sides)."""
    device = torch.device("cuda")
    samples = index.train if train else index.val
    real = data.build_loader(index, train, 64, 6, 0, 1, 2, device, seed=7 if train else 0,
                             decoder=nvjpeg.BatchedDecoder, cpu_share=share)
    real.memory_format = torch.channels_last
    stand_in = data.Loader(samples, train, 6, 0, 1, 7 if train else 0, nvjpeg.BatchedDecoder(
        samples, 64, train, 7 if train else 0, 6, 0, device, nvjpeg.pillow_decode,
        cpu_share=share))
    for (a, la), (b, lb) in zip(real.epoch(1), stand_in.epoch(1)):
        assert torch.equal(la, lb)
        assert a.is_contiguous(memory_format=torch.channels_last)
        assert ((a - b).abs() * STD.to(device)).mean() < 3


def test_ahead_keeps_order_raises_the_threads_error_and_stops_with_its_consumer():
    assert list(nvjpeg.ahead(range(7), CPU, lambda x: x * x)) == [x * x for x in range(7)]

    def bad(x):
        if x == 3:
            raise UserError("f.JPEG: cannot decode JPEG")
        return x
    with pytest.raises(UserError, match="f.JPEG"):
        list(nvjpeg.ahead(range(7), CPU, bad))
    endless = itertools.count()
    it = nvjpeg.ahead(endless, CPU, lambda x: x)
    assert next(it) == 0
    it.close()   # joins the thread, which would otherwise run on forever
    assert not any(t.name == "nvjpeg-ahead" for t in threading.enumerate())
    assert next(endless) <= 2 + 3   # the thread stopped a queue's depth or so ahead
