"""Mask R-CNN training throughput on device-resident batches of 800 x 1066 images (a 640 x
480 image at the training size) padded to 800 x 1088: ours against torchvision's Mask R-CNN
as a user would train it.

    python -m benchmarks.maskrcnn.throughput --batch-size 48 --precision amp-bf16 \
        --variants config,torchvision-eager

Ours is the workload's real training step (R50-FPN, the reference's RPN, RoI sampling and
losses, momentum SGD with the reference's parameter groups) with the 1xH100 config's
proposals per batch and size buckets (``CONFIG_HPARAMS``), under the registry's variants:
``plain`` (no optimisation, the reference path), ``config`` (the 1xH100 config's
optimisations) and ``config-minus-<name>`` (those without one, and without what requires it).
The baselines are torchvision's ``MaskRCNN`` on a ResNet-50 FPN, trained as torchvision's
detection reference trains it: momentum SGD (weight decay 1e-4 on every trained weight),
autocast, a ``GradScaler`` in amp-fp16; eager (``torchvision-eager``) or ``torch.compile``-d
(``torchvision-compile``). Its backbone is built as ``maskrcnn_resnet50_fpn`` builds it for
a pretrained backbone (frozen batch norm, stem and layer1 frozen, as ours), which is how
torchvision's reference trains it: without weights, that builder would train batch norm and
every layer. A variant that fails is reported with its error while the others run, and the
exit status is 1. Every variant gets the same
images (at the training size of a 640 x 480 image, which torchvision's own resize keeps) and
the same boxes, labels and masks; ``--profile`` adds kernel time by family. MFU (``common.mfu``)
counts the FLOPs of one plain step on that batch (proposals and RoIs depend on the data), for
every variant, torchvision's included.
"""

from __future__ import annotations

import gc
import sys

import torch

from benchmarks.maskrcnn import data
from benchmarks.maskrcnn.boxes import TO_REMOVE
from benchmarks.maskrcnn.detector import ground_truth
from benchmarks.maskrcnn.model import NUM_CLASSES
from benchmarks.maskrcnn.workload import MaskRCNNWorkload
from common.dist import DistEnv
from common.mfu import MFU
from common.optimisations import ablation_variants, config_optimisations
from common.precision import Precision
from common.throughput import gpu_variants, measure_variant, report_variants, tool_parser
from common.training import build_parser

# the 1xH100 config's hyper-parameters that shape its step (at batch 48, the default 2000
# proposals per batch would be shared by 48 images); only the warm-up batches pad to the
# buckets: this tool's batch stays 800 x 1088
CONFIG_HPARAMS = ("--rpn-fpn-post-nms-top-n-train", "6000", "--size-buckets", "4")
# variant -> whether torchvision's model runs through torch.compile
TORCHVISION = {"torchvision-eager": False, "torchvision-compile": True}
LR = 0.02 / 3       # ours' first warm-up LR (base 0.02, factor 1/3): throughput only


def ours_variants() -> dict[str, list[str]]:
    """Variant -> the optimisations it names (``--optimisations`` items)."""
    return ablation_variants(MaskRCNNWorkload.optimisations,
                             config_optimisations("maskrcnn", "1xH100"))


def ours(optimisations: list[str], batch_size: int, precision: Precision, device):
    """The workload built with these optimisations, and its synthetic batch."""
    opts = ["--optimisations", ",".join(optimisations)] if optimisations else []
    args = MaskRCNNWorkload.parse_bench_args(
        build_parser(MaskRCNNWorkload),
        ["--precision", precision.name, "--seed", "0", *CONFIG_HPARAMS, *opts], "synthetic",
        batch_size)
    wl = MaskRCNNWorkload(args, DistEnv(device=device), precision)
    wl.setup()
    return wl, wl.synthetic_batch(batch_size)


def torchvision_inputs(batch: data.TrainBatch) -> tuple[list[torch.Tensor], list[dict]]:
    """The batch as torchvision's detection models take it: each image at its own size, in
    0..1 (the model normalises it), with its boxes (ends exclusive, torchvision's convention:
    x2 and y2 one further), labels and masks at that size."""
    boxes, labels, masks = ground_truth(batch.boxes, batch.labels, batch.masks)
    images, targets = [], []
    for image, (h, w), b, lab, m in zip(batch.images, batch.image_sizes.tolist(), boxes,
                                        labels, masks):
        images.append(image[:, :h, :w].float().div(255))
        targets.append({"boxes": b + b.new_tensor([0, 0, TO_REMOVE, TO_REMOVE]),
                        "labels": lab, "masks": m[:, :h, :w].contiguous()})
    return images, targets


def torchvision_step(batch: data.TrainBatch, precision: Precision, device, compiled: bool):
    """torchvision's Mask R-CNN R50-FPN trained as its detection reference does it."""
    import torchvision  # GPU machines only: the CPU wheels cannot load it
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    backbone = resnet_fpn_backbone(backbone_name="resnet50", weights=None, trainable_layers=3)
    model = torchvision.models.detection.MaskRCNN(backbone, num_classes=NUM_CLASSES)
    model.to(device).train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR,
                          momentum=0.9, weight_decay=1e-4)
    scaler = precision.grad_scaler()
    fwd = torch.compile(model) if compiled else model
    images, targets = torchvision_inputs(batch)     # once: torchvision's loader yields these

    def step(*_batch):
        with precision.autocast():
            losses = fwd(images, targets)
        loss = sum(losses.values())
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()
    return step


def main(argv=None) -> int:
    # 10 steps after 5 measured the same compiled step at 81.7 and 108.5 img/s in two calls;
    # 40 after 25 is steadier (docs/performance.md, Mask R-CNN)
    p = tool_parser("python -m benchmarks.maskrcnn.throughput", __doc__,
                    "config,torchvision-eager", warmup=25,
                    iters=40)
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args(argv)
    variants = gpu_variants(p, a.variants, [*(known := ours_variants()), *TORCHVISION])
    device = torch.device("cuda")
    # cudnn.benchmark stays off, as in the workload: the RoI heads' batch changes every step
    precision = Precision(a.precision, "cuda")
    precision.apply_backend_flags()
    mfu = MFU.measure(lambda: ours([], a.batch_size, precision, device), device)
    print(mfu, flush=True)
    rows = []
    for v in variants:
        if v in known:
            wl, batch = ours(known[v], a.batch_size, precision, device)
            step = wl.train_step
        else:   # the same batch as ours' (the same seed)
            batch = data.synthetic_batch(a.batch_size, NUM_CLASSES, device=device)
            wl, step = None, torchvision_step(batch, precision, device, TORCHVISION[v])
        rows.append(measure_variant(v, step, batch, device, a.warmup, a.iters, "img/s", mfu,
                                    a.profile, batch_size=a.batch_size,
                                    precision=a.precision))
        del wl, step, batch
        gc.collect()
        torch.cuda.empty_cache()
    return report_variants(rows, TORCHVISION, a.json)


if __name__ == "__main__":
    sys.exit(main())
