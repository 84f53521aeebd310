"""SSD300 training throughput on device-resident batches: the registry's variants against what
a user would run.

    python -m benchmarks.ssd.throughput --batch-size 1024 --precision amp-bf16 \
        --variants plain-compile,config,config-minus-fused-match,torchvision-vgg16

The workload's variants are its real training step (SSD300 with the ResNet-34 backbone,
matching and the loss batched on the device, momentum SGD) with the registry's optimisations:
``plain`` with none (the reference path, eager), ``config`` with the 1xH100 config's (but the
image cache and its jitter, which feed the step rather than change it),
``config-minus-<name>`` without one (and what requires it); a variant with ``cuda-graph``
runs as one CUDA graph. The baselines: ``plain-compile`` is the same model trained as a user
would write it, ``torch.compile(model)`` (channels-last, autocast) with the same matching and
loss run eagerly and ``torch.optim.SGD`` (``plain-compile-tuned``: compiled with the tuning
of ``compile=tuned``); ``torchvision-vgg16`` is torchvision's ``ssd300_vgg16`` (its own
matching and loss, eager, at ``--vgg-batch-size`` where a large batch would not fit). Every
variant gets the same images and boxes (4 per image, padded to ``--max-boxes``);
``--profile`` adds kernel time by family. MFU (``common.mfu``) counts the FLOPs of one plain
training step on that batch, for every variant but ``torchvision-vgg16``, another network,
counted on its own step.

With ``--coco-dir DIR`` (a COCO 2017 layout, such as the fixture at a real image size) the
training input pipeline is timed too: the CPU path (decode and augment in ``--workers``
processes) and the image cache in device or host memory (``image-cache=device|host``: its
one-off fill, then batches; each also with ``fused-jitter``), as images/s delivered on the
GPU.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.ssd import data, fused_jitter, image_cache
from benchmarks.ssd.boxes import dboxes300_coco, match
from benchmarks.ssd.loss import Loss
from benchmarks.ssd.model import SSD300
from benchmarks.ssd.workload import SSDWorkload
from common.coco.data import load_split
from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.mfu import MFU
from common.optimisations import ablation_variants, config_optimisations
from common.precision import Precision
from common.throughput import gpu_variants, measure_variant, report_variants, tool_parser
from common.training import build_parser
from common.workload import maybe_compile

BASELINES = ("plain-compile", "plain-compile-tuned", "torchvision-vgg16")
INPUTS = ("image-cache", "fused-jitter")   # they feed the step: not timed on synthetic batches
NUM_CLASSES = 81
LR = 2.5e-3 * 4   # any small LR: throughput only


def ours_variants() -> dict[str, list[str]]:
    """variant -> ``--optimisations`` items."""
    config = [o for o in config_optimisations("ssd", "1xH100")
              if o.partition("=")[0] not in INPUTS]
    return ablation_variants(SSDWorkload.optimisations, config)


def workload(batch_size: int, max_boxes: int, precision: Precision, device, *flags: str):
    """The workload built with these flags (none: the plain model), and its synthetic batch."""
    args = SSDWorkload.parse_bench_args(
        build_parser(SSDWorkload), ["--precision", precision.name, "--seed", "0",
                                    "--max-boxes", str(max_boxes), *flags],
        "synthetic", batch_size)
    wl = SSDWorkload(args, DistEnv(device=device), precision)
    wl.setup()
    return wl, wl.synthetic_batch(batch_size)


def ours_step(items: list[str], batch_size: int, max_boxes: int, precision: Precision, device):
    """The workload's step with the optimisations ``items`` (a CUDA graph with ``cuda-graph``)
    and its batch."""
    wl, batch = workload(batch_size, max_boxes, precision, device,
                         *(["--opt", ",".join(items)] if items else []))
    return GraphedStep(wl.train_step, enabled=wl.args.cuda_graph), batch


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
        loader, fill = data.build_train_loader(split, batch_size, **common), 0.0
        if name != "cpu-decode":
            loader = image_cache.cached(loader, name.split("-")[0], cache_side)
            if name.endswith("fused-jitter"):
                fused_jitter.apply(loader)      # its warm-up as the workload's, before the clock
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
                    "plain-compile,config,torchvision-vgg16", warmup=20, iters=30)
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
    ours = ours_variants()
    variants = gpu_variants(p, a.variants, [*ours, *BASELINES])
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    precision = Precision(a.precision, "cuda")
    precision.apply_backend_flags()
    mfu = MFU.measure(lambda: workload(a.batch_size, a.max_boxes, precision, device), device)
    print(mfu, flush=True)
    rows = []
    for v in variants:
        size = a.vgg_batch_size if v == "torchvision-vgg16" and a.vgg_batch_size else a.batch_size
        own = mfu
        if v in ours:
            step, batch = ours_step(ours[v], size, a.max_boxes, precision, device)
        else:
            batch = data.synthetic_batch(size, NUM_CLASSES, device, a.max_boxes)
            mode = "tuned" if v.endswith("-tuned") else "default"
            step = torchvision_vgg16(precision, device) if v == "torchvision-vgg16" \
                else plain_compile(precision, device, mode)
            if v == "torchvision-vgg16":
                own = mfu.counted(step, batch)
                print(f"{v}: {own}", flush=True)
        rows.append(measure_variant(v, step, batch, device, a.warmup, a.iters, "img/s", own,
                                    a.profile, batch_size=size, precision=a.precision))
        del step, batch
        gc.collect()
        torch._dynamo.reset()   # each variant compiles afresh, as in its own process
        torch.cuda.empty_cache()
    failed = report_variants(rows, ("plain-compile", "torchvision-vgg16"), None)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "results": rows}
    if a.coco_dir:
        report["input_pipeline"] = input_pipeline(a.coco_dir, a.pipeline_batch_size, a.workers,
                                                  a.cache_side, device)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return failed


if __name__ == "__main__":
    sys.exit(main())
