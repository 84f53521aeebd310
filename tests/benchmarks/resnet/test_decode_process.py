"""``--gpu-decode-share``: the ``turbo`` backend with a share of each batch decoded in a
spawned process of its own as the ``nvjpeg`` backend decodes it. On the CPU, Pillow stands
in for nvJPEG (``nvjpeg.pillow_decode``); the GPU test at the end runs nvJPEG itself."""

import multiprocessing

import pytest
import torch

from benchmarks.resnet import data, nvjpeg, turbo
from common.errors import UserError

CPU = torch.device("cpu")


def _three_loaders(samples, train, share, device, decode):
    """The backend with the share; the ``turbo`` backend alone; the ``nvjpeg`` backend."""
    seed = 7 if train else 0
    split = data.Loader(samples, train, 6, 0, 1, seed, turbo.TurboDecoder(
        samples, 32, train, seed, 6, 2, device, gpu_share=share, gpu_decode=decode))
    alone = data.Loader(samples, train, 6, 0, 1, seed,
                        turbo.TurboDecoder(samples, 32, train, seed, 6, 1, device))
    whole = data.Loader(samples, train, 6, 0, 1, seed,
                        nvjpeg.BatchedDecoder(samples, 32, train, seed, 6, 0, device, decode))
    return split, alone, whole


@pytest.mark.parametrize("train,share", [(True, 0.5), (True, 1.0), (False, 0.3)])
def test_the_share_is_the_nvjpeg_backends_crops_and_the_rest_the_turbo_backends(
        imagenet_like, train, share):
    """Each batch's front ``round(share * n)`` crops equal the ``nvjpeg`` backend's, the rest
    the ``turbo`` backend's, bit for bit (evaluation's last batch is short); the decode runs
    in one spawned process, which ``close`` stops."""
    samples = imagenet_like.train if train else imagenet_like.val
    before = set(multiprocessing.active_children())
    split, alone, whole = _three_loaders(samples, train, share, CPU, nvjpeg.pillow_decode)
    spawned = [p for p in multiprocessing.active_children() if p not in before]
    assert len(spawned) == 1 and spawned[0].is_alive()   # started before the first pass
    for epoch in (1, 2):
        batches = list(zip(split.epoch(epoch), alone.epoch(epoch), whole.epoch(epoch),
                           strict=True))
        assert len(batches) == len(split)
        for (a, la), (t, lt), (n, ln) in batches:
            k = round(len(la) * share)
            assert torch.equal(la, lt) and torch.equal(la, ln)
            assert torch.equal(a[:k], n[:k]) and torch.equal(a[k:], t[k:])
            assert a.is_contiguous(memory_format=torch.channels_last)
    for loader in (split, alone, whole):
        loader.close()
    spawned[0].join(10)
    assert not spawned[0].is_alive()


def test_a_bad_gpu_decode_share_is_one_line(imagenet_like):
    with pytest.raises(UserError, match=r"--gpu-decode-share 1.5: give a fraction"):
        turbo.TurboDecoder(imagenet_like.train, 32, True, 0, 6, 1, CPU, gpu_share=1.5)
    for backend, device in (("cpu", "cuda"), ("nvjpeg", "cuda"), ("turbo", "cpu")):
        with pytest.raises(UserError, match="--gpu-decode-share gives a share") as e:
            data.build_train_loader(index=imagenet_like, backend=backend, image_size=32,
                                    batch_size=6, rank=0, world_size=1, seed=0, workers=0,
                                    device=torch.device(device), gpu_decode_share=0.5)
        assert "\n" not in str(e.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_share_is_the_nvjpeg_backends_crops_on_the_gpu(imagenet_like):
    """nvJPEG in the spawned process, its crops crossing by CUDA IPC: the ``nvjpeg``
    backend's crops bit for bit, the rest the ``turbo`` backend's."""
    device = torch.device("cuda", torch.cuda.current_device())
    split, alone, whole = _three_loaders(imagenet_like.train, True, 0.5, device,
                                         nvjpeg.nvjpeg_decode)
    for (a, la), (t, lt), (n, ln) in zip(split.epoch(1), alone.epoch(1), whole.epoch(1),
                                         strict=True):
        assert a.device == device and torch.equal(la, ln) and torch.equal(la, lt)
        assert torch.equal(a[:3], n[:3]) and torch.equal(a[3:], t[3:])
    for loader in (split, alone, whole):
        loader.close()


@pytest.mark.parametrize("content", [b"", b"not a jpeg", b"\xff\xd8\xff\xdb\x00\x43"])
def test_an_unreadable_file_in_the_share_is_named(bad_folder, content):
    """Decoded in the spawned process, a file that cannot be read is one line naming it."""
    index = bad_folder(content)
    loader = data.Loader(index.val, False, 2, 0, 1, 0, turbo.TurboDecoder(
        index.val, 32, False, 0, 2, 1, CPU, gpu_share=1.0, gpu_decode=nvjpeg.pillow_decode))
    try:
        with pytest.raises(UserError, match=r"x\.JPEG: cannot decode JPEG"):
            list(loader.epoch(0))
    finally:
        loader.close()
