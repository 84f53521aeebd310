"""Mask R-CNN training throughput at 800 x 1333 on device-resident batches: ours against
torchvision's Mask R-CNN as a user would train it.

    python -m benchmarks.maskrcnn.throughput --batch-size 8 --precision amp-bf16 \
        --variants ours,ours-fold-cl,torchvision-eager,torchvision-compile

``ours`` is the workload's real training step (R50-FPN, the reference's RPN, RoI sampling and
losses, momentum SGD with the reference's parameter groups), eager: its capture policy is
"never", as proposals and sampled RoIs depend on the data; ``ours-topk4`` selects the RPN's
pre-NMS candidates in NVIDIA's two stages over 4 chunks (``--topk-chunks 4``);
``ours-per-image`` keeps 2000 proposals per image over the levels, as NVIDIA and torchvision
do, instead of the reference's 2000 per batch (``--fpn-post-nms-per-image``);
``ours-fold`` runs each backbone convolution and its frozen batch norm as one convolution
(``--fold-frozen-bn``), ``ours-fold-cl`` also keeps images and networks in channels-last
memory (``--channels-last``), ``ours-nms`` also runs NMS's greedy step as one Triton kernel
(``--nms triton``), ``ours-compile`` (without it) also runs the
networks through ``torch.compile`` (``--compile default``: backbone + FPN + RPN head, box
head, mask head);
``ours-streams`` and ``ours-compile-streams`` add the losses on CUDA streams of their own
(``--loss-streams``); ``ours-compile-streams-nms`` also runs NMS's
greedy step as one Triton kernel (``--nms triton``), ``ours-graphs`` also replays the
compiled backbone's forward and backward as CUDA graphs (``--backbone-graphs``),
``ours-graphs-pad`` also rounds the mask head's RoI count up to a multiple of 128
(``--mask-roi-multiple 128``), ``ours-graphs-pad-buckets`` also
takes the configs' 4 size buckets (``--size-buckets 4``; only the
loaders and warm-up batches pad to them: this tool's batch stays 800 x 1088),
``ours-head-graphs`` also replays the box and mask heads as CUDA
graphs (``--head-graphs``, with ``--box-roi-multiple 512``), ``ours-losses`` also compiles
the RPN, box and mask losses (``--compile-losses``), ``ours-losses-proposals`` also the
RPN's proposal selection (``--compile-proposals``); ``ours-early-box`` and
``ours-early-box-proposals`` add to those two the box head before the sampler's host sync
(``--box-head-before-sync``); ``ours-fused-sgd`` is ``ours-losses`` with the SGD update as
one fused kernel (``--fused-sgd``), ``ours-early-box-sgd`` is ``ours-early-box`` with it;
``ours-aligned`` is ``ours-early-box-sgd`` with the RPN's, box predictor's and mask
predictor's output counts padded to multiples of 8 (``--aligned-outputs``; the 8xH200
config's step until session 31), ``ours-aligned-proposals`` that with
``--compile-proposals``, ``ours-early-backward`` (the 1xH100 config's step until session 31)
that with the RPN's and box losses' backward before the sampler's sync
(``--backward-before-sync``), ``ours-roi-triton`` (the 1xH100 config's step until session
32) that with RoIAlign as a Triton kernel (``--roi-align triton``), ``ours-conv-relu`` that
with each convolution's adds and ReLU in cuDNN's epilogue (``--fused-conv-relu``),
``ours-conv-relu-s2d`` (the 1xH100 config's step) that with the stem over 2x2 pixel blocks
(``--space-to-depth``); ``ours-1xh100``, ``ours-1xh100-roi-triton``,
``ours-1xh100-conv-relu`` and ``ours-1xh100-conv-relu-s2d`` are ``ours-early-backward``,
``ours-roi-triton``, ``ours-conv-relu`` and ``ours-conv-relu-s2d`` with the 1xH100 config's
6000 proposals per batch (``--rpn-fpn-post-nms-top-n-train``), for its batch of 48 (at the
default 2000, 48 images would share 2000 proposals);
``ours-tuned-streams-nms`` is ``ours-compile-streams-nms`` under ``--compile tuned`` (Inductor's
coordinate-descent tuning of each fused kernel).
The baselines are torchvision's ``MaskRCNN`` on a ResNet-50 FPN, trained as torchvision's
detection reference trains it: momentum SGD (weight decay 1e-4 on every trained weight),
autocast, a ``GradScaler`` in amp-fp16; eager (``torchvision-eager``) or ``torch.compile``-d
(``torchvision-compile``). Its backbone is built as ``maskrcnn_resnet50_fpn`` builds it for
a pretrained backbone (frozen batch norm, stem and layer1 frozen, as ours), which is how
torchvision's reference trains it: without weights, that builder would train batch norm and
every layer. A variant that fails is reported with its error while the others run, and the
exit status is 1. Every variant gets the same
images (at the training size of a 640 x 480 image, which torchvision's own resize keeps) and
the same boxes, labels and masks; ``--profile`` adds kernel time by family.
"""

from __future__ import annotations

import gc
import sys

import torch

from benchmarks.maskrcnn import data
from benchmarks.maskrcnn.boxes import TO_REMOVE
from benchmarks.maskrcnn.detector import ground_truth
from benchmarks.maskrcnn.model import NUM_CLASSES
from benchmarks.maskrcnn.topk import SPLIT_TOPK_CHUNKS
from benchmarks.maskrcnn.workload import MaskRCNNWorkload
from common.dist import DistEnv
from common.precision import Precision
from common.throughput import gpu_variants, measure_variant, report_variants, tool_parser
from common.training import build_parser

# the previous configs' step, which the graphed variants build on
STREAMS_NMS = ("--fold-frozen-bn", "--channels-last", "--compile", "default", "--loss-streams",
               "--nms", "triton")
# that step with the backbone's graphs, padded mask RoIs and the configs' size buckets
GRAPHS_PAD_BUCKETS = (*STREAMS_NMS, "--backbone-graphs", "--mask-roi-multiple", "128",
                      "--size-buckets", "4")
# that step with the heads' graphs, which the configs' steps build on
HEAD_GRAPHS = (*GRAPHS_PAD_BUCKETS, "--head-graphs", "--box-roi-multiple", "512")
# that step with its losses compiled, the box head before the sync and the fused SGD update
EARLY_BOX_SGD = (*HEAD_GRAPHS, "--compile-losses", "--box-head-before-sync", "--fused-sgd")
# the 8xH200 config's step until session 31, without --roi-align triton (the 1xH100 config's
# added --backward-before-sync)
ALIGNED = (*EARLY_BOX_SGD, "--aligned-outputs")
# the 1xH100 config's step until session 31
EARLY_BACKWARD = (*ALIGNED, "--backward-before-sync")
# the 1xH100 config's step until session 32
ROI_TRITON = (*EARLY_BACKWARD, "--roi-align", "triton")
# that step with the convolutions' adds and ReLUs in cuDNN's epilogues
CONV_RELU = (*ROI_TRITON, "--fused-conv-relu")
# the 1xH100 config's step: that with the stem over 2x2 pixel blocks
CONV_RELU_S2D = (*CONV_RELU, "--space-to-depth")
# the 1xH100 config's proposals per batch, for its batch of 48
PROPOSALS_1XH100 = ("--rpn-fpn-post-nms-top-n-train", "6000")
# variant -> workload flags of the workload's step
OURS = {"ours": (), "ours-topk4": ("--topk-chunks", str(SPLIT_TOPK_CHUNKS)),
        "ours-per-image": ("--fpn-post-nms-per-image",), "ours-fold": ("--fold-frozen-bn",),
        "ours-fold-cl": ("--fold-frozen-bn", "--channels-last"),
        "ours-nms": ("--fold-frozen-bn", "--channels-last", "--nms", "triton"),
        "ours-streams": ("--fold-frozen-bn", "--channels-last", "--loss-streams"),
        "ours-compile": ("--fold-frozen-bn", "--channels-last", "--compile", "default"),
        "ours-compile-streams": ("--fold-frozen-bn", "--channels-last", "--compile", "default",
                                 "--loss-streams"),
        "ours-compile-streams-nms": STREAMS_NMS,
        "ours-graphs": (*STREAMS_NMS, "--backbone-graphs"),
        "ours-graphs-pad": (*STREAMS_NMS, "--backbone-graphs", "--mask-roi-multiple", "128"),
        "ours-graphs-pad-buckets": GRAPHS_PAD_BUCKETS,
        "ours-head-graphs": HEAD_GRAPHS,
        "ours-losses": (*HEAD_GRAPHS, "--compile-losses"),
        "ours-losses-proposals": (*HEAD_GRAPHS, "--compile-losses", "--compile-proposals"),
        "ours-early-box": (*HEAD_GRAPHS, "--compile-losses", "--box-head-before-sync"),
        "ours-early-box-proposals": (*HEAD_GRAPHS, "--compile-losses", "--compile-proposals",
                                     "--box-head-before-sync"),
        "ours-fused-sgd": (*HEAD_GRAPHS, "--compile-losses", "--fused-sgd"),
        "ours-early-box-sgd": EARLY_BOX_SGD,
        "ours-aligned": ALIGNED,
        "ours-aligned-proposals": (*ALIGNED, "--compile-proposals"),
        "ours-early-backward": EARLY_BACKWARD,
        "ours-1xh100": (*EARLY_BACKWARD, *PROPOSALS_1XH100),
        "ours-roi-triton": ROI_TRITON,
        "ours-1xh100-roi-triton": (*ROI_TRITON, *PROPOSALS_1XH100),
        "ours-conv-relu": CONV_RELU,
        "ours-conv-relu-s2d": CONV_RELU_S2D,
        "ours-1xh100-conv-relu": (*CONV_RELU, *PROPOSALS_1XH100),
        "ours-1xh100-conv-relu-s2d": (*CONV_RELU_S2D, *PROPOSALS_1XH100),
        "ours-tuned-streams-nms": ("--fold-frozen-bn", "--channels-last", "--compile",
                                   "tuned", "--loss-streams", "--nms", "triton")}
# variant -> whether torchvision's model runs through torch.compile
TORCHVISION = {"torchvision-eager": False, "torchvision-compile": True}
VARIANTS = (*OURS, *TORCHVISION)
LR = 0.02 / 3       # ours' first warm-up LR (base 0.02, factor 1/3): throughput only


def ours(variant: str, batch_size: int, precision: Precision, device):
    args = MaskRCNNWorkload.parse_bench_args(
        build_parser(MaskRCNNWorkload),
        ["--precision", precision.name, "--seed", "0", *OURS[variant]], "synthetic", batch_size)
    wl = MaskRCNNWorkload(args, DistEnv(device=device), precision)
    wl.setup()
    return wl.train_step, wl.synthetic_batch(batch_size)


def torchvision_inputs(batch: data.TrainBatch) -> tuple[list[torch.Tensor], list[dict]]:
    """The batch as torchvision's detection models take it: each image at its own size, with
    its boxes (ends exclusive, torchvision's convention: x2 and y2 one further), labels and
    masks at that size."""
    boxes, labels, masks = ground_truth(batch.boxes, batch.labels, batch.masks)
    images, targets = [], []
    for image, (h, w), b, lab, m in zip(batch.images, batch.image_sizes.tolist(), boxes,
                                        labels, masks):
        images.append(image[:, :h, :w].contiguous())
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
                    "ours,ours-fold-cl,torchvision-eager,torchvision-compile", warmup=25,
                    iters=40)
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args(argv)
    variants = gpu_variants(p, a.variants, VARIANTS)
    device = torch.device("cuda")
    # cudnn.benchmark stays off, as in the workload: the RoI heads' batch changes every step
    precision = Precision(a.precision, "cuda")
    precision.apply_backend_flags()
    rows = []
    for v in variants:
        if v in OURS:
            step, batch = ours(v, a.batch_size, precision, device)
        else:   # the same batch as ours' (the same seed)
            batch = data.synthetic_batch(a.batch_size, NUM_CLASSES, device=device)
            step = torchvision_step(batch, precision, device, TORCHVISION[v])
        rows.append(measure_variant(v, step, batch, device, a.warmup, a.iters, "img/s",
                                    a.profile, batch_size=a.batch_size,
                                    precision=a.precision))
        del step, batch
        gc.collect()
        torch.cuda.empty_cache()
    return report_variants(rows, TORCHVISION, a.json)


if __name__ == "__main__":
    sys.exit(main())
