"""MLPerf Training ``ssd``: SSD300 with a ResNet-34 backbone on COCO 2017 to 0.23 bbox mAP.

Defaults are the MLCommons v1.1 reference's (``single_stage_detector/ssd/train.py``):
SGD with momentum 0.9 and weight decay 5e-4 on every parameter, base LR 2.5e-3 per 32
images of global batch, a linear warm-up from 0 (warm-up factor 0) over a fraction of an
epoch, x0.1 at epochs 40 and 50, evaluation after epochs 40, 50, 55, ..., 80 (the cap),
the IoU-constrained crop tried once (``max_samples`` 1). Evaluation splits into the
forwards with NMS (``eval_outputs``, gathered on rank 0) and COCO scoring
(``common.coco.evaluation.score``), which ``--background-scoring`` runs beside
training.

With no optimisation named the workload runs as the reference does: NCHW memory, eagerly,
the dense matching, each image decoded and augmented on the CPU (``data.py``); each
optimisation (``--list-optimisations``) changes one of these from its own module, applied to
the built parts in the registry's order.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.ssd import data, fused_jitter, heads, image_cache, stem
from benchmarks.ssd.boxes import dboxes300_coco, decode_batch, dense_overlaps, match
from benchmarks.ssd.loss import Loss
from benchmarks.ssd.model import SSD300, WIDTH, mllog_tensor_names
from common import dist
from common.coco import cli
from common.coco import data as coco
from common.coco.evaluation import Detections, ScoreRequest, score
from common.hparams import checked, hparam, non_negative, open_fraction, positive
from common.mllog import constants
from common.optimisations import COMPILE, CUDA_GRAPH, Optimisation, Registry, shared
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


@dataclass
class HParams:
    """The reference's training recipe (``train.py``'s defaults)."""

    batch_size: int = hparam(32, "per-rank images per step", check=positive)
    eval_batch_size: int = hparam(64, "per-rank images per evaluation forward", check=positive)
    epochs: int = hparam(80, "epoch cap", check=positive)
    lr: float = hparam(2.5e-3, "learning rate per 32 images of global batch", check=positive)
    warmup_epochs: float = hparam(1.0, "linear warm-up length in epochs (the reference's "
                                  "--warmup)", check=non_negative)
    warmup_factor: int = hparam(0, "the warm-up starts at LR x (1 - 2^-factor)",
                                check=non_negative)
    lr_decay_epochs: list[int] = hparam([40, 50], "epochs after which the LR drops x0.1",
                                        check=positive)
    eval_epochs: list[int] = hparam([40, 50, 55, 60, 65, 70, 75, 80], "evaluate after these "
                                    "epochs (and at the cap)", check=positive)
    momentum: float = hparam(0.9, "SGD momentum", check=open_fraction)
    weight_decay: float = hparam(5e-4, "weight decay of every parameter", check=non_negative)
    max_samples: int = hparam(data.MAX_SAMPLES, "tries of the IoU-constrained crop",
                              choices=data.MAX_SAMPLES_ALLOWED)
    bn_group: int = hparam(1, "ranks sharing batch-norm statistics (model_bn_span)",
                           check=positive)


def lr_at(step: torch.Tensor, base: float, warmup_steps: int, warmup_factor: int,
          steps_per_epoch: int, decay_epochs: list[int]) -> torch.Tensor:
    """The reference's LR (device ops): its warm-up rule ``base - (wb - i) * base / (wb *
    2**factor)`` for the first ``wb`` steps, then x0.1 from the start of each decay epoch."""
    epoch = torch.div(step, steps_per_epoch, rounding_mode="floor")
    decays = sum((epoch >= e).float() for e in decay_epochs) if decay_epochs else 0 * step
    decayed = base * torch.pow(0.1, decays)
    warm = base - (warmup_steps - step) * base / (max(warmup_steps, 1) * 2 ** warmup_factor)
    return torch.where(step < warmup_steps, warm, decayed)


def _storage(text: str) -> str:
    if text not in image_cache.STORAGES:
        raise argparse.ArgumentTypeError(f"storage must be one of {image_cache.STORAGES}")
    return text


def _image_cache(wl: SSDWorkload, storage: str) -> None:
    if not wl.synthetic:
        wl.train_loader = image_cache.cached(wl.train_loader, storage, wl.args.cache_side)


def _fused_jitter(wl: SSDWorkload, _) -> None:
    if not wl.synthetic:
        fused_jitter.apply(wl.train_loader)


def _fused_match(wl: SSDWorkload, _) -> None:
    from benchmarks.ssd.match_triton import fused_overlaps  # Triton: GPU machines only

    wl.overlaps = fused_overlaps


def _compile(wl: SSDWorkload, mode: str) -> None:
    wl.model = maybe_compile(wl.model, mode)
    wl.match_loss = maybe_compile(wl._match_loss, mode)


# Measured in fp32 on the CPU, the tiny config: fused-pool and class-last-heads 6.4e-8 from the
# plain path's losses. Channels-last and space-to-depth change the convolutions' algorithms:
# the first two losses (the first update has LR 0) within 4.7e-7, the third, after one update,
# 1.5e-4 and 1.7e-4 off (the gradients of the batch norms' biases, sums that nearly cancel,
# differ by up to 5% of their largest entry). The caches' first batch: 4.7e-5 from the CPU
# pipeline's images (normalised units), the targets equal.
_BATCH_ATOL, _LAYOUT_RTOL = 1e-4, 5e-4
REGISTRY = Registry(
    Optimisation("image-cache", "=STORAGE: every training image decoded once into a cache in "
                 "device or host memory (--cache-side), each batch cropped, flipped, resized "
                 "and jittered on the device (image_cache.py)", apply=_image_cache,
                 value_type=_storage, default="device", compare="batches", atol=_BATCH_ATOL),
    Optimisation("fused-jitter", "the image cache's colour jitter as four compiled passes over "
                 "the batch (fused_jitter.py)", apply=_fused_jitter, requires=("image-cache",),
                 compare="batches", atol=_BATCH_ATOL),
    Optimisation("channels-last", "the network, and so its activations, in channels-last "
                 "memory", select=lambda wl, _: setattr(wl.impl, "memory_format",
                                                        torch.channels_last),
                 rtol=_LAYOUT_RTOL),
    Optimisation("space-to-depth", "the stem's 7x7 stride-2 convolution as a 4x4 one over 2x2 "
                 "pixel blocks (stem.py)", apply=lambda wl, _: stem.space_to_depth(
                     wl.net.backbone), rtol=_LAYOUT_RTOL),
    Optimisation("fused-pool", "the stem's ReLU + max-pool as one op with a gather-free "
                 "backward (stem.py)", apply=lambda wl, _: stem.fused_pool(wl.net.backbone)),
    Optimisation("class-last-heads", "the confidence heads' output channels reordered so "
                 "each box's class scores are contiguous, padded to multiples of 8 "
                 "(heads.py)", apply=lambda wl, _: heads.apply(wl.net)),
    Optimisation("fused-match", "the matching's IoU maxima in one Triton kernel, without the "
                 "[batch, boxes, 8732] IoU matrix (match_triton.py)", apply=_fused_match,
                 cuda=True),
    # not measured on a GPU yet: a rounding change is amplified as channels-last's is
    shared(COMPILE, apply=_compile, rtol=_LAYOUT_RTOL, description="torch.compile the model "
           "and the matching + loss, each a region (=MODE: default, tuned, "
           "max-autotune-no-cudagraphs)"),
    # GradScaler reads its overflow flag on the host: amp-fp16 cannot be captured
    shared(CUDA_GRAPH, precisions=("fp32", "tf32", "amp-bf16")),
)


class SSDWorkload(Workload):
    name = constants.SSD
    targets = (Target("bbox_map", 0.23),)
    full_dataset = (COCO_TRAIN_IMAGES, COCO_EVAL_IMAGES)
    scorer = staticmethod(score)
    hparams = HParams
    optimisations = REGISTRY
    train_loader = None   # built with real data

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="COCO 2017: annotations/instances_{train,val}2017.json, "
                            "{train,val}2017/*.jpg")
        p.add_argument("--max-boxes", type=checked(int, positive), default=data.MAX_BOXES,
                       help="ground-truth boxes per image, padded (static step shapes)")
        p.add_argument("--width", type=checked(int, positive), default=WIDTH,
                       help="ResNet-34 stem width; every channel count scales with it "
                            "(64: the reference; smaller only for CPU fixtures)")
        p.add_argument("--cache-side", type=checked(int, positive), default=image_cache.MAX_SIDE,
                       help="image-cache: longer side of cached images in pixels; memory: "
                            "images x 3 x side^2 bytes (COCO at 384: 51.9 GB per rank)")
        cli.add_args(p, "resnet34")

    # -- set-up ---------------------------------------------------------------------------
    def build(self) -> None:
        a, h, env = self.args, self.hp, self.env
        self.overlaps = dense_overlaps
        if not self.synthetic:
            self.train_split = coco.load_split(a.data_dir, "train")
            self.val_split = coco.load_split(a.data_dir, "val")
            num_classes = self.train_split.categories.num_classes + 1
        else:
            num_classes = 81
        self.num_classes = num_classes
        model = SSD300(num_classes, a.width)
        if a.backbone_checkpoint:
            cli.load_backbone(a.backbone_checkpoint, "resnet34",
                              model.backbone.load_torchvision)
        self.tensor_names = mllog_tensor_names(model)
        model = dist.group_norm_layers(model, env, h.bn_group)
        mem = getattr(self.impl, "memory_format", torch.contiguous_format)
        self.net = model.to(env.device, memory_format=mem)
        self.model = dist.data_parallel(self.net, env)
        self.dboxes = dboxes300_coco().to(env.device)
        self.loss = Loss(self.dboxes).to(env.device)
        self.match_loss = self._match_loss
        self.lr = torch.zeros((), device=env.device)
        self.step_count = torch.zeros((), device=env.device)
        self.optimizer = DeviceLRSGD(self.net.parameters(), lr=self.lr, momentum=h.momentum,
                                     weight_decay=h.weight_decay)
        self.scaler = self.precision.grad_scaler()
        if self.synthetic:
            self._steps_per_epoch = COCO_TRAIN_IMAGES // self.global_batch_size
        else:
            common = dict(rank=env.rank, world_size=env.world_size, num_workers=a.workers,
                          device=env.device)
            self.train_loader = data.build_train_loader(
                self.train_split, h.batch_size, seed=a.seed, max_boxes=a.max_boxes,
                max_samples=h.max_samples, **common)
            self.eval_loader = data.build_eval_loader(self.val_split, h.eval_batch_size,
                                                      **common)
            self._steps_per_epoch = len(self.train_loader)
        self.warmup_steps = max(1, int(h.warmup_epochs * self.train_samples
                                       / self.global_batch_size))

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (random device-resident tensors)"
        return coco.describe(self.args.data_dir, len(self.train_split), len(self.val_split))

    @property
    def global_batch_size(self) -> int:
        return self.hp.batch_size * self.env.world_size

    @property
    def train_samples(self) -> int:
        return COCO_TRAIN_IMAGES if self.synthetic else len(self.train_split)

    @property
    def eval_samples(self) -> int:
        return COCO_EVAL_IMAGES if self.synthetic else len(self.val_split)

    @property
    def base_lr(self) -> float:
        return self.hp.lr * self.global_batch_size / BASE_BATCH

    def hyperparameters(self) -> dict:
        a, c = self.hp, constants
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
        a = self.hp
        epochs = sorted({e for e in a.eval_epochs if 1 <= e < a.epochs} | {a.epochs})
        return epoch_points(epochs, self.steps_per_epoch)

    def epoch_batches(self, epoch: int):
        return self.train_loader.epoch(epoch)

    def close(self) -> None:
        if self.train_loader is not None:   # none with synthetic data
            self.train_loader.close()

    def capture_policy(self) -> CapturePolicy:
        return CapturePolicy("static")   # 300x300 images, targets padded to --max-boxes

    # -- steps ----------------------------------------------------------------------------
    def train_step(self, images, boxes, labels, valid) -> torch.Tensor:
        a = self.hp
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
        under ``compile``."""
        self.infer_step(*self.synthetic_batch(self.hp.eval_batch_size))

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
