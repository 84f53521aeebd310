"""``resize-on-device``: the loader processes send each crop unresized, packed in one
buffer per slice, and the batch is resized where it trains. The batches equal the plain
``turbo`` path's within a level (float32 against its two uint8-rounded passes), crops too
large for the buffer's room are resized in the loader as before, and bad input keeps its
one-line errors. On a GPU the Triton kernel equals the reference (``-m gpu``)."""

import io

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from benchmarks.resnet import data, regions, turbo
from benchmarks.resnet.region_decode import RegionDecoder
from benchmarks.resnet.workload import ResNetWorkload
from common.errors import UserError
from common.training import build_parser

CPU = torch.device("cpu")
STD = torch.tensor(data.STD).view(1, 3, 1, 1)


def _loader(index, train, workers, resize_on_device, region_decode=True, batch=7, device=CPU):
    loader = data.build_loader(index, train, 64, batch, 0, 1, workers, device,
                               seed=11 if train else 0, decoder=turbo.TurboDecoder,
                               region_decode=region_decode, resize_on_device=resize_on_device)
    loader.memory_format = torch.channels_last
    return loader


@pytest.mark.parametrize("train,workers,region_decode",
                         [(True, 0, False), (True, 2, True), (False, 2, True), (False, 0, False)])
def test_batches_equal_the_plain_turbo_paths_within_a_level(imagenet_like, train, workers,
                                                            region_decode):
    """Same labels, order and layout as without the switch, two epochs of training; every
    pixel within a level, most of them equal after rounding."""
    plain = _loader(imagenet_like, train, workers, False, region_decode)
    packed = _loader(imagenet_like, train, workers, True, region_decode)
    try:
        for epoch in (1, 2) if train else (1,):
            pairs = list(zip(plain.epoch(epoch), packed.epoch(epoch), strict=True))
            assert pairs
            diffs = []
            for (a, la), (b, lb) in pairs:
                assert torch.equal(la, lb) and a.shape == b.shape and b.dtype == torch.float32
                assert b.is_contiguous(memory_format=torch.channels_last)
                diffs.append(((a - b) * STD).abs())
            diffs = torch.cat(diffs)
            assert diffs.max() <= 1 + 1e-3, diffs.max()
            assert diffs.mean() < 0.35, diffs.mean()
    finally:
        plain.close()
        packed.close()


def _jpeg(width, height, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).convert(
        mode).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("decoder", [None, "region"])
def test_packed_crops_are_the_decoded_boxes_and_those_without_room_are_resized(decoder):
    """Each ``meta`` row names its crop in the buffer: the whole decode's box bit for bit,
    after the region decoder's extra MCU columns (``skip``) where it decodes. A crop larger
    than the room left is resized in the loader and sent at the output size: the plain
    path's crop exactly."""
    region = RegionDecoder() if decoder else None
    blob, size = _jpeg(333, 250), 64
    pixels = simplejpeg.decode_jpeg(blob, colorspace="RGB")
    buf = torch.zeros(1 << 20, dtype=torch.uint8)
    meta = np.zeros((3, regions.FIELDS), dtype=np.int64)
    boxes = [((37, 6, 200, 150), True), ((0, 0, 333, 250), False), ((5, 6, 20, 15), False)]
    used = 0
    for j, (box, flip) in enumerate(boxes):
        def plan(w, h, box=box, flip=flip):
            return box, flip
        room = 10_000 if j == 1 else buf.numel() - used   # the whole image does not fit
        used = turbo.pack_crop(blob, "x", size, plan, region, buf, used, room, meta[j])
    assert used <= buf.numel()
    for j in (0, 2):
        (left, top, w, h), flip = boxes[j]
        assert meta[j, 3:].tolist() == [w, h, flip]
        assert meta[j, 2] == ((left % 16 or 16) if decoder and left else 0)
        assert np.array_equal(regions.region(buf, meta[j]).numpy(),
                              pixels[top:top + h, left:left + w])
    assert meta[1, 1:].tolist() == [size, 0, size, size, 0]
    want = turbo.decode_crop(blob, "x", size, lambda w, h: boxes[1])
    assert np.array_equal(regions.region(buf, meta[1]).numpy(), want)
    got = regions.resize(buf, torch.from_numpy(meta[1:2]), size)
    plain = data.normalize_on_device(torch.from_numpy(want)[None], CPU)
    torch.testing.assert_close(got, plain, rtol=0, atol=1e-5)


def test_a_slice_over_its_budget_still_fits(imagenet_like, monkeypatch):
    """With a buffer of 70% of what a slice's crops take whole, crops are sent whole while
    they fit and resized in the loader once the rest would not: the buffer never
    overflows and the batch still equals the plain path's within a level."""
    keys, size, tile = (1, list(range(12))), 224, 224 * 224 * 3
    def packed(budget):
        monkeypatch.setattr(turbo, "REGION_BUDGET", budget)
        return turbo.DecodedSlices(imagenet_like.train, size, True, 3, True, None,
                                   regions=True)[keys]
    budget = 0.7 * len(packed(100)[0]) / (12 * tile)
    buf, meta, files, labels = packed(budget)
    assert len(buf) <= 12 * tile * budget and len(labels) == 12 and not len(files)
    resized = (meta[:, 1] == size) & (meta[:, 3] == size) & (meta[:, 4] == size)
    assert 0 < resized.sum() < 12   # some sent whole, some resized here
    plain = turbo.DecodedSlices(imagenet_like.train, size, True, 3, True)[keys][0]
    diff = (regions.resize(buf, meta, size) - data.normalize_on_device(plain, CPU)) * STD
    assert diff.abs().max() <= 1 + 1e-3


@pytest.mark.parametrize("content", [b"", b"not a jpeg", _jpeg(64, 48)[:900]])
def test_unreadable_files_are_named(bad_folder, content):
    index = bad_folder(content)
    for workers in (0, 1):
        loader = _loader(index, False, workers, True, batch=2)
        try:
            with pytest.raises(UserError, match=r"x\.JPEG: cannot decode JPEG"):
                list(loader.epoch(0))
        finally:
            loader.close()


def test_it_needs_turbo(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser(ResNetWorkload).parse_args(["--opt", "resize-on-device"])
    assert exc.value.code == 2 and "resize-on-device requires turbo" in capsys.readouterr().err


def _random_packed(n, seed, device):
    """``n`` crops of random sizes (upscaled and downscaled up to 6x, 1-pixel ones), pitch
    and skip, mirrored or not, packed at odd offsets."""
    g = torch.Generator().manual_seed(seed)
    rows, chunks, used = [], [], 0
    for k in range(n):
        w, h = (int(v) for v in torch.randint(1, 400, (2,), generator=g))
        if k < 2:
            w, h = (1, 1) if k == 0 else (1344, 900)
        skip = int(torch.randint(0, 20, (1,), generator=g))
        pitch = w + skip + int(torch.randint(0, 20, (1,), generator=g))
        pad = int(torch.randint(0, 5, (1,), generator=g))
        chunks.append(torch.randint(0, 256, (pad + h * pitch * 3,), dtype=torch.uint8,
                                    generator=g))
        rows.append([used + pad, pitch, skip, w, h, k % 2])
        used += pad + h * pitch * 3
    return torch.cat(chunks).to(device), torch.tensor(rows, dtype=torch.int64, device=device)


@pytest.mark.gpu
@pytest.mark.parametrize("size", [224, 64])
def test_the_triton_kernel_equals_the_reference_on_the_gpu(size):
    """Against the reference path on the CPU (torch's CPU antialiased filter, which the CPU
    tests compare with the plain path): within 1e-4 after normalisation, 0.006 levels."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from benchmarks.resnet import regions_triton
    packed, meta = _random_packed(40, size, torch.device("cuda"))
    got = regions_triton.resize(packed, meta, size)
    assert got.is_contiguous(memory_format=torch.channels_last)
    want = regions.resize_reference(packed.cpu(), meta.cpu(), size)
    worst = (got.cpu() - want).abs().amax(dim=(1, 2, 3))
    bad = [(k, float(worst[k]), meta[k].tolist()) for k in range(len(worst)) if worst[k] > 1e-4]
    assert got.shape == want.shape and not bad, bad[:5]


@pytest.mark.gpu
@pytest.mark.parametrize("resize_on_device", [False, True])
def test_gpu_batches_equal_the_cpu_loaders(imagenet_like, resize_on_device):
    """On a GPU (copies and resize on a side stream, the consumer's stream waiting for
    them), two epochs of batches equal the same loader's on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cuda = torch.device("cuda")
    cpu = _loader(imagenet_like, True, 2, resize_on_device)
    gpu = _loader(imagenet_like, True, 2, resize_on_device, device=cuda)
    try:
        for epoch in (1, 2):
            pairs = list(zip(cpu.epoch(epoch), gpu.epoch(epoch), strict=True))
            for (a, la), (b, lb) in pairs:
                assert b.device.type == "cuda" and torch.equal(la, lb.cpu())
                torch.testing.assert_close(b.cpu(), a, rtol=0, atol=1e-4)
    finally:
        cpu.close()
        gpu.close()
