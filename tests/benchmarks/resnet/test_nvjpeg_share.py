"""``eval-nvjpeg-share``: a share of each evaluation batch sent as JPEG files and decoded
where the batch is resized. On the CPU, Pillow stands in for nvJPEG (its pixels equal
libjpeg-turbo's), so the batches equal the loader processes' alone; on a GPU, nvJPEG's are
within a few levels (``-m gpu``)."""

import io
import sys

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from benchmarks.resnet import data, nvjpeg, nvjpeg_share, turbo
from benchmarks.resnet.workload import ResNetWorkload
from common.dist import DistEnv
from common.errors import UserError
from common.precision import Precision
from common.training import build_parser

CPU = torch.device("cpu")
STD = torch.tensor(data.STD).view(1, 3, 1, 1)


def _loader(samples, workers, share, decode=nvjpeg.pillow_decode, device=CPU, batch=7):
    """The evaluation loader of turbo at 224 px (files fit the buffer's room)."""
    decoder = turbo.TurboDecoder(samples, 224, False, 0, batch, workers, device,
                                 region_decode=True, resize_on_device=True,
                                 device_decode=decode if share else None, device_share=share)
    loader = data.Loader(samples, False, batch, 0, 1, 0, decoder)
    loader.memory_format = torch.channels_last
    return loader


class Recorder:
    """``pillow_decode``, noting the files it was given (``warmed``: the warm-up's call)."""

    def __init__(self, decode=nvjpeg.pillow_decode):
        self.paths, self.decode, self.warmed = [], decode, 0

    def __call__(self, blobs, paths, device):
        if paths == [nvjpeg_share.WARM_UP]:
            self.warmed += 1
        else:
            self.paths += paths
        return self.decode(blobs, paths, device)


def _batches(loader):
    try:
        return list(loader.epoch(0))
    finally:
        loader.close()


@pytest.mark.parametrize("share,workers", [(0.3, 0), (0.5, 2), (1.0, 2)])
def test_batches_with_a_share_equal_the_loader_processes_alone(imagenet_like, share, workers):
    """The same images, labels and order; the pixels equal (Pillow's decode is
    libjpeg-turbo's); the share of the positions went to the decoder, CMYK files not."""
    samples = imagenet_like.train
    record = Recorder()
    plain = _batches(_loader(samples, workers, 0.0))
    shared = _batches(_loader(samples, workers, share, record))
    assert len(plain) == len(shared) == -(-len(samples) // 7)
    for (a, la), (b, lb) in zip(plain, shared, strict=True):
        assert torch.equal(la, lb) and b.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    spaces = {p: simplejpeg.decode_jpeg_header(open(p, "rb").read())[2] for p, _ in samples}
    assert all(spaces[p] != "CMYK" for p in record.paths)
    eligible = sum(s != "CMYK" for s in spaces.values())
    assert "CMYK" in spaces.values() and len(set(record.paths)) == len(record.paths)
    assert 0.5 * share * eligible <= len(record.paths) <= share * len(samples) + 4


def test_the_decoder_is_warmed_up_where_the_loader_is_built(imagenet_like):
    """Before any batch is asked for (before ``run_start``), on a generated file."""
    record = Recorder()
    loader = _loader(imagenet_like.train, 0, 0.5, record)
    try:
        assert record.warmed == 1 and not record.paths
    finally:
        loader.close()


def test_positions_are_spread_evenly():
    picks = [j for j in range(20) if nvjpeg_share.chosen(j, 0.25)]
    assert picks == [3, 7, 11, 15, 19]
    assert not any(nvjpeg_share.chosen(j, 0.0) for j in range(20))
    assert all(nvjpeg_share.chosen(j, 1.0) for j in range(20))


def test_a_file_the_decoders_reject_is_named(bad_folder):
    """A truncated JPEG whose header reads goes to the decoder: Pillow's rejection names it."""
    buf = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buf, "JPEG", quality=90)
    index = bad_folder(buf.getvalue()[:900])
    record = Recorder()
    with pytest.raises(UserError, match=r"x\.JPEG: cannot decode JPEG"):
        _batches(_loader(index.val, 0, 1.0, record, batch=2))
    assert any(p.endswith("x.JPEG") for p in record.paths)


def test_a_size_other_than_the_headers_is_refused(imagenet_like):
    def shrunk(blobs, paths, device):
        return [image[:, 1:] for image in nvjpeg.pillow_decode(blobs, paths, device)]
    with pytest.raises(UserError, match=r"decoded as .* but its header says .*re-extract"):
        _batches(_loader(imagenet_like.train, 0, 1.0, shrunk))


@pytest.mark.parametrize("items,match", [
    ("turbo,resize-on-device,eval-nvjpeg-share=1.5", "must be between 0 and 1"),
    ("turbo,eval-nvjpeg-share=0.3", "eval-nvjpeg-share requires resize-on-device"),
    ("eval-nvjpeg-share=0.3,resize-on-device", "resize-on-device requires turbo"),
])
def test_bad_settings_are_refused(capsys, items, match):
    with pytest.raises(SystemExit) as exc:
        build_parser(ResNetWorkload).parse_args(["--opt", items])
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_it_needs_a_cuda_device():
    args = build_parser(ResNetWorkload).parse_args(
        ["--opt", "turbo,resize-on-device,eval-nvjpeg-share=0.3", "--device", "cpu"])
    with pytest.raises(UserError, match="optimisation eval-nvjpeg-share needs CUDA"):
        ResNetWorkload(args, DistEnv(), Precision("fp32", "cpu"))


@pytest.mark.parametrize("flag", ["optimisation eval-nvjpeg-share=0.5", "optimisation nvjpeg"])
def test_a_missing_torchvision_is_one_line_naming_the_flag(monkeypatch, flag):
    monkeypatch.setitem(sys.modules, "torchvision", None)   # import fails
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    with pytest.raises(UserError, match=rf"^{flag} decodes with torchvision's nvJPEG.*"
                                        r"pip install -e '\.\[gpu\]'"):
        nvjpeg.require_torchvision(flag)


@pytest.mark.gpu
def test_nvjpeg_batches_are_within_a_few_levels_of_the_loader_processes(imagenet_like):
    """nvJPEG (the hardware engines where it takes the file) against libjpeg-turbo in the
    loader processes, after the same resize: within a level on average and 12 levels for
    99.9% of the values; single pixels at sharp colour edges differ by tens (chroma
    upsampling). On an H100: mean 0.387, 99.9% 7.92, at most 35.7."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cuda = torch.device("cuda")
    samples = imagenet_like.train
    record = Recorder(nvjpeg.nvjpeg_decode)
    plain = _batches(_loader(samples, 2, 0.0))
    shared = _batches(_loader(samples, 2, 0.5, record, cuda))
    diffs = []
    for (a, la), (b, lb) in zip(plain, shared, strict=True):
        assert b.device.type == "cuda" and torch.equal(la, lb.cpu())
        diffs.append(((a - b.cpu()) * STD).abs())
    diffs = torch.cat(diffs)
    q = torch.quantile(diffs.flatten()[::7], torch.tensor([0.99, 0.999]))
    print(f"{len(record.paths)} files by nvJPEG; levels: max {float(diffs.max()):.2f}, "
          f"mean {float(diffs.mean()):.3f}, 99% {float(q[0]):.2f}, 99.9% {float(q[1]):.2f}")
    assert record.paths and float(diffs.mean()) <= 1 and float(q[1]) <= 12
    assert float(diffs.max()) <= 64
