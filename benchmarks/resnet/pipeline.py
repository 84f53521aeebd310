"""Images per second of each stage of the ResNet input pipeline, in one process.

    python -m benchmarks.resnet.pipeline DIR [--workers 8,16] [--batch-size 256] \
        [--seconds 10] [--stages all] [--json stages.json]

``DIR`` is an ImageNet-format folder (e.g. ``python -m benchmarks.resnet.fixture DIR
--imagenet-like``); the training split is read. Stages (``--stages``, comma-separated):

| stage | what is timed |
|---|---|
| read | loader processes reading each batch's files into one buffer |
| plan | read + JPEG headers + crop plans (``nvjpeg``'s loader processes) |
| decode-pillow | loader processes decoding whole images with Pillow (RGB) |
| decode-pillow-draft | the same, DCT-downscaled (Pillow's ``draft``) to at least the output size |
| decode-turbo | loader processes decoding whole images with libjpeg-turbo (``simplejpeg``) |
| crops-pillow | one thread of this process: the Pillow reader's work per training image
  (read, Pillow decode, crop and resize, flip), what each of its loader processes does |
| crops-turbo | the same for ``turbo`` (libjpeg-turbo decode, torch's resize) |
  (``--region-decode``: only the crop's region decoded, here and in turbo-train/-eval) |
| regions-turbo | one thread: read and decode each training crop's region as
  ``--region-decode`` does, without the resize (crops-turbo less this: the resize's share) |
  (``--resize-on-device``: crops-turbo and turbo-train/-eval send the crops unresized and
  resize each batch on the device) |
| cpu-train | the Pillow reader (the reference), whole training pipeline |
| turbo-train | ``turbo``, whole training pipeline |
| turbo-eval | ``turbo``, whole evaluation pipeline (resize 256, centre 224) |
  (``--eval-nvjpeg-share``: that share of each batch decoded by nvJPEG in this process) |
| h2d | host-to-device copies of packed file bytes from pinned memory (batches in memory) |
| decode-nvjpeg | one batched ``decode_jpeg`` per batch (batches in pinned memory; GPU) |
| crop-resize | the batched crop, resize, flip, normalise on decoded batches on the device |
| resize-regions | ``--resize-on-device``'s resize, flip and normalise of packed training crops
  on the device (batches packed in this process, copied there first) |
| nvjpeg-train | ``nvjpeg``, whole training pipeline (``--cpu-decode-share``) |
| nvjpeg-eval | ``nvjpeg``, whole evaluation pipeline (resize 256, centre 224) |

Stages with loader processes run once per ``--workers`` count; the others in this process.
Each stage runs for ``--seconds`` after its first batch (start-up excluded), passing over
the folder as often as needed with the same loader processes (``cpu-train``'s start anew at
each pass, as the Pillow reader's do at each epoch). On ``--device cpu`` the GPU stages
are refused and ``crop-resize`` runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import simplejpeg
import torch
from PIL import Image

from benchmarks.resnet import data, nvjpeg, regions, turbo
from benchmarks.resnet.region_decode import RegionDecoder
from common import loaders
from common.errors import UserError, one_line

DECODE_STAGES = ("decode-pillow", "decode-pillow-draft", "decode-turbo")
CROP_STAGES = ("crops-pillow", "crops-turbo", "regions-turbo")
WORKER_STAGES = ("read", "plan", *DECODE_STAGES, "cpu-train", "turbo-train", "turbo-eval",
                 "nvjpeg-train", "nvjpeg-eval")
STAGES = ("read", "plan", *DECODE_STAGES, *CROP_STAGES, "cpu-train", "turbo-train",
          "turbo-eval", "h2d", "decode-nvjpeg", "crop-resize", "resize-regions", "nvjpeg-train",
          "nvjpeg-eval")
GPU_STAGES = ("h2d", "decode-nvjpeg", "nvjpeg-train", "nvjpeg-eval")
IN_MEMORY_BATCHES = 8   # batches held in memory for the in-process stages


class _PackedBytes(torch.utils.data.Dataset):
    """Item ``b`` is batch ``b``'s files as one uint8 buffer plus sizes: one object per batch
    crosses the worker queue instead of one shared-memory tensor per image."""

    def __init__(self, samples, batches: list[list[int]]):
        self.samples, self.batches = samples, batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, b):
        blobs = data.read_files(self.samples, self.batches[b])
        return data.pack(blobs), [len(x) for x in blobs], self.batches[b]


class _Decoded(_PackedBytes):
    """Item ``b``: batch ``b`` decoded by Pillow (``draft``: DCT-downscaled to about
    ``size``) or by libjpeg-turbo (``turbo``; Pillow for what it cannot convert), as
    the number of images and their decoded bytes."""

    def __init__(self, samples, batches, size: int | None, turbo: bool = False):
        super().__init__(samples, batches)
        self.size, self.turbo = size, turbo

    def __getitem__(self, b):
        nbytes = 0
        for i in self.batches[b]:
            if self.turbo:
                with open(self.samples[i][0], "rb") as f:
                    blob = f.read()
                try:
                    nbytes += simplejpeg.decode_jpeg(blob, colorspace="RGB").nbytes
                    continue
                except ValueError:   # CMYK: Pillow, as the turbo backend does
                    pass
            with Image.open(self.samples[i][0]) as im:
                if self.size:
                    im.draft("RGB", (self.size, self.size))
                nbytes += len(im.convert("RGB").tobytes())
        return torch.tensor([len(self.batches[b]), nbytes])


def _worker_loader(stage, samples, batches, size, workers):
    """The stage's DataLoader, its workers kept from one pass to the next."""
    if stage == "plan":
        return nvjpeg.planned_loader(samples, size, True, 0, workers, False,
                                     loaders.Keys([(1, b) for b in batches]))
    if stage == "read":
        ds = _PackedBytes(samples, batches)
    else:
        ds = _Decoded(samples, batches, size if stage == "decode-pillow-draft" else None,
                      turbo=stage == "decode-turbo")
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                       prefetch_factor=4 if workers else None,
                                       persistent_workers=workers > 0)


def _count(stage, item) -> int:
    return int(item[0]) if stage in DECODE_STAGES else len(item[1])


def _timed(passes, count, seconds: float, device) -> dict:
    """Images per second over ``passes()`` (each an iterable of batches), repeated until
    ``seconds`` have passed after the first batch."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    images, t0 = 0, None
    while True:
        for item in passes():
            if t0 is None:
                sync()
                t0 = time.perf_counter()
                continue
            images += count(item)
            if time.perf_counter() - t0 > seconds:
                break
        sync()
        elapsed = time.perf_counter() - t0 if t0 is not None else 0.0
        if elapsed > seconds:
            return {"images": images, "seconds": elapsed, "images_per_second": images / elapsed}


def _crops_one_thread(stage, samples, batches, size, seconds, region_decode,
                      resize_on_device) -> dict:
    """A loader process's work per training image, timed in this process on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as in a DataLoader worker
    try:
        if stage == "crops-pillow":
            pillow = data._PillowDataset(samples, size, True, 0)
            def crop(batch):
                return [pillow[i] for i in batch]
        elif stage == "regions-turbo":
            region = RegionDecoder()
            def crop(batch):
                return [region.crop(blob, lambda w, h, i=i: data.crop_plan(w, h, size, True,
                                                                          0, 1, i))
                        for blob, i in zip(data.read_files(samples, batch), batch)]
        else:
            budget = turbo.REGION_BUDGET if resize_on_device else 1
            buffers = loaders.SharedBuffers(0, 1, len(batches[0]) * size * size * 3 * budget)
            turbo_slices = turbo.DecodedSlices(samples, size, True, 0, region_decode, buffers,
                                               resize_on_device)
            def crop(batch):   # the buffer reused, as in a loader process
                sent, *_, labels = turbo_slices[1, batch]
                buffers.release([sent])
                return labels
        return _timed(lambda: map(crop, batches), len, seconds, torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)


def _in_memory(samples, batches, size) -> list:
    """A few planned batches (files read, headers parsed) in pinned memory where possible."""
    keys = loaders.Keys([(1, b) for b in batches[:IN_MEMORY_BATCHES]])
    return list(nvjpeg.planned_loader(samples, size, True, 0, 0, torch.cuda.is_available(),
                                      keys))


def run_stage(stage, index, args, device, workers: int | None) -> dict:
    size = args.image_size
    train = not stage.endswith("-eval")
    samples = index.train if train else index.val
    batch = args.batch_size if train else args.eval_batch_size
    order = list(range(len(samples)))
    batches = [order[i:i + batch] for i in range(0, len(order) - batch + 1, batch)]
    if not batches:
        raise UserError(f"{index.root}: {len(samples)} images are fewer than one batch of "
                        f"{batch}; lower --batch-size or write more images")
    if stage in ("read", "plan", *DECODE_STAGES):
        loader = _worker_loader(stage, samples, batches, size, workers)
        try:
            return _timed(lambda: loader, lambda item: _count(stage, item), args.seconds,
                          device)
        finally:
            loaders.shut_down(loader)
    if stage in CROP_STAGES:
        return _crops_one_thread(stage, samples, batches, size, args.seconds,
                                 args.region_decode, args.resize_on_device)
    if stage in ("cpu-train", "turbo-train", "turbo-eval", "nvjpeg-train", "nvjpeg-eval"):
        backend = stage.split("-")[0]
        decoder = {"cpu": data.pillow_decoder, "turbo": turbo.TurboDecoder,
                   "nvjpeg": nvjpeg.BatchedDecoder}[backend]
        kw = {"cpu_share": args.cpu_decode_share} if backend == "nvjpeg" else {}
        if backend == "turbo":
            kw.update(region_decode=args.region_decode, resize_on_device=args.resize_on_device)
            if not train and args.eval_nvjpeg_share:
                kw.update(device_share=args.eval_nvjpeg_share, device_decode=(
                    nvjpeg.nvjpeg_decode if device.type == "cuda" else nvjpeg.pillow_decode))
        loader = data.build_loader(index, train, size, batch, 0, 1, workers, device,
                                   decoder=decoder, **kw)
        epochs = iter(range(1, 1 << 30))
        try:
            return _timed(lambda: loader.epoch(next(epochs)), lambda item: len(item[1]),
                          args.seconds, device)
        finally:
            loader.close()
    if stage == "resize-regions":
        slices = turbo.DecodedSlices(samples, size, True, 0, args.region_decode, regions=True)
        packed = [[torch.as_tensor(t).to(device) for t in slices[1, b][:2]]
                  for b in batches[:IN_MEMORY_BATCHES]]
        return _timed(lambda: (regions.resize(p, m, size) for p, m in packed), len,
                      args.seconds, device)
    items = _in_memory(samples, batches, size)
    if stage == "h2d":
        def copy(item):
            return item[0].to(device, non_blocking=True), item[1]
        result = _timed(lambda: map(copy, items), lambda item: len(item[1]), args.seconds,
                        device)
        nbytes = sum(item[0].numel() for item in items) / sum(len(item[1]) for item in items)
        result["megabytes_per_second"] = result["images_per_second"] * nbytes / 1e6
        return result
    decode = nvjpeg.nvjpeg_decode if device.type == "cuda" else nvjpeg.pillow_decode
    assemble = nvjpeg.BatchAssembler(samples, size, device, decode)
    if stage == "decode-nvjpeg":
        return _timed(lambda: map(assemble.decode_batch, items), lambda d: len(d[0]),
                      args.seconds, device)
    decoded = [assemble.decode_batch(item) for item in items]
    return _timed(lambda: (assemble.crops(images, *rest[:-1]) for images, rest in decoded),
                  len, args.seconds, device)


def dataset_stats(index, limit: int = 2000) -> dict:
    """Image count, mean file size and image size over (up to ``limit`` of) the train split."""
    step = max(1, len(index.train) // limit)
    sizes, dims = [], []
    for path, _ in index.train[::step]:
        with open(path, "rb") as f:
            blob = f.read()
        sizes.append(len(blob))
        try:
            dims.append(nvjpeg.jpeg_header(blob)[:2])
        except ValueError:
            pass
    n = max(len(dims), 1)
    return {"train_images": len(index.train), "val_images": len(index.val),
            "sampled": len(sizes), "mean_kb": sum(sizes) / len(sizes) / 1e3,
            "mean_width": sum(w for w, _ in dims) / n, "mean_height": sum(h for _, h in dims) / n}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.resnet.pipeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dir", type=Path)
    p.add_argument("--stages", default="all", help=f"comma-separated: {', '.join(STAGES)}")
    p.add_argument("--workers", default="8,16", help="loader-process counts, comma-separated")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--eval-batch-size", type=int, default=250)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seconds", type=float, default=10.0, help="timed seconds per stage")
    p.add_argument("--cpu-decode-share", type=float, default=0.0,
                   help="nvjpeg-train/-eval: the share of each batch the loader processes "
                        "decode, crop and resize (as the turbo backend)")
    p.add_argument("--region-decode", action="store_true",
                   help="crops-turbo, turbo-train/-eval: decode only each crop's region "
                        "(libjpeg-turbo 3; region_decode.py)")
    p.add_argument("--resize-on-device", action="store_true",
                   help="crops-turbo, turbo-train/-eval: crops sent unresized, each batch "
                        "resized on the device (regions.py)")
    p.add_argument("--eval-nvjpeg-share", type=float, default=0.0,
                   help="turbo-eval with --resize-on-device: the share of each batch decoded "
                        "by nvJPEG in this process (nvjpeg_share.py)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, help="write the table and the dataset's statistics here")
    a = p.parse_args(argv)
    a.stages = list(STAGES) if a.stages == "all" else a.stages.split(",")
    unknown = sorted(set(a.stages) - set(STAGES))
    if unknown:
        p.error(f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    try:
        a.workers = [int(w) for w in a.workers.split(",")]
    except ValueError:
        p.error(f"--workers {a.workers!r}: give loader-process counts such as 8,16")
    a.device = torch.device(a.device)
    gpu_only = sorted(set(a.stages) & set(GPU_STAGES))
    if a.device.type != "cuda" and gpu_only:
        p.error(f"stage(s) {gpu_only} need a CUDA device; leave them out of --stages")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        index = data.ImageFolderIndex.scan(a.data_dir)
        stats = dataset_stats(index)
        print(f"{a.data_dir}: {stats['train_images']} train images, mean "
              f"{stats['mean_kb']:.1f} KB, mean {stats['mean_width']:.0f}x"
              f"{stats['mean_height']:.0f} px; batch {a.batch_size}, {a.image_size} px, "
              f"{os.cpu_count()} host cores"
              f"{', region decode' if a.region_decode else ''}"
              f"{', resize on the device' if a.resize_on_device else ''}", flush=True)
        print(f"{'stage':20s} {'workers':>7s} {'img/s':>10s}", flush=True)
        rows = []
        for stage in a.stages:
            for workers in (a.workers if stage in WORKER_STAGES else [None]):
                row = {"stage": stage, "workers": workers,
                       **run_stage(stage, index, a, a.device, workers)}
                rows.append(row)
                extra = (f"  {row['megabytes_per_second']:.0f} MB/s"
                         if "megabytes_per_second" in row else "")
                print(f"{stage:20s} {workers if workers is not None else '-':>7} "
                      f"{row['images_per_second']:10.1f}{extra}", flush=True)
    except UserError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    if a.json:
        device = torch.cuda.get_device_name(a.device) if a.device.type == "cuda" else "cpu"
        a.json.write_text(json.dumps({"device": device, "torch": torch.__version__,
                                      "batch_size": a.batch_size, "image_size": a.image_size,
                                      "region_decode": a.region_decode,
                                      "resize_on_device": a.resize_on_device, "dataset": stats,
                                      "stages": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
