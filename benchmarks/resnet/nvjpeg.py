"""The ``nvjpeg`` input optimisation: batched nvJPEG decode and one batched crop and resize
(and ``cpu-decode-share``; ``eval-nvjpeg-share``'s choice of decoder, ``nvjpeg_share.py``).

- persistent loader processes read a batch's files into one buffer, parse each JPEG header
  and plan the crops on the host (``data.crop_plan``: the Pillow reader's boxes and flips);
  the DataLoader pins the buffers, so batches arrive in page-locked memory, several ahead;
- the main process decodes the whole batch with one ``torchvision.io.decode_jpeg(list,
  device='cuda')`` call (nvJPEG's batched decode, on the GPU's hardware JPEG engines
  where it can use them) on a side stream, packs the decoded images into one flat
  buffer and runs :func:`crop_resize_normalize` over the batch: crop, bilinear resize
  (as ``F.interpolate`` of each crop), flip, normalise and channels-last in one pass
  of batched gathers;
- a background thread decodes and crops the next batches on a side stream while the step
  runs, so the decode call's host time (and any wait in it) is off the thread that
  launches the step.

A share of each batch (``cpu-decode-share``, evenly spread over its positions) can be
decoded, cropped and resized in the loader processes instead, as ``turbo`` does
(``turbo.decode_crop``), so that host cores take part of the decoding; those crops reach
the device with the batch as one uint8 buffer and are normalised there.

Files nvJPEG cannot take go the same way: CMYK/YCCK JPEGs (4 components) in the loader
process; any file that nvJPEG rejects is decoded by Pillow in the main process. A file that
Pillow rejects too is a one-line ``UserError`` naming it. The batched resize does not
antialias (Pillow's does), so crops much larger than the output alias a little; the
evaluation crop (resize 256, centre 224) shrinks ImageNet's images by about 1.5x.
"""

from __future__ import annotations

import contextlib
import io
import queue
import struct
import threading

import numpy as np
import torch
from PIL import Image

from benchmarks.resnet import data, turbo
from common import loaders
from common.errors import UserError
from common.hparams import fraction

# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic)
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_NVJPEG_COMPONENTS = (1, 3)   # greyscale and YCbCr; CMYK/YCCK go to Pillow
_GATHER_ELEMENTS = 1 << 22    # output pixels per chunk of crop_resize_normalize


def jpeg_header(blob: bytes) -> tuple[int, int, int]:
    """(width, height, components) from a JPEG's frame header; ``ValueError`` if there is none."""
    if blob[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG (no start-of-image marker)")
    pos, end = 2, len(blob)
    while pos + 4 <= end:
        if blob[pos] != 0xFF:
            raise ValueError(f"corrupt marker at byte {pos}")
        marker = blob[pos + 1]
        if marker == 0xFF:              # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", blob, pos + 2)
        if marker in _SOF:
            if pos + 10 > end:
                break
            height, width, components = struct.unpack_from(">HHB", blob, pos + 5)
            if not (width and height):
                raise ValueError("frame header with zero width or height")
            return width, height, components
        if marker == 0xDA:              # start of scan before any frame header
            break
        pos += 2 + length
    raise ValueError("no frame header (truncated file?)")


def pillow_chw(blob: bytes, path: str) -> torch.Tensor:
    """uint8 [3, H, W] RGB decoded by Pillow (any mode: CMYK, greyscale, ...)."""
    try:
        with Image.open(io.BytesIO(blob)) as im:
            pixels = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (OSError, SyntaxError, ValueError) as exc:
        raise data._decode_error(path, exc) from None
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1)


class PlannedBatches(torch.utils.data.Dataset):
    """Item ``(epoch, indices)``: that batch's files in one buffer with each file's size (0
    where the image was decoded here instead); for the files left to nvJPEG, in batch order,
    the images' (height, width), crop boxes (left, top, w, h) and flips for ``epoch``; the
    labels; the positions in the batch of the images decoded here and their crops (uint8
    [n, size, size, 3]); and the sample indices. The key carries the epoch, so persistent
    workers serve every epoch. ``cpu_share`` of the positions are decoded here whatever
    their files."""

    def __init__(self, samples, size: int, train: bool, seed: int, cpu_share: float = 0.0):
        self.samples, self.size, self.train, self.seed = samples, size, train, seed
        self.cpu_share = cpu_share

    def __getitem__(self, key):
        epoch, batch = key
        blobs = data.read_files(self.samples, batch)
        dims, boxes, flips, decoded_at, crops = [], [], [], [], []
        for j, (blob, i) in enumerate(zip(blobs, batch)):
            def plan(width, height, i=i):
                return data.crop_plan(width, height, self.size, self.train, self.seed, epoch,
                                      i)
            try:
                width, height, components = jpeg_header(blob)
            except ValueError:
                components = None
            on_cpu = int((j + 1) * self.cpu_share) > int(j * self.cpu_share)
            if on_cpu or components not in _NVJPEG_COMPONENTS:
                crops.append(turbo.decode_crop(blob, self.samples[i][0], self.size, plan))
                decoded_at.append(j)
                blobs[j] = b""
                continue
            box, flip = plan(width, height)
            dims.append((height, width))
            boxes.append(box)
            flips.append(flip)
        labels = [self.samples[i][1] for i in batch]
        crops = torch.from_numpy(np.stack(crops)) if crops else torch.empty(
            0, self.size, self.size, 3, dtype=torch.uint8)
        return (data.pack(blobs), [len(x) for x in blobs], torch.tensor(dims).view(-1, 2),
                torch.tensor(boxes).view(-1, 4), torch.tensor(flips, dtype=torch.bool),
                torch.tensor(labels), decoded_at, crops, list(batch))


def crop_resize_normalize(flat: torch.Tensor, offsets: torch.Tensor, dims: torch.Tensor,
                          boxes: torch.Tensor, flips: torch.Tensor, size: int) -> torch.Tensor:
    """A batch of images, each uint8 [3, H, W] stored at ``offsets[b]`` in the 1-D
    ``flat``, with ``dims`` (H, W) [B, 2], crop ``boxes`` (left, top, w, h) [B, 4] and
    ``flips`` [B] (all on ``flat``'s device) -> normalised float32 [B, 3, size, size] in
    channels-last memory. Each crop is resized bilinearly as ``F.interpolate`` (half-pixel
    centres, no antialiasing) would resize it, mirrored where flipped; no per-image loop."""
    out = torch.empty(len(boxes), size, size, 3, device=flat.device)
    chunk = max(1, _GATHER_ELEMENTS // (size * size))
    mean = torch.tensor(data.MEAN, device=flat.device)
    inv_std = 1 / torch.tensor(data.STD, device=flat.device)
    for s in range(0, len(boxes), chunk):
        e = s + chunk
        pixels = _bilinear_crops(flat, offsets[s:e], dims[s:e], boxes[s:e], flips[s:e], size)
        torch.mul(pixels - mean, inv_std, out=out[s:e])
    return out.permute(0, 3, 1, 2)


def _axis(start: torch.Tensor, length: torch.Tensor, size: int, mirror: torch.Tensor | None):
    """Source coordinates along one axis for ``size`` outputs: the two neighbours (absolute
    pixel indices, [B, size]) and the second one's weight, with ``F.interpolate``'s
    half-pixel mapping and edge clamping."""
    o = torch.arange(size, device=start.device, dtype=torch.float32)
    o = o.expand(len(start), size)
    if mirror is not None:
        o = torch.where(mirror[:, None], size - 1 - o, o)
    src = ((o + 0.5) * (length[:, None].float() / size) - 0.5).clamp_(min=0)
    lo = src.floor().long().minimum(length[:, None] - 1)
    hi = (lo + 1).minimum(length[:, None] - 1)
    return start[:, None] + lo, start[:, None] + hi, src - lo


def _bilinear_crops(flat, offsets, dims, boxes, flips, size) -> torch.Tensor:
    """float [b, size, size, 3] in pixel values: the crops of one chunk of the batch."""
    height, width = dims[:, 0], dims[:, 1]
    x0, x1, wx = _axis(boxes[:, 0], boxes[:, 2], size, flips)
    y0, y1, wy = _axis(boxes[:, 1], boxes[:, 3], size, None)
    plane = (height * width)[:, None, None, None]
    channel = torch.arange(3, device=flat.device).view(1, 1, 1, 3) * plane
    base = offsets.view(-1, 1, 1, 1) + channel

    def at(rows, cols):
        return flat[base + (rows * width[:, None])[:, :, None, None] + cols[:, None, :, None]]

    wx, wy = wx[:, None, :, None], wy[:, :, None, None]
    top = torch.lerp(at(y0, x0).float(), at(y0, x1).float(), wx)
    bottom = torch.lerp(at(y1, x0).float(), at(y1, x1).float(), wx)
    return torch.lerp(top, bottom, wy)


def require_torchvision(flag: str) -> None:
    """A one-line ``UserError`` naming ``flag`` where torchvision (whose ``decode_jpeg``
    runs nvJPEG) does not import, before any loader starts."""
    try:
        import torchvision.io  # noqa: F401  GPU machines only
    except (ImportError, RuntimeError) as exc:
        raise UserError(f"{flag} decodes with torchvision's nvJPEG, and torchvision does not "
                        f"import here ({str(exc).splitlines()[0] if str(exc) else exc!r}): "
                        "pip install -e '.[gpu]', or leave it out") from None


def nvjpeg_decode(blobs: list[torch.Tensor], paths: list[str], device) -> list[torch.Tensor]:
    """uint8 [3, H, W] RGB images on ``device``: one batched nvJPEG call; where it fails, each
    file again alone, and Pillow for those nvJPEG still rejects."""
    from torchvision.io import ImageReadMode, decode_jpeg  # GPU machines only

    try:
        return decode_jpeg(blobs, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        images = []
        for blob, path in zip(blobs, paths):
            try:
                images.append(decode_jpeg(blob, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                images.append(pillow_chw(blob.numpy().tobytes(), path).to(device))
        return images


def pillow_decode(blobs: list[torch.Tensor], paths: list[str], device) -> list[torch.Tensor]:
    """The same as :func:`nvjpeg_decode` with Pillow: the CPU stand-in for tests and timings."""
    return [pillow_chw(b.numpy().tobytes(), p).to(device) for b, p in zip(blobs, paths)]


class BatchAssembler:
    """Turns a :class:`PlannedBatches` item into ``(images, labels)`` on ``device``."""

    def __init__(self, samples, size: int, device: torch.device, decode=nvjpeg_decode):
        self.samples, self.size, self.device, self.decode = samples, size, device, decode

    def decode_batch(self, item) -> tuple[list[torch.Tensor], tuple]:
        """The images left to the device decoder, decoded there, and the rest of the item:
        ``(dims, boxes, flips, their positions, the positions decoded in the loader process,
        those crops, labels)``."""
        buf, sizes, dims, boxes, flips, labels, decoded_at, decoded, indices = item
        blobs = torch.split(buf, sizes)
        todo = [j for j, n in enumerate(sizes) if n]
        paths = [self.samples[indices[j]][0] for j in todo]
        images = self.decode([blobs[j] for j in todo], paths, self.device) if todo else []
        for image, (h, w), path in zip(images, dims.tolist(), paths):
            data.check_decoded_size(image, h, w, path)
        return images, (dims, boxes, flips, todo, decoded_at, decoded, labels)

    def crops(self, images: list[torch.Tensor], dims, boxes, flips, todo, decoded_at,
              decoded) -> torch.Tensor:
        """The batch's normalised crops: those of the decoded ``images`` at positions
        ``todo``, and the loader process's ``decoded`` crops at ``decoded_at``."""
        dev = self.device
        parts = []
        if todo:
            flat = torch.cat([image.reshape(-1) for image in images])
            dims = dims.to(dev, non_blocking=True)
            offsets = torch.cumsum(3 * dims[:, 0] * dims[:, 1], 0) - 3 * dims[:, 0] * dims[:, 1]
            parts.append((todo, crop_resize_normalize(
                flat, offsets, dims, boxes.to(dev, non_blocking=True),
                flips.to(dev, non_blocking=True), self.size)))
        if decoded_at:
            parts.append((decoded_at, data.normalize_on_device(decoded, dev)))
        if len(parts) == 1:
            return parts[0][1]
        out = torch.empty(len(todo) + len(decoded_at), 3, self.size, self.size, device=dev,
                          memory_format=torch.channels_last)
        for at, crops in parts:
            out[torch.tensor(at, device=dev)] = crops
        return out

    def __call__(self, item) -> tuple[torch.Tensor, torch.Tensor]:
        images, rest = self.decode_batch(item)
        return self.crops(images, *rest[:-1]), rest[-1].to(self.device, non_blocking=True)


def planned_loader(samples, size, train, seed, workers, pin: bool, keys: loaders.Keys,
                   cpu_share: float = 0.0):
    """The persistent DataLoader of :class:`PlannedBatches` over ``keys`` (pinned batches
    when ``pin``)."""
    return loaders.persistent(PlannedBatches(samples, size, train, seed, cpu_share), keys,
                              workers, pin)


def ahead(batches, device: torch.device, assemble, depth: int = 2):
    """``assemble(item)`` for each item in a background thread (on a side stream on a GPU),
    up to ``depth`` batches ahead of the consumer, so the decode call's host time overlaps
    the consumer's step instead of delaying its launch. An error in the thread is raised in
    the consumer; a consumer that stops early stops the thread."""
    cuda = device.type == "cuda"
    side = torch.cuda.Stream(device) if cuda else None
    # the consumer's device, for the thread (whose current device starts at 0)
    index = (torch.cuda.current_device() if device.index is None else device.index) if cuda \
        else None
    ready: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce():
        try:
            if cuda:
                torch.cuda.set_device(index)
            with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
                for item in batches:
                    if cuda:
                        # nvJPEG writes from a stream of its own, not ordered after this
                        # one: the blocks it is handed must not still be read by queued crops
                        side.synchronize()
                    batch = assemble(item)
                    done = side.record_event() if cuda else None
                    if not put((batch, done)):
                        return
            put((None, None))
        except BaseException as exc:   # raised in the consumer
            put((exc, None))

    thread = threading.Thread(target=produce, name="nvjpeg-ahead", daemon=True)
    thread.start()
    try:
        while True:
            batch, done = ready.get()
            if batch is None:
                return
            if isinstance(batch, BaseException):
                raise batch
            if cuda:
                current = torch.cuda.current_stream(device)
                current.wait_event(done)
                for t in batch:
                    t.record_stream(current)
            yield batch
    finally:
        stop.set()
        thread.join()


def share(text: str) -> float:
    """A ``NAME=SHARE`` optimisation's value: a fraction from 0 to 1."""
    value = float(text)
    fraction(value)
    return value


def select(wl, _) -> None:
    require_torchvision("optimisation nvjpeg")
    wl.impl.decoder = BatchedDecoder


def select_cpu_share(wl, value: float) -> None:
    wl.impl.options["cpu_share"] = value


def select_eval_share(wl, value: float) -> None:
    require_torchvision(f"optimisation eval-nvjpeg-share={value}")
    wl.impl.eval_options.update(device_decode=nvjpeg_decode, device_share=value)


class BatchedDecoder:
    """``data.Loader``'s decode function of ``nvjpeg`` (``decode``: the batch
    decoder, Pillow's in CPU tests; ``cpu_share``: the share of each batch the loader
    processes decode). One DataLoader serves every pass, so its workers start once, not at
    each epoch or evaluation; ``close`` stops them."""

    def __init__(self, samples, size, train, seed, batch_size, workers, device,
                 decode=nvjpeg_decode, cpu_share: float = 0.0):
        self.assemble = BatchAssembler(samples, size, device, decode)
        self.keys = loaders.Keys()
        self.loader = planned_loader(samples, size, train, seed, workers,
                                     device.type == "cuda", self.keys, cpu_share)
        self.batch_size, self.device = batch_size, device

    def __call__(self, indices, epoch):
        self.keys.keys = [(epoch, indices[i:i + self.batch_size])
                          for i in range(0, len(indices), self.batch_size)]
        return ahead(self.loader, self.device, self.assemble)

    def close(self) -> None:
        loaders.shut_down(self.loader)
