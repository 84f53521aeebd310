"""A share of each evaluation batch decoded by nvJPEG where the batch is resized: the
``eval-nvjpeg-share=F`` optimisation (over ``resize-on-device``, a CUDA device; it selects
the decoder in ``nvjpeg.py``).

Evaluation batches are the loader processes' slowest work: a centre crop (resize 256,
centre 224) decodes about two thirds of each image, and every row down to its bottom is
entropy-decoded; on 16 host cores the loader processes give fewer evaluation images a
second than training ones. The GPU has capacity to spare between evaluation forwards,
and decoding engines of its own. With a share, the loader processes send the chosen
positions' JPEG files as they are, in their slice's buffer, with one ``FIELDS`` row each;
the training process decodes them in one batched call (``decode``: torchvision's
``decode_jpeg`` on the GPU, which takes the hardware JPEG engines for baseline files),
copies each crop's rows into the batch's packed buffer and fills their ``regions`` rows,
so the one resize of the batch takes them with the rest.

Positions are spread evenly over each slice. A file whose header libjpeg-turbo cannot
read or that is not greyscale or YCbCr/RGB (CMYK, YCCK) stays in the loader process, as
does one larger than the room left in the buffer. Files nvJPEG rejects go to Pillow
(``nvjpeg.nvjpeg_decode``); a file Pillow rejects too is a one-line ``UserError``.

nvJPEG's inverse DCT and chroma upsampling are not libjpeg-turbo's: its pixels differ from
the loader processes' by a few levels (a GPU test states the bound); Pillow's, which the CPU
tests use in its place, equal them.
"""

from __future__ import annotations

import numpy as np
import simplejpeg
import torch

from benchmarks.resnet import data

# position in the slice, sample index, byte offset in the buffer, file size, image width
# and height (header), crop box left, top, width, height, flip
FIELDS = 11
WARM_UP = "(warm-up JPEG)"   # the path ``warm_up`` gives its generated file
_NVJPEG_COLORSPACES = ("YCbCr", "Gray", "RGB")


def warm_up(decode, device) -> None:
    """One call of ``decode`` on a small generated JPEG (no dataset file), so that loading
    the decoder and its first call (torchvision's import, nvJPEG's handle and buffers) happen
    where a loader is built, not in the first evaluation, whose first batch waited 930 ms for
    them on an H100 machine."""
    pixels = np.zeros((16, 16, 3), dtype=np.uint8)
    blob = simplejpeg.encode_jpeg(pixels, colorspace="RGB")
    decode([torch.frombuffer(bytearray(blob), dtype=torch.uint8)], [WARM_UP], device)


def chosen(position: int, share: float) -> bool:
    """Whether ``position`` of a slice goes to the device: ``share`` of them, evenly spread."""
    return int((position + 1) * share) > int(position * share)


def pack_file(blob: bytes, plan, buf: torch.Tensor, used: int, room: int,
              row: np.ndarray) -> int | None:
    """The JPEG ``blob`` written into ``buf`` at byte ``used`` and its row's fields from the
    offset on (``row[2:]``); the buffer's new end. ``None`` for a file left to the loader
    process (no readable header, CMYK or YCCK, more than ``room`` bytes)."""
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(blob)
    except ValueError:
        return None
    if colorspace not in _NVJPEG_COLORSPACES or len(blob) > room:
        return None
    (left, top, w, h), flip = plan(width, height)
    buf[used:used + len(blob)].numpy()[:] = np.frombuffer(blob, dtype=np.uint8)
    row[2:] = used, len(blob), width, height, left, top, w, h, flip
    return used + len(blob)


def decode_into(bufs, files, metas, start, decode, samples, device) -> tuple[list, int]:
    """The files of a batch's slices decoded by ``decode(blobs, paths, device)``: for each
    slice ``k`` (buffer ``bufs[k]``, file rows ``files[k]``, ``regions`` rows ``metas[k]``,
    whose file rows are filled here), a list of ``(packed offset, crop rows)`` to be copied
    into the batch's packed buffer from byte ``start`` on; and the bytes they take."""
    rows = [(k, r) for k, fs in enumerate(files) for r in fs.tolist()]
    if not rows:
        return [], 0
    blobs = [bufs[k][r[2]:r[2] + r[3]] for k, r in rows]
    paths = [samples[r[1]][0] for _, r in rows]
    if device.type == "cuda":   # nvJPEG's stream does not wait for this one's work
        torch.cuda.current_stream(device).synchronize()
    images = decode(blobs, paths, device)
    copies, at = [], start
    for (k, r), image, path in zip(rows, images, paths):
        position, _, _, _, width, height, left, top, w, h, flip = r
        data.check_decoded_size(image, height, width, path)
        crop = image[:, top:top + h].permute(1, 2, 0)   # [h, width, 3]: whole rows
        metas[k][position] = at, width, left, w, h, flip
        copies.append((at, crop))
        at += crop.numel()
    return copies, at - start
