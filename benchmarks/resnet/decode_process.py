"""``--gpu-decode-share``: the ``turbo`` backend with a share of each batch decoded by nvJPEG
in a loader process of its own.

In the training process, nvJPEG decodes beside the step 10-24x slower than alone: its host
syncs, one per image, wait behind the step's queued work. In a process
of its own (its own CUDA context) it decoded 2,603 img/s beside the step on one H100, against
507-1,152 in the training process; the step lost 16% to the two contexts' turns on the GPU
(docs/performance.md, ResNet input pipeline, session 22). So here the ``turbo`` backend's
loader processes (libjpeg-turbo on the host cores) take most of each batch, and one process
of this kind takes the share at the batch's front:

- it is spawned, not forked (CUDA cannot start in a forked child of a process that uses
  it), once per run, when the backend is built; it makes its CUDA context on the rank's
  GPU then, so neither costs the timed run;
- it reads its share's files, plans the crops and decodes them as the ``nvjpeg`` backend
  does (:class:`nvjpeg.PlannedBatches`, :class:`nvjpeg.BatchAssembler`: one batched
  ``decode_jpeg``, one batched crop, resize and normalise on the GPU), up to two batches
  ahead;
- its crops cross to the training process through CUDA IPC (``torch.multiprocessing``:
  a handle to the device memory, no copy through the host; the receiver's stream waits
  on the sender's event).
"""

from __future__ import annotations

import torch

from benchmarks.resnet import nvjpeg
from common import loaders


class DeviceSlices(torch.utils.data.Dataset):
    """Item ``(epoch, indices)``: those samples' crops for ``epoch`` as the ``nvjpeg``
    backend makes them (normalised float32 [n, 3, size, size], channels-last, on
    ``device``) and their labels (on the host); ``decode`` is the batch decoder
    (:func:`nvjpeg.nvjpeg_decode`; Pillow's in CPU tests)."""

    def __init__(self, samples, size: int, train: bool, seed: int, device: torch.device,
                 decode):
        self.planned = nvjpeg.PlannedBatches(samples, size, train, seed)
        self.assemble = nvjpeg.BatchAssembler(samples, size, device, decode)

    def start(self, _worker: int) -> None:
        """The loader process's CUDA context, made as it starts."""
        if self.assemble.device.type == "cuda":
            torch.cuda.set_device(self.assemble.device)
            torch.cuda.init()

    def __getitem__(self, key):
        images, rest = self.assemble.decode_batch(self.planned[key])
        return self.assemble.crops(images, *rest[:-1]), rest[-1]


def device_loader(samples, size: int, train: bool, seed: int, device: torch.device,
                  keys: loaders.Keys, decode) -> torch.utils.data.DataLoader:
    """One spawned loader process serving :class:`DeviceSlices` over ``keys``, started now."""
    if device.type == "cuda" and device.index is None:   # the child's current GPU is GPU 0
        device = torch.device("cuda", torch.cuda.current_device())
    slices = DeviceSlices(samples, size, train, seed, device, decode)
    loader = loaders.persistent(slices, keys, 1, pin=False, context="spawn", prefetch=2,
                                init=slices.start)
    iter(loader)   # no keys yet: the process starts and waits for the first pass
    return loader
