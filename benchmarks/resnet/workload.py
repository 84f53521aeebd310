"""MLPerf Training ``resnet``: ResNet-50 v1.5 on ImageNet to 75.9% top-1.

Hyper-parameter defaults are NVIDIA's 8-GPU v1.1 settings, which match the
ruleset's reference convergence point for global batch 3264 (LARS, base LR
10.5, 2 warm-up epochs, weight decay 5e-5, momentum 0.9, 37 epochs,
evaluation every 4 epochs from epoch 3). With no optimisation named, the
network runs in NCHW memory, eagerly, fed by the Pillow reader.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from benchmarks.resnet import (
    dali,
    data,
    nvjpeg,
    region_decode,
    regions,
    residual,
    space_to_depth,
    turbo,
)
from benchmarks.resnet.lars import LARS, param_groups
from benchmarks.resnet.model import ResNet50, mllog_tensor_names
from benchmarks.resnet.schedule import poly_warmup_lr
from common import dist
from common.errors import UserError
from common.hparams import checked, hparam, non_negative, open_fraction, positive
from common.mllog import constants
from common.optimisations import COMPILE, CUDA_GRAPH, Optimisation, Registry, shared
from common.throughput import meta_train_flops
from common.workload import (
    CapturePolicy,
    EvalPoint,
    Target,
    Workload,
    epoch_points,
    evaluation_epochs,
    maybe_compile,
)

FIXTURE_MARKER = "FIXTURE_COMPLETE"
IMAGENET_TRAIN_IMAGES, IMAGENET_EVAL_IMAGES = 1_281_167, 50_000


@dataclass
class HParams:
    batch_size: int = hparam(408, "per-rank batch per step", check=positive)
    eval_batch_size: int = hparam(250, "per-rank evaluation batch", check=positive)
    grad_accum: int = hparam(1, "micro-batches a step, each of batch / grad-accum", check=positive)
    epochs: int = hparam(37, "epoch cap", check=positive)
    optimizer: str = hparam("lars", "LARS, or momentum SGD", choices=("lars", "sgd"))
    lr: float = hparam(10.5, "base learning rate", check=non_negative)
    end_lr: float = hparam(0.0001, "learning rate at the decay's end", check=non_negative)
    warmup_epochs: float = hparam(2.0, "epochs of linear warm-up", check=non_negative)
    poly_power: float = hparam(2.0, "power of the polynomial decay", check=positive)
    momentum: float = hparam(0.9, "momentum", check=open_fraction)
    weight_decay: float = hparam(5e-5, "weight decay (not of BN or biases)", check=non_negative)
    lars_eta: float = hparam(0.001, "LARS trust coefficient", check=positive)
    label_smoothing: float = hparam(0.1, "label smoothing of the loss", check=open_fraction)
    eval_period: int = hparam(4, "epochs between evaluations", check=positive)
    eval_offset: int = hparam(2, "first evaluation after epoch offset+1 (0-3)", check=non_negative)
    bn_group: int = hparam(1, "ranks sharing batch-norm statistics", check=positive)


def _channels_last(wl, _) -> None:
    wl.impl.memory_format = torch.channels_last


def _compile(wl, mode: str) -> None:
    """The network and the update as the optimisations before this one left them. Loop
    reordering is off for the update: on a GPU, Inductor 2.11 fails an assertion
    (``reorder_loops_by_dep_pair``) there."""
    wl.model = maybe_compile(wl.model, mode)
    wl.apply_update = maybe_compile(wl._apply_update, mode, loop_ordering_after_fusion=False)


# Crops differ from the Pillow reader's at their border pixels (inside by 2 levels at most,
# test_turbo.py); on the tiny config's first batch by 0.122 (7 levels) at most.
_ATOL, _TESTS = 0.15, "tests/benchmarks/resnet/test_"
# The input optimisations: they change the readers, not a step on device-resident batches.
INPUTS = (
    Optimisation("turbo", "libjpeg-turbo decode and torch's resize in the loader processes, "
                 "a batch's slices in one shared buffer (turbo.py)", select=turbo.select,
                 excludes=("nvjpeg", "dali"), compare="batches", atol=_ATOL),
    Optimisation("region-decode", "decode only each crop's region (libjpeg-turbo 3: make "
                 "turbojpeg; region_decode.py)", select=region_decode.select,
                 requires=("turbo",), compare="batches", atol=_ATOL),
    Optimisation("resize-on-device", "crops sent unresized, each batch resized where it "
                 "trains (regions.py)", select=regions.select, requires=("turbo",),
                 compare="batches", atol=_ATOL),
    Optimisation("eval-nvjpeg-share", "=F: that share of each evaluation batch decoded by "
                 "nvJPEG in the training process (nvjpeg_share.py)",
                 select=nvjpeg.select_eval_share, requires=("resize-on-device",), cuda=True,
                 value_type=nvjpeg.share, default=0.5, compare=None,
                 tested_by=_TESTS + "nvjpeg_share.py"),
    Optimisation("nvjpeg", "batched nvJPEG decode, crop and resize on the GPU (nvjpeg.py)",
                 select=nvjpeg.select, excludes=("dali",), cuda=True, compare=None,
                 tested_by=_TESTS + "nvjpeg.py"),
    Optimisation("cpu-decode-share", "=F: that share of each nvjpeg batch decoded in the "
                 "loader processes, as turbo does", select=nvjpeg.select_cpu_share,
                 requires=("nvjpeg",), cuda=True, value_type=nvjpeg.share, default=0.5,
                 compare=None, tested_by=_TESTS + "nvjpeg.py"),
    Optimisation("dali", "NVIDIA DALI reads, decodes, crops and normalises (dali.py)",
                 select=dali.select, compare=None, tested_by=_TESTS + "dali.py"))
INPUT = tuple(o.name for o in INPUTS)


class ResNetWorkload(Workload):
    name = constants.RESNET
    targets = (Target("top1", 0.759),)
    full_dataset = (IMAGENET_TRAIN_IMAGES, IMAGENET_EVAL_IMAGES)
    hparams = HParams
    # fp32 on the CPU: each within 1.2e-7 of the plain path's losses (measured)
    optimisations = Registry(
        *INPUTS,
        Optimisation("channels-last", "weights, activations and batches in channels-last "
                     "memory", select=_channels_last, rtol=1e-6),
        Optimisation("space-to-depth", "the 7x7 stem convolution as a 4x4 one over 2x2 "
                     "pixel blocks (space_to_depth.py)", apply=space_to_depth.apply,
                     rtol=1e-6),
        Optimisation("cudnn-fusion", "batch norm inside cuDNN fusion graphs, one ReLU + "
                     "max-pool op (on a GPU: amp-fp16, nvidia-cudnn-frontend; residual.py)",
                     select=residual.select, apply=residual.apply,
                     requires=("channels-last",), rtol=1e-6),
        shared(COMPILE, apply=_compile, rtol=1e-6),
        CUDA_GRAPH)

    def __init__(self, args: argparse.Namespace, env, precision):
        super().__init__(args, env, precision)
        # the reference's (Pillow, NCHW memory) until an optimisation's select() changes it
        self.impl.decoder, self.impl.memory_format = data.pillow_decoder, torch.contiguous_format
        self.impl.options, self.impl.eval_options = {}, {}

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="ImageNet folder with train/<wnid>/*.JPEG and val/<wnid>/*.JPEG")
        p.add_argument("--workers", type=checked(int, non_negative), default=4,
                       help="loader processes per rank")
        p.add_argument("--image-size", type=checked(int, positive), default=224,
                       help="training crop size in pixels")

    # -- set-up ---------------------------------------------------------------------------
    def build(self) -> None:
        a, hp, env = self.args, self.hp, self.env
        if hp.batch_size % hp.grad_accum:
            raise UserError(f"--batch-size {hp.batch_size} is not divisible by "
                            f"--grad-accum {hp.grad_accum}")
        self.index = None if self.synthetic else data.ImageFolderIndex.scan(a.data_dir)
        self.num_classes = len(self.index.classes) if self.index else 1000
        model = ResNet50(self.num_classes)
        self.tensor_names = mllog_tensor_names(model)
        model = dist.group_norm_layers(model, env, hp.bn_group)
        self.net = model.to(env.device, memory_format=self.impl.memory_format)
        self.model = dist.data_parallel(self.net, env)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=hp.label_smoothing)
        # Learning rate and step count live on the device so a captured step can advance them.
        self.step_count = torch.zeros((), device=env.device)
        self.lr = torch.zeros((), device=env.device)
        groups = param_groups(self.net, hp.weight_decay, lars=hp.optimizer == "lars")
        for g in groups:
            g["lr"] = self.lr
        self.optimizer = LARS(groups, lr=self.lr, momentum=hp.momentum, eta=hp.lars_eta)
        self.scaler = self.precision.device_loss_scaler(env.device)
        self.apply_update = self._apply_update
        if self.index is not None:
            common = dict(index=self.index, image_size=a.image_size, rank=env.rank,
                          world_size=env.world_size, workers=a.workers, device=env.device,
                          decoder=self.impl.decoder, **self.impl.options)
            self.train_loader = data.build_loader(train=True, batch_size=hp.batch_size,
                                                  seed=a.seed, **common)
            self.eval_loader = data.build_loader(train=False, batch_size=hp.eval_batch_size,
                                                 **common, **self.impl.eval_options)
            for loader in (self.train_loader, self.eval_loader):
                loader.memory_format = self.impl.memory_format
            self._steps_per_epoch = len(self.train_loader)
        else:
            self._steps_per_epoch = self.train_samples // self.global_batch_size
        if self.steps_per_epoch < 1:
            raise UserError(f"{a.data_dir}: {self.train_samples} training images are fewer than "
                            f"one global batch ({self.global_batch_size}); lower --batch-size")
        self.warmup_steps = round(hp.warmup_epochs * self.steps_per_epoch)
        self.decay_steps = hp.epochs * self.steps_per_epoch
        if self.decay_steps <= self.warmup_steps:
            raise UserError(f"--epochs {hp.epochs} ends within the --warmup-epochs "
                            f"{hp.warmup_epochs} warm-up: raise --epochs or lower the warm-up")
        if hp.eval_offset >= hp.eval_period:
            raise UserError(f"--eval-offset {hp.eval_offset} is not less than --eval-period "
                            f"{hp.eval_period}: the first evaluation falls within the first "
                            "period (MLPerf: offset 0-3 for period 4)")

    @property
    def dataset(self) -> str:
        if self.index is None:
            return "synthetic (random device-resident tensors)"
        n = len(self.index.train)
        if (self.index.root / FIXTURE_MARKER).is_file():
            return (f"fixture: synthetic ImageNet-format JPEGs from benchmarks.resnet.fixture, "
                    f"not ImageNet ({len(self.index.classes)} classes, {n} train images)")
        if n == IMAGENET_TRAIN_IMAGES and len(self.index.classes) == 1000:
            return "imagenet (ILSVRC2012)"
        return (f"ImageNet-format folder {self.index.root} ({len(self.index.classes)} classes, "
                f"{n} train images; not the full ILSVRC2012 train set)")

    @property
    def steps_per_epoch(self) -> int:
        return self._steps_per_epoch

    @property
    def train_samples(self) -> int:
        return len(self.index.train) if self.index else IMAGENET_TRAIN_IMAGES

    @property
    def eval_samples(self) -> int:
        return len(self.index.val) if self.index else IMAGENET_EVAL_IMAGES

    def hyperparameters(self) -> dict:
        a = self.hp
        c = constants
        hp = {c.OPT_NAME: a.optimizer, c.GRADIENT_ACCUMULATION_STEPS: a.grad_accum,
              c.MODEL_BN_SPAN: a.batch_size // a.grad_accum * a.bn_group}
        if a.optimizer == "lars":
            hp.update({
                c.LARS_OPT_BASE_LEARNING_RATE: a.lr,
                c.LARS_OPT_END_LR: a.end_lr,
                c.LARS_OPT_LR_DECAY_POLY_POWER: a.poly_power,
                c.LARS_OPT_LR_DECAY_STEPS: self.decay_steps,
                c.LARS_EPSILON: 0.0,
                c.LARS_OPT_LEARNING_RATE_WARMUP_EPOCHS: a.warmup_epochs,
                c.LARS_OPT_MOMENTUM: a.momentum,
                c.LARS_OPT_WEIGHT_DECAY: a.weight_decay,
            })
        else:
            hp.update({
                "sgd_opt_base_learning_rate": a.lr,
                "sgd_opt_end_learning_rate": a.end_lr,
                "sgd_opt_learning_rate_decay_poly_power": a.poly_power,
                "sgd_opt_learning_rate_decay_steps": self.decay_steps,
                "sgd_opt_weight_decay": a.weight_decay,
                "sgd_opt_momentum": a.momentum,
                c.OPT_LR_WARMUP_EPOCHS: a.warmup_epochs,
            })
        return hp

    def eval_points(self) -> list[EvalPoint]:
        a = self.hp
        return epoch_points(evaluation_epochs(a.eval_period, a.eval_offset, a.epochs),
                            self.steps_per_epoch)

    def capture_policy(self) -> CapturePolicy:
        return CapturePolicy("static", fp16=True)   # DeviceLossScaler: overflow on the device

    # -- throughput harness ---------------------------------------------------------------

    @property
    def flops_per_sample(self) -> float:
        """Training FLOPs per image (forward + backward), counted by torch's FlopCounterMode."""
        size = self.args.image_size
        return meta_train_flops(lambda: ResNet50(1000), (3, size, size))

    # -- steps ----------------------------------------------------------------------------
    def epoch_batches(self, epoch: int):
        return self.train_loader.epoch(epoch)

    def synthetic_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = data.synthetic_batch(batch_size, self.args.image_size,
                                              self.num_classes, self.env.device)
        return images.contiguous(memory_format=self.impl.memory_format), labels

    def training_state(self) -> list[torch.Tensor]:
        momenta = [s["momentum_buffer"] for s in self.optimizer.state.values()]
        return [*self.net.state_dict(keep_vars=True).values(), *momenta, self.step_count,
                self.lr, self.scaler.loss_scale, self.scaler.growth_tracker]

    def warm_up_eval(self) -> None:
        """The evaluation forward at each batch size this rank's evaluation takes (its last
        batch may be short), twice each: on a GPU the compiled frames' first call hands the
        frames after it tensors of another dispatch-key set (``ADInplaceOrView``) than later
        calls do, and a single warm-up call left the first evaluation to recompile 40 frames
        (1.5 s on an H100; ``TORCH_LOGS=recompiles``)."""
        size = self.hp.eval_batch_size
        sizes = {size}
        if getattr(self, "eval_loader", None) is not None:
            sizes.add(len(self.eval_loader.shard(0)) % size or size)
        for size in sorted(sizes):
            batch = self.synthetic_batch(size)
            for _ in range(2):
                self.infer_step(*batch)

    def infer_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        with torch.no_grad(), self.precision.autocast():
            logits = self.model(images)
        self.model.train()
        return logits

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        a = self.hp
        self.lr.copy_(poly_warmup_lr(self.step_count, a.lr, a.end_lr, self.warmup_steps,
                                     self.decay_steps, a.poly_power))
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=images.device)
        for i, (x, y) in enumerate(zip(images.chunk(a.grad_accum), labels.chunk(a.grad_accum))):
            last = i == a.grad_accum - 1
            sync = (self.model.no_sync() if (not last and self.env.distributed)
                    else contextlib.nullcontext())
            with sync:
                with self.precision.autocast():
                    loss = self.criterion(self.model(x), y) / a.grad_accum
                self.scaler.scale(loss).backward()
            total += loss.detach().float()
        self.apply_update()
        self.step_count += 1
        return total

    def _apply_update(self) -> None:
        if self.scaler.enabled:  # amp-fp16: skip the update on overflow, on the device
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            grads, overflow = self.scaler.unscale([p.grad for p in params])
            self.optimizer.step(skip=overflow, grads=grads)
            self.scaler.update(overflow)
        else:
            self.optimizer.step()

    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        counts = torch.zeros(2, dtype=torch.float64, device=self.env.device)
        for images, labels in self.eval_loader.epoch(0):
            with self.precision.autocast():
                logits = self.model(images)
            counts[0] += (logits.argmax(1) == labels).sum()
            counts[1] += labels.numel()
        self.model.train()
        dist.all_reduce_sum(counts)
        correct, seen = counts.tolist()
        if int(seen) != self.eval_samples:
            raise RuntimeError(f"evaluated {int(seen)} images, expected {self.eval_samples}")
        return {"top1": correct / seen}

    def close(self) -> None:
        for loader in (getattr(self, "train_loader", None), getattr(self, "eval_loader", None)):
            if loader is not None:
                loader.close()

