"""``turbo`` against the Pillow reader (the reference) on the
ImageNet-like fixture: the same batches up to the crops' border pixels, and the same
one-line errors."""

import io
import itertools

import numpy as np
import pytest
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image

from benchmarks.resnet import data, turbo
from common.errors import UserError

CPU = torch.device("cpu")
STD = torch.tensor(data.STD).view(1, 3, 1, 1)


@pytest.fixture(scope="module")
def index(imagenet_like):
    return imagenet_like


def _loader(index, train, backend, workers=0, batch=7):
    decoder = {"cpu": data.pillow_decoder, "turbo": turbo.TurboDecoder}[backend]
    loader = data.build_loader(index, train, 64, batch, 0, 1, workers, CPU,
                               seed=11 if train else 0, decoder=decoder)
    loader.memory_format = torch.channels_last
    return loader


def _pixel_differences(index, train, workers, epoch=1):
    """Per-batch |turbo - cpu| in pixel levels (0-255); labels asserted equal."""
    ref, new = _loader(index, train, "cpu"), _loader(index, train, "turbo", workers)
    try:
        out = []
        for (a, la), (b, lb) in zip(ref.epoch(epoch), new.epoch(epoch), strict=True):
            assert torch.equal(la, lb) and a.shape == b.shape
            assert b.is_contiguous(memory_format=torch.channels_last)
            out.append(((a - b) * STD).abs())
        return out
    finally:
        new.close()


@pytest.mark.parametrize("train,workers", [(True, 0), (True, 2), (False, 2)])
def test_batches_equal_the_pillow_readers_inside_each_crop(index, train, workers):
    """Same crops, flips, labels and order as the reference, in one process or split over
    loader processes (slices of each batch), for two epochs: inside each crop the pixels
    agree within 2 levels (torch's and Pillow's rounding); only the border pixels, where the
    reference's filter also reads outside the box, differ more."""
    for epoch in (1, 2) if train else (1,):
        diffs = torch.cat(_pixel_differences(index, train, workers, epoch))
        assert len(diffs) == (len(index.train) // 7 * 7 if train else len(index.val))
        assert diffs[:, :, 2:-2, 2:-2].max() <= 2 + 1e-3, diffs[:, :, 2:-2, 2:-2].max()
        assert diffs.mean() < 0.5, diffs.mean()


def test_training_passes_run_on_into_the_next_and_each_equals_a_fresh_pass(index):
    """The loader processes' queue runs on from one epoch's pass into the next (the next
    epoch's slices are queued before its pass is asked for), and every pass equals the same
    epoch's pass from a freshly built loader: in turn, after a pass left unfinished, and
    out of turn."""
    loader = _loader(index, True, "turbo", workers=2)
    try:
        for epoch, taken in ((1, None), (2, None), (3, 1), (3, None), (5, None), (6, None)):
            got = list(itertools.islice(loader.epoch(epoch), taken))
            if taken is None:
                assert epoch + 1 in loader._decode._plans   # queued while this pass ran
                want = list(_loader(index, True, "turbo").epoch(epoch))
                assert len(got) == len(want) == len(index.train) // 7
                for (a, la), (b, lb) in zip(got, want):
                    assert torch.equal(a, b) and torch.equal(la, lb)
    finally:
        loader.close()


def test_crops_equal_pillows_crop_then_resize_within_two_levels():
    """torchvision's ``RandomResizedCrop`` on a Pillow image crops, then resizes: the
    turbo backend's crops are that, within 2 levels, flipped where planned."""
    blob = _jpeg(333, 250)
    image = Image.open(io.BytesIO(blob)).convert("RGB")
    for box, size in (((5, 6, 200, 150), 64), ((0, 0, 333, 250), 224), ((100, 40, 30, 50), 64)):
        left, top, w, h = box
        want = np.asarray(image.crop((left, top, left + w, top + h)).resize(
            (size, size), Image.BILINEAR)).astype(int)
        got = turbo.decode_crop(blob, "x", size, lambda w_, h_, box=box: (box, False))
        assert got.shape == (size, size, 3) and np.abs(got - want).max() <= 2
        flipped = turbo.decode_crop(blob, "x", size, lambda w_, h_, box=box: (box, True))
        assert np.array_equal(flipped, got[:, ::-1])


@pytest.mark.parametrize("flip", [False, True])
def test_resize_into_the_batch_equals_interpolate(flip):
    """The resize written straight into a slot of the batch equals ``F.interpolate``'s
    antialiased bilinear result, bit for bit, from crops cut out of a larger image."""
    g = torch.Generator().manual_seed(9)
    image = torch.randint(0, 256, (300, 410, 3), dtype=torch.uint8, generator=g).numpy()
    batch = torch.zeros((3, 64, 64, 3), dtype=torch.uint8)
    for slot, (top, left, h, w) in enumerate(((0, 0, 300, 410), (17, 33, 120, 90),
                                             (250, 400, 40, 10))):
        crop = image[top:top + h, left:left + w]
        got = turbo._resize(crop, flip, 64, batch[slot])
        want = F.interpolate(torch.from_numpy(crop).permute(2, 0, 1)[None], size=(64, 64),
                             mode="bilinear", antialias=True,
                             align_corners=False)[0].permute(1, 2, 0)
        want = want.flip(1) if flip else want
        assert torch.equal(batch[slot], want) and np.shares_memory(got, batch[slot].numpy())


def test_greyscale_and_cmyk_files_are_among_those_compared(index):
    modes = {Image.open(p).mode for p, _ in index.train}
    assert {"RGB", "L", "CMYK"} <= modes
    cmyk = next(p for p, _ in index.train if Image.open(p).mode == "CMYK")
    with open(cmyk, "rb") as f:
        assert simplejpeg.decode_jpeg_header(f.read())[2] not in turbo._RGB_CONVERTIBLE


def _jpeg(width, height, seed=0):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(
        buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("content", [b"", b"not a jpeg", b"\xff\xd8\xff\xdb\x00\x43",
                                     _jpeg(64, 48)[:900]])
def test_unreadable_files_are_named(bad_folder, content):
    """Zero bytes, not a JPEG, a header cut short, a body cut short: one line naming the
    file, from a loader process too."""
    index = bad_folder(content)
    for workers in (0, 1):
        loader = _loader(index, False, "turbo", workers, batch=2)
        try:
            with pytest.raises(UserError, match=r"x\.JPEG: cannot decode JPEG"):
                list(loader.epoch(0))
        finally:
            loader.close()
