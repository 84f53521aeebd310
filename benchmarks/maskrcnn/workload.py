"""MLPerf Training ``maskrcnn``: Mask R-CNN R50-FPN on COCO 2017 to box mAP 0.377 and mask mAP
0.339, both in the same evaluation.

Defaults are the MLCommons v1.1 reference's (``object_detection/pytorch/maskrcnn_benchmark``:
``config/defaults.py``, ``configs/e2e_mask_rcnn_R_50_FPN_1x.yaml``, ``solver/build.py``,
``solver/lr_scheduler.py``): SGD with momentum 0.9 and weight decay 1e-4, biases at twice the
learning rate and without weight decay (``make_optimizer``); base LR 0.02 for 16 images
(``--lr`` is the base LR itself, 0.02 x global batch / 16 by convention, and the 1.1.0 rules
want a multiple of 0.02); ``WarmupMultiStepLR``: a linear warm-up from ``warmup_factor`` x
the LR over the first steps, then x0.1 at each of two decay steps; images resized to 800
(shorter side) / 1333 (longer side at most); evaluation after every epoch.

Evaluation splits into the forwards with post-processing and mask pasting (``eval_outputs``,
gathered on rank 0) and COCO scoring of boxes and masks (:func:`score`), which
``--background-scoring`` runs beside training. Boxes go to COCO with the reference's
inclusive-pixel widths (``w = x2 - x1 + 1``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.maskrcnn import data, rpn
from benchmarks.maskrcnn.detector import Detector, ground_truth
from benchmarks.maskrcnn.model import (
    FPN_CHANNELS,
    MASK_CONV_LAYERS,
    MLP_HEAD_DIM,
    NUM_CLASSES,
    WIDTH,
    MaskRCNN,
    load_torchvision_backbone,
    mllog_tensor_names,
)
from benchmarks.maskrcnn.roi_align import rois_from_boxes
from benchmarks.maskrcnn.roi_heads import BATCH_SIZE_PER_IMAGE, ImageDetections, RoISampler
from benchmarks.maskrcnn.topk import SPLIT_TOPK_CHUNKS
from common import dist
from common.coco import cli, evaluation
from common.coco import data as coco
from common.coco.evaluation import Detections, ScoreRequest, encode_masks
from common.errors import UserError, require_cuda
from common.kernel_profile import region
from common.mllog import constants
from common.precision import grad_scaler_state
from common.sgd import DeviceLRSGD
from common.workload import CapturePolicy, EvalPoint, Target, Workload, epoch_points

DECAY_FACTOR = 0.1              # SOLVER.GAMMA


def score(request: ScoreRequest) -> dict[str, float]:
    """COCO box and mask mAP of the request's detections as the targets name them
    (``BBOX``, ``SEGM``): module level and picklable, for background scoring."""
    metrics = evaluation.score(request)
    return {"BBOX": metrics["bbox_map"], "SEGM": metrics["segm_map"]}


def lr_at(step: torch.Tensor, base: float, warmup_steps: int, warmup_factor: float,
          decay_steps: list[int]) -> torch.Tensor:
    """``WarmupMultiStepLR`` (linear) at 0-based ``step`` (device ops): ``base`` x
    ``warmup_factor (1 - a) + a``, ``a = step / warmup_steps``, during the warm-up, x0.1 from
    each decay step on."""
    alpha = (step / max(warmup_steps, 1)).clamp(max=1)
    warm = torch.where(step < warmup_steps, warmup_factor * (1 - alpha) + alpha, 1.0)
    decays = sum((step >= s).float() for s in decay_steps) if decay_steps else 0 * step
    return base * warm * torch.pow(DECAY_FACTOR, decays)


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 60000,80000, got {text!r}"
                                         ) from None


class MaskRCNNWorkload(Workload):
    name = constants.MASKRCNN
    targets = (Target("BBOX", 0.377), Target("SEGM", 0.339))
    scorer = staticmethod(score)

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="COCO 2017: annotations/instances_{train,val}2017.json, "
                            "{train,val}2017/*.jpg")
        p.add_argument("--batch-size", type=int, default=2,
                       help="per-rank images per step (the reference: 16 on 8 GPUs)")
        p.add_argument("--eval-batch-size", type=int, default=8, help="per-rank images")
        p.add_argument("--epochs", type=int, default=13,
                       help="epoch cap (the reference's 90000 steps of 16 images: 12.3 epochs)")
        p.add_argument("--lr", type=float, default=0.02,
                       help="base learning rate (0.02 x global batch / 16; a multiple of 0.02)")
        p.add_argument("--warmup-steps", type=int, default=500)
        p.add_argument("--warmup-factor", type=float, default=1 / 3,
                       help="the warm-up's first LR as a fraction of the base LR")
        p.add_argument("--lr-decay-steps", type=_ints, default=[60000, 80000],
                       help="two steps from which the LR drops x0.1")
        p.add_argument("--momentum", type=float, default=0.9)
        p.add_argument("--weight-decay", type=float, default=1e-4)
        p.add_argument("--bias-lr-factor", type=float, default=2.0)
        p.add_argument("--bias-weight-decay", type=float, default=0.0)
        p.add_argument("--min-size", type=int, default=data.MIN_SIZE,
                       help="shorter image side after resizing")
        p.add_argument("--max-size", type=int, default=data.MAX_SIZE,
                       help="longest image side after resizing, at most")
        # RPN and RoI heads, per image unless said otherwise
        p.add_argument("--rpn-pre-nms-top-n-train", type=int, default=rpn.PRE_NMS_TOP_N_TRAIN,
                       help="candidates per level before NMS")
        p.add_argument("--rpn-pre-nms-top-n-test", type=int, default=rpn.PRE_NMS_TOP_N_TEST)
        p.add_argument("--rpn-post-nms-top-n-train", type=int,
                       default=rpn.POST_NMS_TOP_N_TRAIN, help="per level, after NMS")
        p.add_argument("--rpn-post-nms-top-n-test", type=int, default=rpn.POST_NMS_TOP_N_TEST)
        p.add_argument("--rpn-fpn-post-nms-top-n-train", type=int,
                       default=rpn.FPN_POST_NMS_TOP_N_TRAIN,
                       help="proposals over the levels, per batch (per image with "
                            "--fpn-post-nms-per-image); mllog num_image_candidates, a "
                            "multiple of 1000")
        p.add_argument("--rpn-fpn-post-nms-top-n-test", type=int,
                       default=rpn.FPN_POST_NMS_TOP_N_TEST)
        p.add_argument("--fpn-post-nms-per-image", action=argparse.BooleanOptionalAction,
                       default=False, help="NVIDIA's per-image selection over the levels")
        p.add_argument("--rpn-batch-size-per-image", type=int,
                       default=rpn.BATCH_SIZE_PER_IMAGE, help="anchors sampled for the loss")
        p.add_argument("--roi-batch-size-per-image", type=int, default=BATCH_SIZE_PER_IMAGE,
                       help="RoIs sampled for the box head")
        p.add_argument("--topk-chunks", type=int, default=1,
                       help=f"RPN pre-NMS top-K in two stages over this many chunks "
                            f"(NVIDIA: {SPLIT_TOPK_CHUNKS}; the same result)")
        p.add_argument("--fold-frozen-bn", action=argparse.BooleanOptionalAction,
                       default=False, help="each backbone convolution and its frozen batch "
                       "norm as one convolution (the same result; keeps autocast's dtype)")
        p.add_argument("--fused-conv-relu", action=argparse.BooleanOptionalAction,
                       default=False, help="every convolution followed by a ReLU (the "
                       "backbone's, with their folded shift and residual; the RPN head's; the "
                       "mask head's) as one cuDNN kernel, the adds and ReLU in its epilogue "
                       "(common/conv_relu.py; needs --fold-frozen-bn, CUDA only; the same "
                       "result to bf16 rounding)")
        p.add_argument("--space-to-depth", action=argparse.BooleanOptionalAction,
                       default=False, help="the stem's 7x7 stride-2 convolution as a 4x4 one "
                       "over 2x2 pixel blocks (common/stem.py; needs --fold-frozen-bn; the "
                       "same result: cuDNN is slow on 3 input channels)")
        p.add_argument("--channels-last", action=argparse.BooleanOptionalAction,
                       default=False, help="images and networks in channels-last memory "
                       "(cuDNN's NHWC kernels without layout conversions)")
        p.add_argument("--aligned-outputs", action=argparse.BooleanOptionalAction,
                       default=False, help="the RPN head's two 1x1 convolutions as one, the "
                       "box predictor's two linears as one, and the mask logits, each with "
                       "output counts padded to multiples of 8 by zero rows, so cuBLAS and "
                       "cuDNN take aligned kernels (common/aligned_outputs.py; the same "
                       "result)")
        p.add_argument("--size-buckets", type=int, default=0,
                       help="pad each batch's sides up to one of this many sizes between "
                            "--min-size and --max-size (a few batch shapes, so --compile "
                            "builds a few backbone graphs; 0: to the batch's largest image, "
                            "as the reference)")
        p.add_argument("--nms", choices=("reference", "triton"), default="reference",
                       help="NMS's greedy step (RPN proposals, test detections): the "
                            "pure-PyTorch reference, or one Triton kernel without host "
                            "syncs (CUDA only; the same result)")
        p.add_argument("--roi-align", choices=("reference", "triton"), default="reference",
                       help="the box and mask heads' RoIAlign: the pure-PyTorch reference, or "
                            "a Triton kernel whose backward adds into one fp32 table per "
                            "level (CUDA only; the same result to fp32 rounding)")
        p.add_argument("--loss-streams", action=argparse.BooleanOptionalAction, default=False,
                       help="compute the RPN, box and mask losses each on a CUDA stream of "
                            "its own beside the rest of the forward (CUDA only)")
        p.add_argument("--backbone-graphs", action=argparse.BooleanOptionalAction,
                       default=False,
                       help="replay the compiled backbone + FPN + RPN head's forward and "
                            "backward as CUDA graphs, one per padded size (Inductor's CUDA "
                            "graph trees; needs --compile, CUDA only)")
        p.add_argument("--head-graphs", action=argparse.BooleanOptionalAction,
                       default=False,
                       help="replay the compiled box and mask heads' forward and backward as "
                            "CUDA graphs, one per RoI count and padded size (Inductor's CUDA "
                            "graph trees; needs --compile, --box-roi-multiple and "
                            "--mask-roi-multiple, CUDA only)")
        p.add_argument("--fused-sgd", action=argparse.BooleanOptionalAction, default=False,
                       help="the SGD update as PyTorch's fused kernel, one read and write of "
                            "each parameter, gradient and momentum buffer (common/sgd.py)")
        p.add_argument("--compile-losses", action=argparse.BooleanOptionalAction,
                       default=False,
                       help="also compile the RPN's targets, sampling and loss, the box loss "
                            "and the mask targets and loss, each one region with dynamic "
                            "counts (needs --compile)")
        p.add_argument("--compile-proposals", action=argparse.BooleanOptionalAction,
                       default=False,
                       help="also compile the RPN's proposal selection before and after NMS, "
                            "a region per padded size (needs --compile)")
        p.add_argument("--box-head-before-sync", action=argparse.BooleanOptionalAction,
                       default=False,
                       help="run the box head and its loss on a bound of the sampled RoIs "
                            "that the host knows, before it reads the sampler's counts (the "
                            "rows past the samples left out of the loss; the same losses)")
        p.add_argument("--backward-before-sync", action=argparse.BooleanOptionalAction,
                       default=False,
                       help="with --box-head-before-sync, also queue the RPN's and box "
                            "losses' backward (down to the FPN levels) before the host waits "
                            "for the sampler's counts (the same gradients; one process only)")
        p.add_argument("--box-roi-multiple", type=int, default=0,
                       help="run the box head on its RoI count rounded up to a multiple of "
                            "this (copies of the last RoI, dropped after); 0: the count as it is")
        p.add_argument("--mask-roi-multiple", type=int, default=0,
                       help="run the mask head on its RoI count rounded up to a multiple of "
                            "this (padding RoIs, left out of the loss; in evaluation copies of "
                            "the last RoI, dropped after): few convolution shapes, so cuDNN's "
                            "plans are reused; 0: the count as it is")
        # widths: the reference's by default, smaller for CPU fixtures
        p.add_argument("--width", type=int, default=WIDTH, help="ResNet-50 base width")
        p.add_argument("--fpn-channels", type=int, default=FPN_CHANNELS)
        p.add_argument("--box-head-dim", type=int, default=MLP_HEAD_DIM)
        p.add_argument("--mask-head-dim", type=int, default=MASK_CONV_LAYERS[-1])
        cli.add_args(p, "resnet50")

    # -- set-up ---------------------------------------------------------------------------
    def build(self) -> None:
        a, env = self.args, self.env
        if len(a.lr_decay_steps) != 2:
            raise UserError(f"--lr-decay-steps {a.lr_decay_steps}: give two steps, as the "
                            "reference's schedule (e.g. 60000,80000)")
        self.buckets = (data.size_buckets(a.size_buckets, a.min_size, a.max_size)
                        if a.size_buckets else ())
        if a.backward_before_sync and not a.box_head_before_sync:
            raise UserError("--backward-before-sync needs --box-head-before-sync (the box "
                            "losses it runs backward are computed before the sync only then)")
        if a.backward_before_sync and env.distributed:
            raise UserError(f"--backward-before-sync runs the backward in two parts, which "
                            f"DDP cannot all-reduce: drop it for {env.world_size} processes")
        if a.loss_streams:
            require_cuda(env.device, "--loss-streams puts the losses on CUDA streams",
                         "leave it out on the CPU")
        for flag, on in (("--fused-conv-relu", a.fused_conv_relu),
                         ("--space-to-depth", a.space_to_depth)):
            if on and not a.fold_frozen_bn:
                raise UserError(f"{flag} works on the folded convolutions: add "
                                "--fold-frozen-bn")
        if a.fused_conv_relu:
            require_cuda(env.device, "--fused-conv-relu runs cuDNN's fused kernels",
                         "leave it out on the CPU")
        for flag, multiple in (("--box-roi-multiple", a.box_roi_multiple),
                               ("--mask-roi-multiple", a.mask_roi_multiple)):
            if multiple < 0:
                raise UserError(f"{flag} must be 0 (off) or more, not {multiple}")
        if a.head_graphs and not (a.box_roi_multiple and a.mask_roi_multiple):
            raise UserError("--head-graphs records a CUDA graph per RoI count: add "
                            "--box-roi-multiple and --mask-roi-multiple (e.g. 512 and 128)")
        for flag, on in (("--compile-losses", a.compile_losses),
                         ("--compile-proposals", a.compile_proposals)):
            if on and a.compile == "none":
                raise UserError(f"{flag} compiles more of the step than --compile does: add "
                                "--compile default")
        for flag, on, what in (("--backbone-graphs", a.backbone_graphs, "backbone"),
                               ("--head-graphs", a.head_graphs, "RoI heads")):
            if not on:
                continue
            if a.compile == "none":
                raise UserError(f"{flag} replays the compiled {what}: add --compile default")
            require_cuda(env.device, f"{flag} replays CUDA graphs", "leave it out on the CPU")
        nms_keep = None
        if a.nms == "triton":
            require_cuda(env.device, "--nms triton runs a CUDA kernel",
                         "use --nms reference on the CPU")
            from benchmarks.maskrcnn import nms_triton  # Triton: GPU machines only
            nms_keep = nms_triton.nms_keep
        if self.synthetic:
            self.num_classes = NUM_CLASSES
        else:
            self.train_split = data.load_split(a.data_dir, "train")
            self.val_split = data.load_split(a.data_dir, "val")
            self.num_classes = self.train_split.categories.num_classes + 1
        net = MaskRCNN(num_classes=self.num_classes, width=a.width,
                       fpn_channels=a.fpn_channels, box_head_dim=a.box_head_dim,
                       mask_head_dim=a.mask_head_dim, fold_frozen_bn=a.fold_frozen_bn,
                       aligned_outputs=a.aligned_outputs, fused_conv_relu=a.fused_conv_relu,
                       space_to_depth=a.space_to_depth)
        if a.roi_align == "triton":
            require_cuda(env.device, "--roi-align triton runs CUDA kernels",
                         "use --roi-align reference on the CPU")
            from benchmarks.maskrcnn import roi_align_triton  # Triton: GPU machines only
            for pooler in (net.box_features.pooler, net.mask_features.pooler):
                pooler.align = roi_align_triton.roi_align_levels
        if a.backbone_checkpoint:
            cli.load_backbone(a.backbone_checkpoint, "resnet50",
                              lambda state: load_torchvision_backbone(net, state))
        self.tensor_names = mllog_tensor_names(net)
        proposals = rpn.RPN(
            pre_nms_top_n_train=a.rpn_pre_nms_top_n_train,
            pre_nms_top_n_test=a.rpn_pre_nms_top_n_test,
            post_nms_top_n_train=a.rpn_post_nms_top_n_train,
            post_nms_top_n_test=a.rpn_post_nms_top_n_test,
            fpn_post_nms_top_n_train=a.rpn_fpn_post_nms_top_n_train,
            fpn_post_nms_top_n_test=a.rpn_fpn_post_nms_top_n_test,
            fpn_post_nms_per_image_train=a.fpn_post_nms_per_image,
            batch_size_per_image=a.rpn_batch_size_per_image, topk_chunks=a.topk_chunks,
            nms_keep=nms_keep)
        self.memory_format = torch.channels_last if a.channels_last else torch.contiguous_format
        self.net = net.to(env.device, memory_format=self.memory_format)
        self.detector = Detector(self.net, proposals, RoISampler(a.roi_batch_size_per_image),
                                 compile_mode=a.compile, loss_streams=a.loss_streams,
                                 nms_keep=nms_keep, backbone_graphs=a.backbone_graphs,
                                 head_graphs=a.head_graphs,
                                 box_roi_multiple=a.box_roi_multiple,
                                 mask_roi_multiple=a.mask_roi_multiple,
                                 compile_losses=a.compile_losses,
                                 compile_proposals=a.compile_proposals,
                                 box_head_before_sync=a.box_head_before_sync,
                                 backward_before_sync=a.backward_before_sync)
        self.model = dist.data_parallel(self.detector, env)
        self.lr = torch.zeros((), device=env.device)
        self.bias_lr = torch.zeros((), device=env.device)
        self.step_count = torch.zeros((), device=env.device)
        self.optimizer = DeviceLRSGD(self._param_groups(), lr=self.lr, momentum=a.momentum,
                                     fused=a.fused_sgd)
        self.scaler = self.precision.grad_scaler()
        self.detector.scale_loss = self.scaler.scale
        if self.synthetic:
            self._steps_per_epoch = coco.COCO_TRAIN_IMAGES // self.global_batch_size
            return
        common = dict(rank=env.rank, world_size=env.world_size, num_workers=a.workers,
                      device=env.device, min_size=a.min_size, max_size=a.max_size,
                      buckets=self.buckets)
        self.train_loader = data.build_train_loader(self.train_split, a.batch_size,
                                                    seed=a.seed, **common)
        self.eval_loader = data.build_eval_loader(self.val_split, a.eval_batch_size, **common)
        self._steps_per_epoch = len(self.train_loader)

    def _param_groups(self) -> list[dict]:
        """``make_optimizer``: biases at ``bias_lr_factor`` x the LR without weight decay;
        the frozen parameters (stem, layer1) are left out."""
        a = self.args
        named = [(n, p) for n, p in self.net.named_parameters() if p.requires_grad]
        return [{"params": [p for n, p in named if not n.endswith("bias")],
                 "weight_decay": a.weight_decay},
                {"params": [p for n, p in named if n.endswith("bias")], "lr": self.bias_lr,
                 "weight_decay": a.bias_weight_decay}]

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (random device-resident tensors)"
        return coco.describe(self.args.data_dir, self.train_samples, self.eval_samples)

    @property
    def global_batch_size(self) -> int:
        return self.args.batch_size * self.env.world_size

    @property
    def train_samples(self) -> int:
        return coco.COCO_TRAIN_IMAGES if self.synthetic else len(self.train_loader.dataset)

    @property
    def eval_samples(self) -> int:
        return coco.COCO_EVAL_IMAGES if self.synthetic else len(self.val_split)

    def hyperparameters(self) -> dict:
        a, c = self.args, constants
        return {
            c.OPT_NAME: "sgd", c.GRADIENT_ACCUMULATION_STEPS: 1,
            c.OPT_BASE_LR: a.lr, c.OPT_WEIGHT_DECAY: a.weight_decay,
            c.OPT_LR_WARMUP_STEPS: a.warmup_steps, c.OPT_LR_WARMUP_FACTOR: a.warmup_factor,
            c.OPT_LR_DECAY_FACTOR: DECAY_FACTOR, c.OPT_LR_DECAY_STEPS: list(a.lr_decay_steps),
            c.MIN_IMAGE_SIZE: a.min_size, c.MAX_IMAGE_SIZE: a.max_size,
            c.NUM_IMAGE_CANDIDATES: a.rpn_fpn_post_nms_top_n_train,
        }

    def initialized_tensors(self) -> list[str]:
        return self.tensor_names

    # -- schedule -------------------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        return self._steps_per_epoch

    def eval_points(self) -> list[EvalPoint]:
        return epoch_points(range(1, self.args.epochs + 1), self.steps_per_epoch)

    def epoch_batches(self, epoch: int):
        return self.train_loader.epoch(epoch)

    def capture_policy(self) -> CapturePolicy:
        return CapturePolicy("never", reason="proposals, sampled RoIs and their counts depend "
                                             "on the data")

    @property
    def cudnn_benchmark(self) -> bool:
        return False    # every batch has its own padded size

    # -- steps ----------------------------------------------------------------------------
    def train_step(self, images, image_sizes, boxes, labels, masks) -> torch.Tensor:
        a = self.args
        self.lr.copy_(lr_at(self.step_count, a.lr, a.warmup_steps, a.warmup_factor,
                            a.lr_decay_steps))
        self.bias_lr.copy_(self.lr * a.bias_lr_factor)
        self.optimizer.zero_grad(set_to_none=True)
        images = images.contiguous(memory_format=self.memory_format)
        with self.precision.autocast():
            losses = self.model(images, image_sizes, boxes, labels, masks)
        loss = sum(losses.values())
        with region("backward"):
            if a.backward_before_sync:     # the RPN's and box losses' already ran
                self.detector.finish_backward(self.scaler.scale(losses["loss_mask"]))
            else:
                self.scaler.scale(loss).backward()
        with region("optimizer"):
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.step_count += 1
        return loss.detach()

    def training_state(self) -> list[torch.Tensor]:
        momenta = [s["momentum_buffer"] for s in self.optimizer.state.values()]
        return [*self.net.state_dict(keep_vars=True).values(), *momenta, self.lr, self.bias_lr,
                self.step_count, *grad_scaler_state(self.scaler, self.env.device)]

    def synthetic_batch(self, batch_size: int,
                        image_size: tuple[int, int] | None = None) -> data.TrainBatch:
        a = self.args
        return data.synthetic_batch(batch_size, self.num_classes, a.min_size, a.max_size,
                                    device=self.env.device, image_size=image_size)

    def warm_up_batches(self, batch_size: int) -> list[data.TrainBatch]:
        """With ``--size-buckets``, a batch of each padded shape (``data.bucket_shapes``):
        ``--init-steps`` of at least that many (2 x buckets - 1) builds every compiled
        backbone graph."""
        return [self.synthetic_batch(batch_size, size) for size in self._padded_shapes()]

    def _padded_shapes(self) -> list[tuple[int, int] | None]:
        return data.bucket_shapes(self.buckets) if self.buckets else [None]

    def warm_up_eval(self) -> None:
        """With ``--compile``, the compiled regions in evaluation mode on a synthetic batch of
        each padded shape (the proposal selection on its head outputs, the heads on its
        ground-truth boxes: an untrained model detects nothing), so that their inference
        graphs are built before the clock."""
        if not self.detector.compiled:
            return
        self.detector.eval()
        for size in self._padded_shapes():
            batch = self.synthetic_batch(self.args.eval_batch_size, size)
            rois = rois_from_boxes(ground_truth(batch.boxes, batch.labels, batch.masks)[0])
            with self.precision.autocast():
                levels, objectness, deltas = self.detector.levels_and_rpn(
                    batch.images.contiguous(memory_format=self.memory_format))
                self.detector.rpn.proposals(objectness, deltas, self.detector.anchors(levels),
                                            batch.image_sizes)
                self.detector.box_head(levels, rois)
                self.detector.mask_head(levels, rois)
        self.detector.train()

    # -- evaluation -----------------------------------------------------------------------
    def detect(self, batch: data.EvalBatch) -> list[ImageDetections]:
        """The detector (in evaluation mode) on an evaluation batch. Compiled, a short batch
        runs filled up to ``--eval-batch-size`` (:meth:`data.EvalBatch.filled`, the copies'
        detections dropped): the graphs :meth:`warm_up_eval` built, no new compile inside
        the timed run."""
        count = len(batch.images)
        if self.detector.compiled:
            batch = batch.filled(self.args.eval_batch_size)
        with self.precision.autocast():
            found = self.detector(batch.images.contiguous(memory_format=self.memory_format),
                                  batch.image_sizes, batch.original_sizes)
        return found[:count]

    def eval_outputs(self) -> ScoreRequest | None:
        """Every validation image's detections with RLE masks, gathered on rank 0."""
        self.detector.eval()
        mine = []
        for batch in self.eval_loader.epoch(0):
            for image_id, d in zip(batch.image_ids.tolist(), self.detect(batch)):
                masks = d.masks.cpu().numpy()
                mine.append(Detections(image_id, d.boxes.float().cpu().numpy(),
                                       d.scores.float().cpu().numpy(), d.labels.cpu().numpy(),
                                       encode_masks(masks) if len(masks) else []))
        self.detector.train()
        parts = dist.gather_objects(mine)
        if parts is None:
            return None
        return ScoreRequest(str(self.val_split.annotation_file),
                            [d for part in parts for d in part], iou_types=("bbox", "segm"),
                            backend=self.args.scoring, inclusive_boxes=True)
