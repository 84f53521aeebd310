"""MLPerf Training ``ssd``: SSD300 with a ResNet-34 backbone on COCO 2017 to 0.23 bbox mAP.

Defaults are the MLCommons v1.1 reference's (``single_stage_detector/ssd/train.py``):
SGD with momentum 0.9 and weight decay 5e-4 on every parameter, base LR 2.5e-3 per 32
images of global batch, a linear warm-up from 0 (warm-up factor 0) over a fraction of an
epoch, x0.1 at epochs 40 and 50, evaluation after epochs 40, 50, 55, ..., 80 (the cap),
the IoU-constrained crop tried once (``max_samples`` 1). Evaluation splits into the
forwards with NMS (``eval_outputs``, gathered on rank 0) and COCO scoring
(``common.coco.evaluation.score``), which ``--background-scoring`` runs beside
training.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from benchmarks.ssd import data, image_cache
from benchmarks.ssd.boxes import dboxes300_coco, decode_batch, dense_overlaps, match
from benchmarks.ssd.loss import Loss
from benchmarks.ssd.model import SSD300, WIDTH, mllog_tensor_names
from common import dist
from common.coco import cli
from common.coco import data as coco
from common.coco.evaluation import Detections, ScoreRequest, score
from common.errors import UserError, require_cuda
from common.hparams import checked, non_negative, positive
from common.mllog import constants
from common.precision import grad_scaler_state
from common.sgd import DeviceLRSGD
from common.workload import (
    CapturePolicy,
    EvalPoint,
    Target,
    Workload,
    epoch_points,
    maybe_compile,
)

COCO_TRAIN_IMAGES, COCO_EVAL_IMAGES = coco.COCO_TRAIN_IMAGES, coco.COCO_EVAL_IMAGES
BASE_BATCH = 32   # the reference's LR is --lr x global batch / 32


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 40,50, got {text!r}") from None


def lr_at(step: torch.Tensor, base: float, warmup_steps: int, warmup_factor: int,
          steps_per_epoch: int, decay_epochs: list[int]) -> torch.Tensor:
    """The reference's LR (device ops): its warm-up rule ``base - (wb - i) * base / (wb *
    2**factor)`` for the first ``wb`` steps, then x0.1 from the start of each decay epoch."""
    epoch = torch.div(step, steps_per_epoch, rounding_mode="floor")
    decays = sum((epoch >= e).float() for e in decay_epochs) if decay_epochs else 0 * step
    decayed = base * torch.pow(0.1, decays)
    warm = base - (warmup_steps - step) * base / (max(warmup_steps, 1) * 2 ** warmup_factor)
    return torch.where(step < warmup_steps, warm, decayed)


class SSDWorkload(Workload):
    name = constants.SSD
    targets = (Target("bbox_map", 0.23),)
    scorer = staticmethod(score)

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="COCO 2017: annotations/instances_{train,val}2017.json, "
                            "{train,val}2017/*.jpg")
        p.add_argument("--batch-size", type=checked(int, positive),
                       default=32, help="per-rank images per step")
        p.add_argument("--eval-batch-size", type=checked(int, positive), default=64)
        p.add_argument("--epochs", type=checked(int, positive), default=80, help="epoch cap")
        p.add_argument("--lr", type=checked(float, positive), default=2.5e-3,
                       help="learning rate per 32 images of global batch")
        p.add_argument("--warmup-epochs", type=checked(float, non_negative), default=1.0,
                       help="linear warm-up length in epochs (the reference's --warmup)")
        p.add_argument("--warmup-factor", type=int, default=0)
        p.add_argument("--lr-decay-epochs", type=_ints, default=[40, 50],
                       help="epochs after which the LR drops x0.1")
        p.add_argument("--eval-epochs", type=_ints, default=[40, 50, 55, 60, 65, 70, 75, 80],
                       help="evaluate after these epochs (and at the cap)")
        p.add_argument("--momentum", type=float, default=0.9)
        p.add_argument("--weight-decay", type=float, default=5e-4)
        p.add_argument("--max-samples", type=int, default=1, choices=(1, 50),
                       help="tries of the IoU-constrained crop")
        p.add_argument("--max-boxes", type=checked(int, positive), default=data.MAX_BOXES,
                       help="ground-truth boxes per image, padded (static step shapes)")
        p.add_argument("--width", type=checked(int, positive), default=WIDTH,
                       help="ResNet-34 stem width; every channel count scales with it "
                            "(64: the reference; smaller only for CPU fixtures)")
        p.add_argument("--bn-group", type=checked(int, positive),
                       default=1, help="ranks sharing BN statistics")
        p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=False)
        p.add_argument("--space-to-depth", action=argparse.BooleanOptionalAction, default=False,
                       help="the stem convolution over 2x2 pixel blocks (same result; cuDNN "
                            "is slow on 3 input channels)")
        p.add_argument("--class-last-heads", action=argparse.BooleanOptionalAction,
                       default=False, help="confidence heads with their output channels "
                       "reordered so each box's class scores are contiguous (benchmarks/ssd/"
                       "heads.py; the same scores)")
        p.add_argument("--fused-pool", action=argparse.BooleanOptionalAction, default=False,
                       help="the stem's ReLU + max-pool as one op with a gather-free backward "
                            "(common.pool; the same result)")
        p.add_argument("--fused-match", action=argparse.BooleanOptionalAction, default=False,
                       help="matching's IoU maxima in one Triton kernel, without the "
                            "[batch, boxes, 8732] IoU matrix (benchmarks/ssd/match_triton.py; "
                            "the same targets; CUDA only)")
        p.add_argument("--image-cache", default="none", choices=("none", *image_cache.STORAGES),
                       help="device: decode every training image once (on the first batch) "
                            "and keep it on the device, where crop, flip, resize and colour "
                            "jitter run; host: keep it in host memory and copy each batch's "
                            "images to the device (benchmarks/ssd/image_cache.py)")
        p.add_argument("--cache-side", type=int, default=image_cache.MAX_SIDE,
                       help="longer side of cached images in pixels; memory: images x 3 x "
                            "side^2 bytes (COCO at 384: 51.9 GB per rank)")
        p.add_argument("--fused-jitter", action=argparse.BooleanOptionalAction, default=False,
                       help="with --image-cache: the colour jitter as four compiled passes "
                            "over the batch (benchmarks/ssd/fused_jitter.py; the same result)")
        cli.add_args(p, "resnet34")

    # -- set-up ---------------------------------------------------------------------------
    def build(self) -> None:
        a, env = self.args, self.env
        if a.fused_jitter and a.image_cache == "none":
            raise UserError("--fused-jitter is the image cache's colour jitter: add "
                            "--image-cache device or host, or leave it out")
        self.overlaps = dense_overlaps
        if a.fused_match:
            require_cuda(env.device, "--fused-match runs a Triton kernel")
            from benchmarks.ssd.match_triton import fused_overlaps
            self.overlaps = fused_overlaps
        if not self.synthetic:
            self.train_split = coco.load_split(a.data_dir, "train")
            self.val_split = coco.load_split(a.data_dir, "val")
            num_classes = self.train_split.categories.num_classes + 1
        else:
            num_classes = 81
        self.num_classes = num_classes
        model = SSD300(num_classes, a.width, a.space_to_depth, a.fused_pool,
                       a.class_last_heads)
        if a.backbone_checkpoint:
            cli.load_backbone(a.backbone_checkpoint, "resnet34",
                              model.backbone.load_torchvision)
        self.tensor_names = mllog_tensor_names(model)
        model = dist.group_norm_layers(model, env, a.bn_group)
        mem = torch.channels_last if a.channels_last else torch.contiguous_format
        self.net = model.to(env.device, memory_format=mem)
        self.model = maybe_compile(dist.data_parallel(self.net, env), a.compile)
        self.dboxes = dboxes300_coco().to(env.device)
        self.loss = Loss(self.dboxes).to(env.device)
        self.match_loss = maybe_compile(self._match_loss, a.compile)
        self.lr = torch.zeros((), device=env.device)
        self.step_count = torch.zeros((), device=env.device)
        self.optimizer = DeviceLRSGD(self.net.parameters(), lr=self.lr, momentum=a.momentum,
                                     weight_decay=a.weight_decay)
        self.scaler = self.precision.grad_scaler()
        if self.synthetic:
            self._steps_per_epoch = COCO_TRAIN_IMAGES // self.global_batch_size
        else:
            common = dict(rank=env.rank, world_size=env.world_size, num_workers=a.workers,
                          device=env.device)
            train = dict(seed=a.seed, max_boxes=a.max_boxes, max_samples=a.max_samples, **common)
            if a.image_cache != "none":
                self.train_loader = image_cache.build_train_loader(
                    self.train_split, a.batch_size, max_side=a.cache_side,
                    storage=a.image_cache, fused_jitter=a.fused_jitter, **train)
                self.train_loader.warm_up()
            else:
                self.train_loader = data.build_train_loader(self.train_split, a.batch_size,
                                                            **train)
            self.eval_loader = data.build_eval_loader(self.val_split, a.eval_batch_size,
                                                      **common)
            self._steps_per_epoch = len(self.train_loader)
        self.warmup_steps = max(1, int(a.warmup_epochs * self.train_samples
                                       / self.global_batch_size))

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (random device-resident tensors)"
        return coco.describe(self.args.data_dir, len(self.train_split), len(self.val_split))

    @property
    def global_batch_size(self) -> int:
        return self.args.batch_size * self.env.world_size

    @property
    def train_samples(self) -> int:
        return COCO_TRAIN_IMAGES if self.synthetic else len(self.train_split)

    @property
    def eval_samples(self) -> int:
        return COCO_EVAL_IMAGES if self.synthetic else len(self.val_split)

    @property
    def base_lr(self) -> float:
        return self.args.lr * self.global_batch_size / BASE_BATCH

    def hyperparameters(self) -> dict:
        a, c = self.args, constants
        return {
            c.OPT_NAME: "sgd", c.GRADIENT_ACCUMULATION_STEPS: 1,
            c.OPT_BASE_LR: self.base_lr, c.OPT_WEIGHT_DECAY: a.weight_decay,
            c.OPT_LR_WARMUP_STEPS: self.warmup_steps, c.OPT_LR_WARMUP_FACTOR: a.warmup_factor,
            c.OPT_LR_DECAY_BOUNDARY_EPOCHS: list(a.lr_decay_epochs),
            c.MAX_SAMPLES: a.max_samples,
            c.MODEL_BN_SPAN: a.batch_size * a.bn_group,
        }

    def initialized_tensors(self) -> list[str]:
        return self.tensor_names

    # -- schedule -------------------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        return self._steps_per_epoch

    def eval_points(self) -> list[EvalPoint]:
        a = self.args
        epochs = sorted({e for e in a.eval_epochs if 1 <= e < a.epochs} | {a.epochs})
        return epoch_points(epochs, self.steps_per_epoch)

    def epoch_batches(self, epoch: int):
        return self.train_loader.epoch(epoch)

    def capture_policy(self) -> CapturePolicy:
        return CapturePolicy("static")   # 300x300 images, targets padded to --max-boxes

    # -- steps ----------------------------------------------------------------------------
    def train_step(self, images, boxes, labels, valid) -> torch.Tensor:
        a = self.args
        self.lr.copy_(lr_at(self.step_count, self.base_lr, self.warmup_steps, a.warmup_factor,
                            self.steps_per_epoch, a.lr_decay_epochs))
        self.optimizer.zero_grad(set_to_none=True)
        with self.precision.autocast():
            ploc, plabel = self.model(images)
        loss = self.match_loss(ploc, plabel, boxes, labels, valid)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.step_count += 1
        return loss.detach()

    def _match_loss(self, ploc, plabel, boxes, labels, valid) -> torch.Tensor:
        gloc, glabel = match(boxes, labels, valid, self.dboxes, overlaps=self.overlaps)
        return self.loss(ploc.float(), plabel.float(), gloc, glabel)

    def training_state(self) -> list[torch.Tensor]:
        momenta = [s["momentum_buffer"] for s in self.optimizer.state.values()]
        return [*self.net.state_dict(keep_vars=True).values(), *momenta, self.lr,
                self.step_count, *grad_scaler_state(self.scaler, self.env.device)]

    def synthetic_batch(self, batch_size: int):
        return data.synthetic_batch(batch_size, self.num_classes, self.env.device,
                                    self.args.max_boxes)

    def warm_up_eval(self) -> None:
        """The model's evaluation forward at ``--eval-batch-size``, compiled before the clock
        with ``--compile``."""
        self.infer_step(*self.synthetic_batch(self.args.eval_batch_size))

    def infer_step(self, images, *targets) -> torch.Tensor:
        self.model.eval()
        with torch.no_grad(), self.precision.autocast():
            ploc, _ = self.model(images)
        self.model.train()
        return ploc

    # -- evaluation -----------------------------------------------------------------------
    def eval_outputs(self) -> ScoreRequest | None:
        """Every validation image's detections (NMS on the device), gathered on rank 0."""
        self.model.eval()
        parts = []
        for images, image_ids, sizes in self.eval_loader.epoch(0):
            with self.precision.autocast():
                ploc, plabel = self.model(images)
            boxes, labels, scores, valid = decode_batch(ploc, plabel, self.dboxes)
            scale = sizes.flip(1).repeat(1, 2)[:, None].float()     # (w, h, w, h) per image
            ids = image_ids[:, None].expand_as(labels)
            parts.append({"ids": ids[valid], "boxes": (boxes * scale)[valid],
                          "labels": labels[valid], "scores": scores[valid]})
        self.model.train()
        rows = {k: torch.cat([p[k] for p in parts]) if parts else torch.zeros(0)
                for k in ("ids", "boxes", "labels", "scores")}
        rows = dist.gather_row_dict(rows)
        if rows is None:
            return None
        rows = {k: v.cpu().numpy() for k, v in rows.items()}
        order = np.argsort(rows["ids"], kind="stable")
        ids = rows["ids"][order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else []
        detections = [Detections(int(ids[s]), *(rows[k][order][s:e] for k in
                                                ("boxes", "scores", "labels")))
                      for s, e in zip(starts, [*starts[1:], len(ids)])]
        return ScoreRequest(str(self.val_split.annotation_file), detections,
                            backend=self.args.scoring)
