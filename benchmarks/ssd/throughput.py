"""SSD300 training throughput on device-resident batches: ours against what a user would run.

    python -m benchmarks.ssd.throughput --batch-size 128 --precision amp-bf16 \
        --variants ours,ours-compile,ours-eager,plain-compile,torchvision-vgg16

``ours`` is the workload's real training step (SSD300 with the ResNet-34 backbone,
channels-last, matching and the loss batched on the device, momentum SGD) captured as one
CUDA graph; ``ours-compile`` also runs the model and the matching + loss through
``torch.compile`` inside that graph (``ours-compile-s2d``: with the stem convolution over
2x2 pixel blocks, ``--space-to-depth``; ``ours-compile-s2d-pool`` adds the stem's ReLU +
max-pool with a gather-free backward, ``--fused-pool``, and ``ours-compile-s2d-pool-heads``
the confidence scores with the classes innermost, ``--class-last-heads``;
``ours-tuned-s2d-pool-heads`` is that step under ``--compile tuned``, Inductor's
coordinate-descent tuning of each fused kernel; ``ours-tuned-match``, the GPU configs' step,
adds the matching's IoU maxima in one Triton kernel, ``--fused-match``);
``ours-eager`` is the step without graph or compile.
The baselines: ``plain-compile`` is the same model trained as a user would write it,
``torch.compile(model)`` (channels-last, autocast) with the same matching and loss run
eagerly and ``torch.optim.SGD`` (``plain-compile-tuned``: compiled with the same tuning as
``ours-tuned-*``); ``torchvision-vgg16`` is torchvision's ``ssd300_vgg16``
(its own matching and loss, eager, at ``--vgg-batch-size`` where a large batch would not
fit). Every variant gets the same images and boxes (4 per image, padded to
``--max-boxes``); ``--profile`` adds kernel time by family. MFU (``common.mfu``) counts the
FLOPs of one plain training step on that batch, for every variant but ``torchvision-vgg16``,
another network, counted on its own step.

With ``--coco-dir DIR`` (a COCO 2017 layout, such as the fixture at a real image size) the
training input pipeline is timed too: the CPU path (decode and augment in ``--workers``
processes) and the image cache in device or host memory (``--image-cache device|host``: its
one-off fill, then batches; each also with ``--fused-jitter``), as images/s
delivered on the GPU.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.ssd import data, image_cache
from benchmarks.ssd.boxes import dboxes300_coco, match
from benchmarks.ssd.loss import Loss
from benchmarks.ssd.model import SSD300
from benchmarks.ssd.workload import SSDWorkload
from common.coco.data import load_split
from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.kernel_profile import kernel_breakdown
from common.mfu import MFU
from common.precision import Precision
from common.throughput import gpu_variants, time_steps, tool_parser
from common.training import build_parser
from common.workload import maybe_compile

# variant -> (CUDA graph, compile mode, other workload flags) for the workload's step
OURS = {"ours": (True, "none", ()), "ours-compile": (True, "default", ()),
        "ours-eager": (False, "none", ()),
        "ours-compile-s2d": (True, "default", ("--space-to-depth",)),
        "ours-compile-s2d-pool": (True, "default", ("--space-to-depth", "--fused-pool")),
        "ours-compile-s2d-pool-heads": (True, "default", ("--space-to-depth", "--fused-pool",
                                                          "--class-last-heads")),
        "ours-tuned-s2d-pool-heads": (True, "tuned", ("--space-to-depth", "--fused-pool",
                                                      "--class-last-heads")),
        "ours-tuned-match": (True, "tuned", ("--space-to-depth", "--fused-pool",
                                             "--class-last-heads", "--fused-match"))}
VARIANTS = (*OURS, "plain-compile", "plain-compile-tuned", "torchvision-vgg16")
NUM_CLASSES = 81
LR = 2.5e-3 * 4   # any small LR: throughput only


def workload(batch_size: int, max_boxes: int, precision: Precision, device, *flags: str):
    """The workload built with these flags (none: the plain model), and its synthetic batch."""
    args = SSDWorkload.parse_bench_args(
        build_parser(SSDWorkload), ["--precision", precision.name, "--seed", "0",
                                    "--max-boxes", str(max_boxes), *flags],
        "synthetic", batch_size)
    wl = SSDWorkload(args, DistEnv(device=device), precision)
    wl.setup()
    return wl, wl.synthetic_batch(batch_size)


def ours(variant: str, batch_size: int, max_boxes: int, precision: Precision, device):
    graph, compile_mode, flags = OURS[variant]
    wl, batch = workload(batch_size, max_boxes, precision, device, "--channels-last",
                         "--compile", compile_mode, *flags)
    return GraphedStep(wl.train_step, enabled=graph), batch


def plain_compile(precision: Precision, device, mode: str = "default"):
    """The same model, loss and matching, a user's step: compiled model, eager rest."""
    model = SSD300(NUM_CLASSES).to(device, memory_format=torch.channels_last)
    dboxes = dboxes300_coco().to(device)
    loss_fn = Loss(dboxes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)
    fwd = maybe_compile(model, mode)

    def step(images, boxes, labels, valid):
        gloc, glabel = match(boxes, labels, valid, dboxes)
        opt.zero_grad(set_to_none=True)
        with precision.autocast():
            ploc, plabel = fwd(images)
        loss = loss_fn(ploc.float(), plabel.float(), gloc, glabel)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def torchvision_vgg16(precision: Precision, device):
    """torchvision's SSD300-VGG16 as its detection reference trains it (eager)."""
    import torchvision  # GPU machines only: the CPU wheels cannot load it

    model = torchvision.models.detection.ssd300_vgg16(
        weights=None, weights_backbone=None, num_classes=NUM_CLASSES).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)

    def step(images, boxes, labels, valid):
        size = images.shape[-1]
        targets = [{"boxes": b[v] * size, "labels": lab[v]}
                   for b, lab, v in zip(boxes, labels, valid)]
        opt.zero_grad(set_to_none=True)
        with precision.autocast():
            losses = model(list(images), targets)
        loss = sum(losses.values())
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def input_pipeline(coco_dir: Path, batch_size: int, workers: int, cache_side: int, device,
                   epochs: int = 3) -> list[dict]:
    """Training images per second from the CPU loader and from the device image cache: the
    steady state inside an epoch (from the batch after the first ``workers``, which the
    workers prepare at once, to the epoch's end) and the whole epochs with their start-up
    (new workers, the first batches), which a small fixture's short epochs magnify."""
    split = load_split(coco_dir, "train")
    rows = []
    for name in ("cpu-decode", "device-cache", "device-cache-fused-jitter", "host-cache",
                 "host-cache-fused-jitter"):
        common = dict(seed=0, num_workers=workers, device=device, max_boxes=200)
        if name == "cpu-decode":
            loader, fill = data.build_train_loader(split, batch_size, **common), 0.0
        else:
            loader = image_cache.build_train_loader(
                split, batch_size, max_side=cache_side, storage=name.split("-")[0],
                fused_jitter=name.endswith("fused-jitter"), **common)
            loader.warm_up()        # as the workload does, before its clock
            t0 = time.perf_counter()
            loader.cache.fill()
            torch.cuda.synchronize()
            fill = time.perf_counter() - t0
        steady_images = steady_seconds = whole_images = whole_seconds = 0.0
        for epoch in range(1, epochs + 1):
            start = time.perf_counter()
            mark = None
            for n, batch in enumerate(loader.epoch(epoch)):
                if n == workers:
                    torch.cuda.synchronize()
                    mark = time.perf_counter()
                elif n > workers:
                    steady_images += batch[0].shape[0]
                whole_images += batch[0].shape[0]
            torch.cuda.synchronize()
            end = time.perf_counter()
            if mark is None:
                raise SystemExit(f"{coco_dir}: an epoch of {len(loader)} batches of "
                                 f"{batch_size} needs more than {workers} batches to time; "
                                 "lower --pipeline-batch-size or use more images")
            steady_seconds += end - mark
            whole_seconds += end - start
        row = {"pipeline": name, "workers": workers, "batch_size": batch_size,
               "steady_images_per_second": steady_images / steady_seconds,
               "epoch_images_per_second": whole_images / whole_seconds,
               "fill_seconds": fill, "train_images": len(split)}
        rows.append(row)
        print(f"{name:25s} {workers} workers, batch {batch_size}: "
              f"{row['steady_images_per_second']:8.1f} img/s within an epoch, "
              f"{row['epoch_images_per_second']:8.1f} img/s over whole epochs of "
              f"{len(loader)} batches" + (f" (fill {fill:.1f} s, {len(split)} images, "
                                          f"side {cache_side})" if fill else ""), flush=True)
    return rows


def main(argv=None) -> int:
    p = tool_parser("python -m benchmarks.ssd.throughput", __doc__,
                    "ours,ours-compile,ours-eager,plain-compile,torchvision-vgg16",
                    warmup=20, iters=30)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--max-boxes", type=int, default=200)
    p.add_argument("--vgg-batch-size", type=int,
                   help="batch of torchvision-vgg16 (default --batch-size): its eager step "
                        "needs about 12 GiB per 128 images")
    p.add_argument("--coco-dir", type=Path, help="also time the input pipeline on this folder")
    p.add_argument("--workers", type=int, default=12, help="loader processes (--coco-dir)")
    p.add_argument("--pipeline-batch-size", type=int, default=32,
                   help="batch of the input-pipeline timing (--coco-dir): small enough that "
                        "a fixture's epoch holds many batches, as COCO's 916 of 128 do")
    p.add_argument("--cache-side", type=int, default=image_cache.MAX_SIDE)
    a = p.parse_args(argv)
    variants = gpu_variants(p, a.variants, VARIANTS)
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    precision = Precision(a.precision, "cuda")
    precision.apply_backend_flags()
    mfu = MFU.measure(lambda: workload(a.batch_size, a.max_boxes, precision, device), device)
    print(mfu, flush=True)
    rows = []
    for v in variants:
        size = a.vgg_batch_size if v == "torchvision-vgg16" and a.vgg_batch_size else a.batch_size
        if v in OURS:
            step, batch = ours(v, size, a.max_boxes, precision, device)
        else:
            batch = data.synthetic_batch(size, NUM_CLASSES, device, a.max_boxes)
            mode = "tuned" if v.endswith("-tuned") else "default"
            step = torchvision_vgg16(precision, device) if v == "torchvision-vgg16" \
                else plain_compile(precision, device, mode)
        own = mfu
        if v == "torchvision-vgg16":
            own = mfu.counted(step, batch)
            print(f"{v}: {own}", flush=True)
        m = time_steps(v, step, batch, device, a.warmup, a.iters)
        rows.append({"variant": v, "batch_size": size, "precision": a.precision,
                     "samples_per_second": m.samples_per_second,
                     **own.row(m.samples_per_second),
                     "peak_memory_gib": m.peak_memory_bytes / 2**30})
        print(f"{v:18s} batch {size} {a.precision}: {m.samples_per_second:8.1f} img/s, "
              f"{own.text(m.samples_per_second)}, peak {m.peak_memory_bytes / 2**30:.1f} GiB",
              flush=True)
        if a.profile:
            print(kernel_breakdown(step, batch), flush=True)
        del step, batch
        gc.collect()
        torch.cuda.empty_cache()
    base = {r["variant"]: r["samples_per_second"] for r in rows}
    for ref in ("plain-compile", "torchvision-vgg16"):
        if ref in base:
            for r in rows:
                print(f"{r['variant']:18s} x{r['samples_per_second'] / base[ref]:.2f} vs {ref}")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "results": rows}
    if a.coco_dir:
        report["input_pipeline"] = input_pipeline(a.coco_dir, a.pipeline_batch_size, a.workers,
                                                  a.cache_side, device)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
