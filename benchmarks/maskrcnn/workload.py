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

``build()`` makes the reference path; the optimisations (:mod:`benchmarks.maskrcnn.optimisations`)
transform it afterwards.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
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
from benchmarks.maskrcnn.optimisations import REGISTRY
from benchmarks.maskrcnn.roi_align import rois_from_boxes
from benchmarks.maskrcnn.roi_heads import BATCH_SIZE_PER_IMAGE, ImageDetections, RoISampler
from common import dist
from common.coco import cli, evaluation
from common.coco import data as coco
from common.coco.evaluation import Detections, ScoreRequest, encode_masks
from common.errors import UserError
from common.hparams import checked, fraction, hparam, non_negative, open_fraction, positive
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


@dataclass
class HParams:
    """The reference's training recipe; per image unless said otherwise."""

    batch_size: int = hparam(2, "per-rank images per step (the reference: 16 on 8 GPUs)",
                             check=positive)
    epochs: int = hparam(13, "epoch cap (the reference's 90000 steps of 16 images: 12.3 "
                         "epochs)", check=positive)
    lr: float = hparam(0.02, "base learning rate (0.02 x global batch / 16; a multiple of "
                       "0.02)", check=positive)
    warmup_steps: int = hparam(500, "steps of the linear warm-up", check=non_negative)
    warmup_factor: float = hparam(1 / 3, "the warm-up's first LR as a fraction of the base LR",
                                  check=fraction)
    lr_decay_steps: list[int] = hparam([60000, 80000], "two steps from which the LR drops x0.1",
                                       check=positive)
    momentum: float = hparam(0.9, "SGD momentum", check=open_fraction)
    weight_decay: float = hparam(1e-4, "weight decay of the weights", check=non_negative)
    bias_lr_factor: float = hparam(2.0, "the biases' LR over the base LR", check=positive)
    bias_weight_decay: float = hparam(0.0, "weight decay of the biases", check=non_negative)
    min_size: int = hparam(data.MIN_SIZE, "shorter image side after resizing", check=positive)
    max_size: int = hparam(data.MAX_SIZE, "longest image side after resizing, at most",
                           check=positive)
    size_buckets: int = hparam(
        0, "pad each batch's sides up to one of this many sizes between --min-size and "
        "--max-size (a few batch shapes, so the compiled backbone has a few graphs; anchors "
        "over the extra padding take part in the RPN's top-K, so not the reference's result); "
        "0: to the batch's largest image, as the reference", check=non_negative)
    rpn_pre_nms_top_n_train: int = hparam(rpn.PRE_NMS_TOP_N_TRAIN,
                                          "RPN candidates per level before NMS", check=positive)
    rpn_pre_nms_top_n_test: int = hparam(rpn.PRE_NMS_TOP_N_TEST, "", check=positive)
    rpn_post_nms_top_n_train: int = hparam(rpn.POST_NMS_TOP_N_TRAIN, "per level, after NMS",
                                           check=positive)
    rpn_post_nms_top_n_test: int = hparam(rpn.POST_NMS_TOP_N_TEST, "", check=positive)
    rpn_fpn_post_nms_top_n_train: int = hparam(
        rpn.FPN_POST_NMS_TOP_N_TRAIN, "proposals over the levels, per batch (per image with "
        "--fpn-post-nms-per-image); mllog num_image_candidates, a multiple of 1000",
        check=positive)
    rpn_fpn_post_nms_top_n_test: int = hparam(rpn.FPN_POST_NMS_TOP_N_TEST, "", check=positive)
    fpn_post_nms_per_image: bool = hparam(False, "NVIDIA's per-image selection over the levels "
                                          "(other proposals than the reference's)")
    rpn_batch_size_per_image: int = hparam(rpn.BATCH_SIZE_PER_IMAGE,
                                           "anchors sampled for the loss", check=positive)
    roi_batch_size_per_image: int = hparam(BATCH_SIZE_PER_IMAGE,
                                           "RoIs sampled for the box head", check=positive)


class MaskRCNNWorkload(Workload):
    name = constants.MASKRCNN
    targets = (Target("BBOX", 0.377), Target("SEGM", 0.339))
    full_dataset = (coco.COCO_TRAIN_IMAGES, coco.COCO_EVAL_IMAGES)
    scorer = staticmethod(score)
    hparams = HParams
    optimisations = REGISTRY
    train_loader = None   # built with real data

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="COCO 2017: annotations/instances_{train,val}2017.json, "
                            "{train,val}2017/*.jpg")
        p.add_argument("--eval-batch-size", type=checked(int, positive),
                       default=8, help="per-rank images")
        # widths: the reference's by default, smaller for CPU fixtures
        p.add_argument("--width", type=checked(int, positive),
                       default=WIDTH, help="ResNet-50 base width")
        p.add_argument("--fpn-channels", type=checked(int, positive), default=FPN_CHANNELS)
        p.add_argument("--box-head-dim", type=checked(int, positive), default=MLP_HEAD_DIM)
        p.add_argument("--mask-head-dim", type=checked(int, positive), default=MASK_CONV_LAYERS[-1])
        cli.add_args(p, "resnet50")

    # -- set-up ---------------------------------------------------------------------------
    def build(self) -> None:
        a, h, env = self.args, self.hp, self.env
        if len(h.lr_decay_steps) != 2 or h.lr_decay_steps[0] >= h.lr_decay_steps[1]:
            raise UserError(f"--lr-decay-steps {','.join(map(str, h.lr_decay_steps))}: give two "
                            "rising steps, as the reference's schedule (e.g. 60000,80000)")
        if h.max_size < h.min_size:
            raise UserError(f"--max-size {h.max_size} is less than --min-size {h.min_size}: "
                            "the longer side cannot be kept shorter than the shorter one")
        self.buckets = (data.size_buckets(h.size_buckets, h.min_size, h.max_size)
                        if h.size_buckets else ())
        if self.synthetic:
            self.num_classes = NUM_CLASSES
        else:
            self.train_split = data.load_split(a.data_dir, "train")
            self.val_split = data.load_split(a.data_dir, "val")
            self.num_classes = self.train_split.categories.num_classes + 1
        net = MaskRCNN(num_classes=self.num_classes, width=a.width,
                       fpn_channels=a.fpn_channels, box_head_dim=a.box_head_dim,
                       mask_head_dim=a.mask_head_dim)
        if a.backbone_checkpoint:
            cli.load_backbone(a.backbone_checkpoint, "resnet50",
                              lambda state: load_torchvision_backbone(net, state))
        self.tensor_names = mllog_tensor_names(net)
        proposals = rpn.RPN(
            pre_nms_top_n_train=h.rpn_pre_nms_top_n_train,
            pre_nms_top_n_test=h.rpn_pre_nms_top_n_test,
            post_nms_top_n_train=h.rpn_post_nms_top_n_train,
            post_nms_top_n_test=h.rpn_post_nms_top_n_test,
            fpn_post_nms_top_n_train=h.rpn_fpn_post_nms_top_n_train,
            fpn_post_nms_top_n_test=h.rpn_fpn_post_nms_top_n_test,
            fpn_post_nms_per_image_train=h.fpn_post_nms_per_image,
            batch_size_per_image=h.rpn_batch_size_per_image)
        # the memory format channels-last selects (before DDP takes the parameters)
        self.memory_format = getattr(self.impl, "memory_format", torch.contiguous_format)
        self.net = net.to(env.device, memory_format=self.memory_format)
        self.detector = Detector(self.net, proposals, RoISampler(h.roi_batch_size_per_image))
        self.model = dist.data_parallel(self.detector, env)
        self.lr = torch.zeros((), device=env.device)
        self.bias_lr = torch.zeros((), device=env.device)
        self.step_count = torch.zeros((), device=env.device)
        self.optimizer = DeviceLRSGD(self._param_groups(), lr=self.lr, momentum=h.momentum)
        self.scaler = self.precision.grad_scaler()
        if self.synthetic:
            self._steps_per_epoch = coco.COCO_TRAIN_IMAGES // self.global_batch_size
            return
        common = dict(rank=env.rank, world_size=env.world_size, num_workers=a.workers,
                      device=env.device, min_size=h.min_size, max_size=h.max_size,
                      buckets=self.buckets)
        self.train_loader = data.build_train_loader(self.train_split, h.batch_size,
                                                    seed=a.seed, **common)
        self.eval_loader = data.build_eval_loader(self.val_split, a.eval_batch_size, **common)
        self._steps_per_epoch = len(self.train_loader)

    def _param_groups(self) -> list[dict]:
        """``make_optimizer``: biases at ``bias_lr_factor`` x the LR without weight decay;
        the frozen parameters (stem, layer1) are left out."""
        h = self.hp
        named = [(n, p) for n, p in self.net.named_parameters() if p.requires_grad]
        return [{"params": [p for n, p in named if not n.endswith("bias")],
                 "weight_decay": h.weight_decay},
                {"params": [p for n, p in named if n.endswith("bias")], "lr": self.bias_lr,
                 "weight_decay": h.bias_weight_decay}]

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (random device-resident tensors)"
        return coco.describe(self.args.data_dir, self.train_samples, self.eval_samples)

    @property
    def train_samples(self) -> int:
        return coco.COCO_TRAIN_IMAGES if self.synthetic else len(self.train_loader.dataset)

    @property
    def eval_samples(self) -> int:
        return coco.COCO_EVAL_IMAGES if self.synthetic else len(self.val_split)

    def hyperparameters(self) -> dict:
        h, c = self.hp, constants
        return {
            c.OPT_NAME: "sgd", c.GRADIENT_ACCUMULATION_STEPS: 1,
            c.OPT_BASE_LR: h.lr, c.OPT_WEIGHT_DECAY: h.weight_decay,
            c.OPT_LR_WARMUP_STEPS: h.warmup_steps, c.OPT_LR_WARMUP_FACTOR: h.warmup_factor,
            c.OPT_LR_DECAY_FACTOR: DECAY_FACTOR, c.OPT_LR_DECAY_STEPS: list(h.lr_decay_steps),
            c.MIN_IMAGE_SIZE: h.min_size, c.MAX_IMAGE_SIZE: h.max_size,
            c.NUM_IMAGE_CANDIDATES: h.rpn_fpn_post_nms_top_n_train,
        }

    # -- schedule -------------------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        return self._steps_per_epoch

    def eval_points(self) -> list[EvalPoint]:
        return epoch_points(range(1, self.hp.epochs + 1), self.steps_per_epoch)

    def epoch_batches(self, epoch: int):
        return self.train_loader.epoch(epoch)

    def close(self) -> None:
        if self.train_loader is not None:   # none with synthetic data
            self.train_loader.close()

    def capture_policy(self) -> CapturePolicy:
        return CapturePolicy("never", reason="proposals, sampled RoIs and their counts depend "
                                             "on the data")

    @property
    def cudnn_benchmark(self) -> bool:
        return False    # every batch has its own padded size

    # -- steps ----------------------------------------------------------------------------
    def train_step(self, images, image_sizes, boxes, labels, masks) -> torch.Tensor:
        h = self.hp
        self.lr.copy_(lr_at(self.step_count, h.lr, h.warmup_steps, h.warmup_factor,
                            h.lr_decay_steps))
        self.bias_lr.copy_(self.lr * h.bias_lr_factor)
        self.optimizer.zero_grad(set_to_none=True)
        images = self.normalized(images, image_sizes)
        with self.precision.autocast():
            losses = self.model(images, image_sizes, boxes, labels, masks)
        loss = sum(losses.values())
        with region("backward"):
            self.backward(losses, loss)
        with region("optimizer"):
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.step_count += 1
        return loss.detach()

    def normalized(self, images: torch.Tensor, image_sizes: torch.Tensor) -> torch.Tensor:
        """A batch's uint8 images as the model takes them (``data.normalize``), in the
        model's memory format."""
        return data.normalize(images.contiguous(memory_format=self.memory_format), image_sizes)

    def backward(self, losses: dict[str, torch.Tensor], loss: torch.Tensor) -> None:
        """The step's backward of the losses (dict) and their sum ``loss``, scaled."""
        self.scaler.scale(loss).backward()

    def training_state(self) -> list[torch.Tensor]:
        momenta = [s["momentum_buffer"] for s in self.optimizer.state.values()]
        return [*self.net.state_dict(keep_vars=True).values(), *momenta, self.lr, self.bias_lr,
                self.step_count, *grad_scaler_state(self.scaler, self.env.device)]

    def synthetic_batch(self, batch_size: int,
                        image_size: tuple[int, int] | None = None) -> data.TrainBatch:
        h = self.hp
        return data.synthetic_batch(batch_size, self.num_classes, h.min_size, h.max_size,
                                    device=self.env.device, image_size=image_size)

    def warm_up_batches(self, batch_size: int) -> list[data.TrainBatch]:
        """With ``--size-buckets``, a batch of each padded shape (``data.bucket_shapes``):
        ``--init-steps`` of at least that many (2 x buckets - 1) builds every compiled
        backbone graph."""
        return [self.synthetic_batch(batch_size, size) for size in self._padded_shapes()]

    def _padded_shapes(self) -> list[tuple[int, int] | None]:
        return data.bucket_shapes(self.buckets) if self.buckets else [None]

    def warm_up_eval(self) -> None:
        """With ``compile``, the compiled regions in evaluation mode on a synthetic batch of
        each padded shape (the proposal selection on its head outputs, the heads on its
        ground-truth boxes: an untrained model detects nothing), so that their inference
        graphs are built before the clock."""
        if "compile" not in self.opts:
            return
        self.detector.eval()
        for size in self._padded_shapes():
            batch = self.synthetic_batch(self.args.eval_batch_size, size)
            rois = rois_from_boxes(ground_truth(batch.boxes, batch.labels, batch.masks)[0])
            with self.precision.autocast():
                levels, objectness, deltas = self.detector.levels_and_rpn(
                    self.normalized(batch.images, batch.image_sizes))
                self.detector.rpn.proposals(objectness, deltas, self.detector.anchors(levels),
                                            batch.image_sizes)
                self.detector.box_head(levels, rois)
                self.detector.mask_head(levels, rois)
        self.detector.train()

    # -- evaluation -----------------------------------------------------------------------
    @staticmethod
    def encode_masks(masks: torch.Tensor) -> list[dict]:
        """An image's pasted masks [N, H, W] as RLEs, on the host (``device-rle`` replaces
        it)."""
        return encode_masks(masks.cpu().numpy()) if len(masks) else []

    def detect(self, batch: data.EvalBatch) -> list[ImageDetections]:
        """The detector (in evaluation mode) on an evaluation batch. Compiled, a short batch
        runs filled up to ``--eval-batch-size`` (:meth:`data.EvalBatch.filled`, the copies'
        detections dropped): the graphs :meth:`warm_up_eval` built, no new compile inside
        the timed run."""
        count = len(batch.images)
        if "compile" in self.opts:
            batch = batch.filled(self.args.eval_batch_size)
        with self.precision.autocast():
            found = self.detector(self.normalized(batch.images, batch.image_sizes),
                                  batch.image_sizes, batch.original_sizes)
        return found[:count]

    def eval_outputs(self) -> ScoreRequest | None:
        """Every validation image's detections with RLE masks, gathered on rank 0."""
        self.detector.eval()
        mine = []
        for batch in self.eval_loader.epoch(0):
            for image_id, d in zip(batch.image_ids.tolist(), self.detect(batch)):
                mine.append(Detections(image_id, d.boxes.float().cpu().numpy(),
                                       d.scores.float().cpu().numpy(), d.labels.cpu().numpy(),
                                       self.encode_masks(d.masks)))
        self.detector.train()
        parts = dist.gather_objects(mine)
        if parts is None:
            return None
        return ScoreRequest(str(self.val_split.annotation_file),
                            [d for part in parts for d in part], iou_types=("bbox", "segm"),
                            backend=self.args.scoring, inclusive_boxes=True)
