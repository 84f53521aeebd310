"""The image cache (optimisation ``image-cache``) and its fused jitter against the CPU input
pipeline, on the CPU."""

from pathlib import Path

import pytest
import torch

from benchmarks.ssd import data, fused_jitter, image_cache
from benchmarks.ssd.workload import SSDWorkload
from common.coco.data import decode_image_chw, load_split
from common.coco.fixture import write_fixture
from common.dist import DistEnv
from common.errors import UserError, one_line
from common.precision import Precision
from common.training import build_parser

LOADER = dict(batch_size=2, seed=3, max_boxes=8, rank=1, world_size=2)


def _cached(train, max_side, storage="device", fused=False, **loader):
    cached = image_cache.cached(data.build_train_loader(train, **LOADER, **loader), storage,
                                max_side)
    if fused:
        fused_jitter.apply(cached)
    return cached


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("coco") / "fx", train=12, val=2,
                         image_size=128, classes=3, seed=0)


@pytest.fixture(scope="module")
def train(root):
    return load_split(root, "train")


@pytest.mark.parametrize("storage, fused", [(s, False) for s in image_cache.STORAGES]
                         + [("device", True)])
def test_cache_loader_matches_the_cpu_loader(train, storage, fused):
    cpu = data.build_train_loader(train, **LOADER)
    cached = _cached(train, 144, storage, fused)   # 144: no shrinking
    assert len(cached) == len(cpu) == len(train) // 4
    for epoch in (0, 1):
        assert cached.batches(epoch) == cpu.batches(epoch)
        pairs = list(zip(cpu.epoch(epoch), cached.epoch(epoch), strict=True))
        for (x, *targets), (y, *cached_targets) in pairs:
            assert all(torch.equal(a, b) for a, b in zip(targets, cached_targets, strict=True))
            assert y.shape == x.shape and y.dtype == x.dtype
            # measured at most 2e-5 (normalised units): grid_sample vs interpolate rounding
            torch.testing.assert_close(y, x, atol=1e-4, rtol=0)


def _per_image_jitter(x, factors, order):
    """ColorJitter on one image, op by op, as the CPU pipeline ran it before batching."""
    for op in order:
        f = factors[op]
        grey = (x * torch.tensor(data.GREY).view(3, 1, 1)).sum(0, keepdim=True)
        if op == 0:
            x = (f * x).clamp(0, 1)
        elif op == 1:
            x = (f * x + (1 - f) * grey.mean()).clamp(0, 1)
        elif op == 2:
            x = (f * x + (1 - f) * grey).clamp(0, 1)
        else:
            x = data.adjust_hue(x, f)
    return x


def test_batched_color_jitter_equals_a_per_sample_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(8, 3, 12, 10, generator=g)
    factors = [data.jitter_params(data.sample_generator(0, 0, i))[0] for i in range(8)]
    # every op at every position, so the per-sample selection matters
    order = [[(k + j) % 4 for j in range(4)] for k in range(4)]
    order += [list(reversed(o)) for o in order]
    out = data.apply_color_jitter(x, torch.tensor(factors), torch.tensor(order))
    for b in range(8):
        torch.testing.assert_close(out[b], _per_image_jitter(x[b], factors[b], order[b]),
                                   atol=1e-5, rtol=0)
    single = data.apply_color_jitter(x[5:6], torch.tensor(factors[5:6]),
                                     torch.tensor(order[5:6]))
    torch.testing.assert_close(single[0], out[5], atol=1e-6, rtol=0)


def test_crops_and_flips_put_a_square_where_its_box_goes():
    image = torch.zeros(3, 80, 120, dtype=torch.uint8)
    image[:, 20:40, 30:60] = 255
    padded = torch.full((3, 3, 96, 128), 255, dtype=torch.uint8)   # bright padding
    padded[:, :, :80, :120] = image
    windows = [(0, 0, 120, 80), (20, 10, 120, 80), (25, 15, 75, 55)]
    flips = [False, True, True]
    out = image_cache.crop_flip_resize(padded, torch.tensor(windows, dtype=torch.float64),
                                       torch.tensor(flips), 300)
    assert out.shape == (3, 3, 300, 300)
    square, label = torch.tensor([[0.25, 0.25, 0.5, 0.5]]), torch.tensor([1])
    for x, window, flip in zip(out, windows, flips):
        box, _ = data.crop_boxes(square, label, 120, 80, window)
        if flip:
            box = data.flip_boxes(box)
        bright = x[0] > 0.5
        rows, cols = bright.any(1).nonzero()[:, 0], bright.any(0).nonzero()[:, 0]
        found = torch.tensor([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1], dtype=torch.float32)
        torch.testing.assert_close(found, box[0] * 300, atol=1.0, rtol=0)
        assert bright.sum() == pytest.approx(float((found[2:] - found[:2]).prod()), rel=0.01)
        assert (x[:, -1] < 0.01).all() and (x[:, :, -1] < 0.01).all()   # no padding read


def test_cache_fills_on_first_use_and_holds_every_image(train):
    loader = _cached(train, 144, num_workers=2)
    cache = loader.cache
    assert not cache.filled and cache.nbytes == len(train) * 3 * 144 * 144
    images, *_ = next(iter(loader.epoch(0)))
    assert cache.filled and images.shape == (2, 3, 300, 300)
    assert cache.images.shape == (len(train), 3, 144, 144)
    assert cache.images.dtype == torch.uint8 and cache.images.nbytes == cache.nbytes
    for i, r in enumerate(train.records):
        assert tuple(cache.sizes[i].tolist()) == (r.height, r.width)
        assert torch.equal(cache.images[i, :, :r.height, :r.width], decode_image_chw(r.path))
        assert not cache.images[i, :, r.height:].any() and not cache.images[i, ..., r.width:].any()


def test_a_corrupt_image_is_named_in_one_line_when_the_cache_fills(tmp_path):
    root = write_fixture(tmp_path / "fx", train=3, val=1, image_size=32, classes=2, seed=0)
    split = load_split(root, "train")
    Path(split.records[1].path).write_bytes(b"not a jpeg")
    cache = image_cache.ImageCache(split.records, "cpu", 32, num_workers=1)
    with pytest.raises(UserError) as err:
        cache.fill()
    assert one_line(err.value).startswith(f"{split.records[1].path}: cannot decode image")
    with pytest.raises(UserError, match="--cache-side 0"):
        image_cache.ImageCache(split.records, "cpu", 0)


def test_shrinking_keeps_the_aspect_and_never_enlarges(train):
    assert image_cache.cached_size(480, 640, 384) == (288, 384)
    assert image_cache.cached_size(640, 427, 384) == (384, 256)
    assert image_cache.cached_size(100, 50, 384) == (100, 50)
    image = torch.randint(0, 256, (3, 90, 120), dtype=torch.uint8)
    assert image_cache.downscale(image, 60).shape == (3, 45, 60)
    assert image_cache.downscale(image, 200) is image

    cache = image_cache.ImageCache(train.records, "cpu", 64)
    for i, r in enumerate(train.records):
        h, w = cache.sizes[i].tolist()
        assert max(h, w) == 64 and abs(h / w - r.height / r.width) <= 1 / min(h, w)
        small = image_cache.downscale(decode_image_chw(r.path), 64)
        assert torch.equal(cache.images[i, :, :h, :w], small)
    # windows scaled to the shrunk images: near the CPU pipeline (measured mean 0.03), not equal
    cpu = data.build_train_loader(train, **LOADER)
    shrunk = _cached(train, 64)
    for (x, *targets), (y, *cached_targets) in zip(cpu.epoch(0), shrunk.epoch(0), strict=True):
        assert all(torch.equal(a, b) for a, b in zip(targets, cached_targets, strict=True))
        assert (y - x).abs().mean() < 0.1


def test_the_workload_optimisation_trains_from_the_cache(root):
    args = build_parser(SSDWorkload).parse_args(
        ["--data-dir", str(root), "--seed", "1", "--opt", "image-cache=device", "--cache-side",
         "96", "--width", "8", "--workers", "0", "--batch-size", "2", "--max-boxes", "8"])
    wl = SSDWorkload(args, DistEnv(), Precision("fp32", "cpu"))
    wl.setup()
    assert isinstance(wl.train_loader, image_cache.CachedLoader)
    assert wl.train_loader.cache.max_side == 96 and not wl.train_loader.cache.filled
    assert isinstance(wl.eval_loader, data.Loader) and not wl.eval_loader.train
    batch = next(iter(wl.epoch_batches(1)))
    assert torch.isfinite(wl.train_step(*batch))


def test_fused_color_jitter_equals_the_batched_reference():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(8, 3, 12, 10, generator=g)
    factors = torch.tensor([data.jitter_params(data.sample_generator(1, 0, i))[0]
                            for i in range(8)])
    order = [[(k + j) % 4 for j in range(4)] for k in range(4)]
    order = torch.tensor(order + [list(reversed(o)) for o in order])
    expected = data.apply_color_jitter(x, factors, order)
    f = factors.view(-1, 4, 1, 1, 1)
    torch.testing.assert_close(fused_jitter.jitter_steps(x, f, order), expected, atol=0, rtol=0)
    torch.testing.assert_close(fused_jitter.apply_color_jitter(x, factors, order), expected,
                               atol=1e-5, rtol=0)      # compiled: fused arithmetic


def test_fused_jitter_warm_up_builds_the_batches_compiled_code():
    fused_jitter.warm_up(8, 12, torch.device("cpu"))
    x = torch.rand(8, 3, 12, 12, generator=torch.Generator().manual_seed(2))
    order = torch.tensor([[(k + j) % 4 for j in range(4)] for k in range(8)])
    with torch.compiler.set_stance("fail_on_recompile"):     # raises if it would compile
        out = fused_jitter.apply_color_jitter(x, torch.full((8, 4), 1.2), order)
    assert out.shape == x.shape and not torch.equal(out, x)


def test_fused_jitter_without_an_image_cache_is_one_line(capsys):
    with pytest.raises(SystemExit):
        build_parser(SSDWorkload).parse_args(["--synthetic-data", "--opt", "fused-jitter"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "fused-jitter requires image-cache" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_host_cache_is_read_by_the_gpu_in_place(train):
    """``image-cache=host`` on a GPU: the cache stays in host memory, page-locked and mapped,
    and the GPU's batches equal those of a cache held on the device; closing unmaps it."""
    host, device = (_cached(train, 144, storage, device="cuda") for storage in ("host", "device"))
    for (x, *targets), (y, *other) in zip(host.epoch(0), device.epoch(0), strict=True):
        assert x.device.type == "cuda" and torch.equal(x, y)
        assert all(torch.equal(a, b) for a, b in zip(targets, other, strict=True))
    assert host.cache.images.device.type == "cuda" and host.cache._host.device.type == "cpu"
    assert host.cache.images.data_ptr() == host.cache._host.data_ptr()
    for loader in (host, device):
        loader.close()
    assert not host.cache.filled and host.cache._host is None
