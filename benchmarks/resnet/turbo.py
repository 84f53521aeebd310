"""The ``turbo`` input optimisation: libjpeg-turbo decodes in the loader processes, batches
cross as one buffer each, crops resized by torch's vectorised uint8 resize.

The Pillow reader (``data.py``, the reference) decodes each image with Pillow, resizes the
crop's box with Pillow's bilinear filter and sends the image to the main process alone. Here, each
loader process takes a slice of a batch and, for each image:

- decodes it with libjpeg-turbo (``simplejpeg``; Pillow's own decoder runs libjpeg-turbo
  too, but line by line through its buffers: 1.4x slower here);
- takes the reference's crop box and flip (``data.crop_plan``: same seed, epoch and sample,
  same box), cuts the crop out and resizes it to ``size`` with torch's antialiased bilinear
  filter (``F.interpolate(..., antialias=True)``, whose uint8 channels-last path is
  vectorised: about 2x faster than Pillow's ``resize``). That is crop-then-resize, as
  torchvision's ``RandomResizedCrop`` does on Pillow images: within 2 levels of Pillow's
  crop-then-resize; against the reference's box resize, whose filter also reads the pixels
  just outside the box, only the border pixels of a crop differ;
- writes the crop into the slice's one uint8 [n, size, size, 3] buffer (the resize writes
  there itself, in that channels-last order). With ``resize-on-device`` it writes the
  crop unresized instead and the batch is resized where it trains (``regions.py``).

No reduced DCT scale (libjpeg-turbo's n/8): Huffman decoding, whose cost does not shrink
with it, is most of the work (docs/performance.md).

JPEGs libjpeg-turbo cannot convert to RGB (CMYK, YCCK) and files it rejects go to Pillow, as
the reference decodes them; a file Pillow rejects too is a one-line ``UserError`` naming it.
The main process copies the slices of a batch to the device straight from the processes'
shared, page-locked memory (asynchronous, on a GPU on a side stream that the step's stream
waits for) and normalises them there (``data.normalize_on_device``).
"""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import simplejpeg
import torch
from PIL import Image

from benchmarks.resnet import data, nvjpeg_share, regions
from benchmarks.resnet.region_decode import RegionDecoder
from common import loaders

_RGB_CONVERTIBLE = ("YCbCr", "Gray", "RGB")   # colour spaces libjpeg-turbo turns into RGB
REGION_BUDGET = 4   # resize-on-device: a slice's buffer in resized crops' bytes an image


def decode_crop(blob: bytes, path: str, size: int, plan, region=None,
                out: torch.Tensor | None = None) -> np.ndarray:
    """uint8 [size, size, 3]: the crop that ``plan(width, height) -> (box, flip)`` gives,
    resized to ``size`` and mirrored where flipped, written into ``out`` (a uint8 [size,
    size, 3] tensor; a new one where None). With ``region`` (a ``RegionDecoder``) only the
    crop's region is decoded, where it can."""
    crop = region.crop(blob, plan) if region is not None else None
    return _resize(*(crop or _whole_crop(blob, path, plan)), size, out)


def _whole_crop(blob: bytes, path: str, plan) -> tuple[np.ndarray, bool]:
    """``(pixels, flip)``: the planned box of the whole decoded image, uint8 [h, w, 3]."""
    pixels = None
    try:
        if simplejpeg.decode_jpeg_header(blob)[2] in _RGB_CONVERTIBLE:
            pixels = simplejpeg.decode_jpeg(blob, colorspace="RGB")
    except ValueError:   # not a JPEG libjpeg-turbo takes without complaint: Pillow decides
        pixels = None
    if pixels is None:
        try:
            with Image.open(io.BytesIO(blob)) as im:
                pixels = np.array(im.convert("RGB"))   # writable, for torch
        except (OSError, SyntaxError, ValueError) as exc:
            raise data._decode_error(path, exc) from None
    (left, top, w, h), flip = plan(pixels.shape[1], pixels.shape[0])
    return pixels[top:top + h, left:left + w], flip


def pack_crop(blob: bytes, path: str, size: int, plan, region, buf: torch.Tensor, used: int,
              room: int, meta: np.ndarray) -> int:
    """``resize-on-device``: the planned crop's pixels, unresized, written into the uint8
    buffer ``buf`` at byte ``used``, and its ``regions`` row into ``meta`` (a numpy row);
    the new end of the buffer's used part. Only the crop's region is decoded where
    ``region`` can, straight into ``buf``. A crop of more than ``room`` bytes is resized
    here, as without the switch, and sent at ``size`` x ``size``: the buffer's room is
    bounded."""
    located = region.locate(blob, plan) if region is not None else None
    if located is not None:
        shape = (located.rows, located.columns, 3)
        nbytes = math.prod(shape)
        fits = nbytes <= room
        pixels = (buf[used:used + nbytes].numpy() if fits
                  else np.empty(nbytes, dtype=np.uint8)).reshape(shape)
        if not region.decode(blob, located, pixels):
            located = None
        elif fits:
            meta[:] = (used, located.columns, located.skip, located.width, located.rows,
                       located.flip)
            return used + nbytes
    if located is None:
        pixels, flip = _whole_crop(blob, path, plan)
    else:
        pixels, flip = pixels[:, located.skip:located.skip + located.width], located.flip
    h, w = pixels.shape[:2]
    if h * w * 3 <= room:
        buf[used:used + h * w * 3].view(h, w, 3).copy_(torch.from_numpy(pixels))
        meta[:] = used, w, 0, w, h, flip
        return used + h * w * 3
    _resize(pixels, flip, size, buf[used:used + size * size * 3].view(size, size, 3))
    meta[:] = used, size, 0, size, size, 0
    return used + size * size * 3


def _resize(pixels: np.ndarray, flip: bool, size: int, out: torch.Tensor | None) -> np.ndarray:
    """``pixels`` [h, w, 3] resized into ``out`` [size, size, 3] by torch's antialiased
    bilinear filter, the form of ``F.interpolate`` that writes its result where it is told:
    straight into ``out`` in its channels-last order. ``F.interpolate`` returns the result
    channels-first and a copy then transposes it: 0.26 ms an image against 0.09 ms here
    (one core of the development machine), the same values."""
    if out is None:
        out = torch.empty((size, size, 3), dtype=torch.uint8)
    crop = torch.from_numpy(pixels).permute(2, 0, 1)[None]
    torch.ops.aten._upsample_bilinear2d_aa.out(crop, [size, size], False, None, None,
                                               out=out.permute(2, 0, 1)[None])
    if flip:
        out.copy_(out.flip(1))
    return out.numpy()


class DecodedSlices(torch.utils.data.Dataset):
    """Item ``(epoch, indices)``: those samples' crops for ``epoch`` as one uint8 [n, size,
    size, 3] tensor (as ``loaders.SharedBuffers.send`` sends it: a slot of ``buffers`` or a
    private tensor) and their labels (a numpy array). The key carries the epoch, so
    persistent workers serve every epoch. With ``regions`` (``resize-on-device``) the crops
    come unresized, packed into a uint8 buffer of up to ``REGION_BUDGET`` resized crops'
    bytes an image, with their ``regions`` rows (numpy) and the rows of the JPEG files sent
    as they are for ``device_share`` of the positions (``nvjpeg_share``; their ``regions``
    rows are left for the training process to fill): ``(buffer, meta, files, labels)``."""

    def __init__(self, samples, size: int, train: bool, seed: int, region_decode: bool = False,
                 buffers: loaders.SharedBuffers | None = None, regions: bool = False,
                 device_share: float = 0.0):
        self.samples, self.size, self.train, self.seed = samples, size, train, seed
        self.region = RegionDecoder() if region_decode else None
        self.buffers, self.regions, self.device_share = buffers, regions, device_share

    def __getitem__(self, key):
        epoch, indices = key
        tile = self.size * self.size * 3
        shape = ((int(len(indices) * tile * REGION_BUDGET),) if self.regions
                 else (len(indices), self.size, self.size, 3))
        out, slot = (self.buffers.take(shape) if self.buffers is not None
                     else (torch.empty(shape, dtype=torch.uint8), -1))
        meta, used = np.zeros((len(indices), regions.FIELDS), dtype=np.int64), 0
        files, sent_files = np.empty((len(indices), nvjpeg_share.FIELDS), dtype=np.int64), 0
        for j, (blob, i) in enumerate(zip(data.read_files(self.samples, indices), indices)):
            def plan(width, height, i=i):
                return data.crop_plan(width, height, self.size, self.train, self.seed, epoch, i)
            path = self.samples[i][0]
            if self.regions:   # room for the rest at ``size`` x ``size`` stays free
                room = out.numel() - used - (len(indices) - j - 1) * tile
                end = (nvjpeg_share.pack_file(blob, plan, out, used, room, files[sent_files])
                       if nvjpeg_share.chosen(j, self.device_share) else None)
                if end is not None:
                    files[sent_files, :2] = j, i
                    used, sent_files = end, sent_files + 1
                    continue
                used = pack_crop(blob, path, self.size, plan, self.region, out, used, room,
                                 meta[j])
            else:
                decode_crop(blob, path, self.size, plan, self.region, out[j])
        labels = np.array([self.samples[i][1] for i in indices], dtype=np.int64)
        if not self.regions:
            return loaders.SharedBuffers.send(out, slot), labels
        return loaders.SharedBuffers.send(out[:used], slot), meta, files[:sent_files], labels


def select(wl, _) -> None:
    wl.impl.decoder = TurboDecoder


class TurboDecoder:
    """``data.Loader``'s decode function of ``turbo``: each batch is cut into one
    slice per loader process, so every process works on every batch. One DataLoader serves
    every pass (its processes start once); ``close`` stops them.

    Where the loader sets ``upcoming`` (epoch -> that pass's indices: training), the keys run
    on from each pass into the next, so the loader processes decode the next epoch's first
    batches while the step takes this one's last: no refill at each epoch's start. A pass
    asked for out of turn (the first, another epoch, or after one left unfinished) restarts
    the processes' queue at that pass.

    The processes write their slices into slots of one shared-memory pool
    (``loaders.SharedBuffers``), page-locked on a GPU, and send the slot's number: the
    batch's copies to the device read the pool where the processes wrote it, and each slot
    is given back once they have run. With ``resize_on_device`` they send the crops
    unresized and the batch is resized on the device (``regions.resize``); with
    ``device_decode`` as well, ``device_share`` of each slice's images come as JPEG files
    and are decoded by it here (``nvjpeg_share``)."""

    def __init__(self, samples, size, train, seed, batch_size, workers, device,
                 region_decode: bool = False, resize_on_device: bool = False,
                 device_decode=None, device_share: float = 0.0):
        self.keys = loaders.Keys()
        self.slice = math.ceil(batch_size / max(workers, 1))
        # a worker holds at most the loader's prefetch of slices, and one being written
        numel = int(self.slice * size * size * 3 * (REGION_BUDGET if resize_on_device else 1))
        self.buffers = loaders.SharedBuffers(workers, loaders.PREFETCH + 2, numel)
        slices = DecodedSlices(samples, size, train, seed, region_decode, self.buffers,
                               resize_on_device, device_share if device_decode else 0.0)
        self.loader = loaders.persistent(slices, self.keys, workers, pin=False, as_is=True)
        if device.type == "cuda":
            iter(self.loader)   # the processes start, sharing the pool's pages, before
            self.buffers.pin()  # it is page-locked here
        self.batch_size, self.device, self.size = batch_size, device, size
        self.resize_on_device = resize_on_device
        self.samples, self.device_decode = samples, device_decode
        if device_decode is not None:
            nvjpeg_share.warm_up(device_decode, device)
        self.upcoming = None
        self._plans, self._next, self._items = {}, None, None

    def __call__(self, indices, epoch):
        plan = self._plans.get(epoch)
        if self._next != epoch or plan is None or plan[0] != indices:
            self._plans = {epoch: self._plan(indices, epoch)}
            self.keys.keys = self._keys(epoch)
            self.buffers.drop_all()
            self._items = iter(self.loader)   # persistent processes drop what they had queued
        self._next = None   # until this pass's last batch has been taken
        return self._batches(epoch)

    def _plan(self, indices, epoch):
        """(indices, the loader processes' keys, slices per batch) of one pass."""
        batches = [indices[i:i + self.batch_size]
                   for i in range(0, len(indices), self.batch_size)]
        slices = [[(epoch, b[i:i + self.slice]) for i in range(0, len(b), self.slice)]
                  for b in batches]
        return indices, [key for keys in slices for key in keys], [len(k) for k in slices]

    def _keys(self, epoch):
        """The keys from ``epoch``'s pass on, into the following passes where ``upcoming``
        is set."""
        while True:
            if epoch not in self._plans:
                self._plans[epoch] = self._plan(self.upcoming(epoch), epoch)
            keys = self._plans[epoch][1]
            yield from keys
            if self.upcoming is None or not keys:   # no batches in a pass: none in the next
                return
            epoch += 1

    def _batches(self, epoch):
        """A pass's batches. On a GPU, each batch's copies to the device (and the resize)
        run on a side stream, which the consumer's stream then waits for: they overlap the
        step already queued before them instead of running after it on the same stream."""
        counts, dev = self._plans[epoch][2], self.device
        side = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        for b, n in enumerate(counts):
            parts = [next(self._items) for _ in range(n)]
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                if self.resize_on_device:
                    images = self._resized(parts)
                else:
                    images = data.normalize_on_device(torch.cat(
                        [self.buffers.receive(p[0]).to(dev, non_blocking=True) for p in parts]),
                        dev)
                labels = torch.from_numpy(np.concatenate([p[-1] for p in parts]))
                labels = labels.to(dev, non_blocking=True)
            if side is not None:
                current = torch.cuda.current_stream(dev)
                current.wait_stream(side)
                images.record_stream(current)
                labels.record_stream(current)
            # copied out (by the cat on a CPU); on a GPU once the side stream's copies have run
            self.buffers.release([p[0] for p in parts], side)
            if b == len(counts) - 1:   # the queue now stands at the next pass's start
                del self._plans[epoch]
                self._next = epoch + 1
            yield images, labels

    def _resized(self, parts) -> torch.Tensor:
        """The slices' packed crops in one buffer on the device, resized there; the files
        sent as they are decoded here first, their crops packed after the slices'."""
        bufs = [self.buffers.receive(p[0]) for p in parts]
        metas, starts, end = [], [], 0
        for buf, (_, meta, *_) in zip(bufs, parts):
            metas.append(meta + np.array([end] + [0] * (regions.FIELDS - 1)))
            starts.append(end)
            end += len(buf)
        copies, extra = nvjpeg_share.decode_into(bufs, [p[2] for p in parts], metas, end,
                                                 self.device_decode, self.samples,
                                                 self.device)
        packed = torch.empty(end + extra, dtype=torch.uint8, device=self.device)
        for buf, start in zip(bufs, starts):
            packed[start:start + len(buf)].copy_(buf, non_blocking=True)
        for at, crop in copies:
            packed[at:at + crop.numel()].view(crop.shape).copy_(crop)
        meta = torch.from_numpy(np.concatenate(metas)).to(self.device, non_blocking=True)
        return regions.resize(packed, meta, self.size)

    def close(self) -> None:
        loaders.shut_down(self.loader)
        self.buffers.close()
