"""MLPerf Training ``resnet``: ResNet-50 v1.5 on ImageNet to 75.9% top-1.

Hyper-parameter defaults are NVIDIA's 8-GPU v1.1 settings, which match the
ruleset's reference convergence point for global batch 3264 (LARS, base LR
10.5, 2 warm-up epochs, weight decay 5e-5, momentum 0.9, 37 epochs,
evaluation every 4 epochs from epoch 3).
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch
from torch import nn

from benchmarks.resnet import data, fused_conv
from benchmarks.resnet.lars import LARS, param_groups
from benchmarks.resnet.model import ResNet50, mllog_tensor_names
from benchmarks.resnet.schedule import poly_warmup_lr
from common import dist
from common.errors import UserError
from common.mllog import constants
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
IMAGENET_TRAIN_IMAGES = 1_281_167


class ResNetWorkload(Workload):
    name = constants.RESNET
    targets = (Target("top1", 0.759),)

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="ImageNet folder with train/<wnid>/*.JPEG and val/<wnid>/*.JPEG")
        p.add_argument("--data-backend", default="cpu", choices=data.BACKENDS,
                       help="cpu: Pillow decode in workers; turbo: libjpeg-turbo decode in "
                            "workers, one buffer per batch slice; nvjpeg: batched nvJPEG and "
                            "crops, overlapped with the step; dali: NVIDIA DALI")
        p.add_argument("--cpu-decode-share", type=float, default=0.0,
                       help="nvjpeg backend: the share of each batch (0 to 1) that the loader "
                            "processes decode, crop and resize as the turbo backend does, "
                            "instead of nvJPEG")
        p.add_argument("--region-decode", action="store_true",
                       help="turbo backend: decode only each crop's region of the JPEG "
                            "(libjpeg-turbo 3, `make turbojpeg`; region_decode.py)")
        p.add_argument("--resize-on-device", action=argparse.BooleanOptionalAction,
                       default=False,
                       help="turbo backend: the loader processes send each crop unresized; "
                            "the batch's crops are resized, mirrored and normalised on the "
                            "device, one kernel per batch on a GPU (regions.py)")
        p.add_argument("--eval-nvjpeg-share", type=float, default=0.0,
                       help="turbo backend with --resize-on-device, on a GPU: the share of "
                            "each evaluation batch (0 to 1) decoded by nvJPEG in the "
                            "training process instead of the loader processes "
                            "(nvjpeg_share.py)")
        p.add_argument("--workers", type=int, default=4, help="loader processes per rank")
        p.add_argument("--image-size", type=int, default=224)
        p.add_argument("--batch-size", type=int, default=408, help="per-rank batch per step")
        p.add_argument("--eval-batch-size", type=int, default=250)
        p.add_argument("--grad-accum", type=int, default=1,
                       help="micro-batches per step (each of --batch-size / --grad-accum)")
        p.add_argument("--epochs", type=int, default=37, help="epoch cap")
        p.add_argument("--optimizer", default="lars", choices=("lars", "sgd"))
        p.add_argument("--lr", type=float, default=10.5, help="base learning rate")
        p.add_argument("--end-lr", type=float, default=0.0001)
        p.add_argument("--warmup-epochs", type=float, default=2)
        p.add_argument("--poly-power", type=float, default=2.0)
        p.add_argument("--momentum", type=float, default=0.9)
        p.add_argument("--weight-decay", type=float, default=5e-5)
        p.add_argument("--lars-eta", type=float, default=0.001)
        p.add_argument("--label-smoothing", type=float, default=0.1)
        p.add_argument("--eval-period", type=int, default=4, help="epochs between evaluations")
        p.add_argument("--eval-offset", type=int, default=2,
                       help="first evaluation after epoch offset+1 (MLPerf allows 0-3)")
        p.add_argument("--bn-group", type=int, default=1, help="ranks sharing BN statistics")
        p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
        p.add_argument("--space-to-depth", action="store_true",
                       help="compute the 7x7 stem convolution as a 4x4 one over 2x2 pixel "
                            "blocks (same result, faster cuDNN kernels)")
        p.add_argument("--cudnn-fusion", action="store_true",
                       help="batch norm folded into cuDNN fusion graphs around each bottleneck "
                            "convolution, and the stem's ReLU + max-pool with a gather-free "
                            "backward (GPU: amp-fp16 and the nvidia-cudnn-frontend package)")

    # -- set-up ---------------------------------------------------------------------------
    def build(self) -> None:
        a, env = self.args, self.env
        if a.batch_size % a.grad_accum:
            raise UserError(f"--batch-size {a.batch_size} is not divisible by "
                            f"--grad-accum {a.grad_accum}")
        if self.synthetic:
            self.index, num_classes = None, 1000
        else:
            self.index = data.ImageFolderIndex.scan(a.data_dir)
            num_classes = len(self.index.classes)
        if a.cudnn_fusion:
            _check_cudnn_fusion(a, env)
        self.num_classes = num_classes
        model = ResNet50(num_classes, space_to_depth=a.space_to_depth,
                         cudnn_fusion=a.cudnn_fusion)
        self.tensor_names = mllog_tensor_names(model)
        model = dist.group_norm_layers(model, env, a.bn_group)
        mem = torch.channels_last if a.channels_last else torch.contiguous_format
        model = model.to(env.device, memory_format=mem)
        self.net = model
        self.model = maybe_compile(dist.data_parallel(model, env), a.compile)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=a.label_smoothing)
        # Learning rate and step count live on the device so a captured step can advance them.
        self.step_count = torch.zeros((), device=env.device)
        self.lr = torch.zeros((), device=env.device)
        groups = param_groups(model, a.weight_decay, lars=a.optimizer == "lars")
        for g in groups:
            g["lr"] = self.lr
        self.optimizer = LARS(groups, lr=self.lr, momentum=a.momentum, eta=a.lars_eta)
        self.scaler = self.precision.device_loss_scaler(env.device)
        # Compiled, the unscale, overflow check and LARS's per-tensor math run as a few
        # multi-tensor kernels; the unscaled gradients are never written to memory. Loop
        # reordering is off for this graph: on a GPU, Inductor 2.11 fails an assertion
        # (``reorder_loops_by_dep_pair``) when it tries it there.
        self.apply_update = maybe_compile(self._apply_update, a.compile,
                                          loop_ordering_after_fusion=False)
        if self.index is not None:
            common = dict(index=self.index, backend=a.data_backend, image_size=a.image_size,
                          rank=env.rank, world_size=env.world_size, workers=a.workers,
                          device=env.device, cpu_decode_share=a.cpu_decode_share,
                          region_decode=a.region_decode,
                          resize_on_device=a.resize_on_device)
            self.train_loader = data.build_train_loader(batch_size=a.batch_size, seed=a.seed,
                                                        **common)
            self.eval_loader = data.build_eval_loader(batch_size=a.eval_batch_size,
                                                      nvjpeg_share=a.eval_nvjpeg_share,
                                                      **common)
            self._steps_per_epoch = len(self.train_loader)
        else:
            self._steps_per_epoch = self.train_samples // self.global_batch_size
        if self.steps_per_epoch < 1:
            raise UserError(f"{a.data_dir}: {self.train_samples} training images are fewer than "
                            f"one global batch ({self.global_batch_size}); lower --batch-size")
        self.warmup_steps = round(a.warmup_epochs * self.steps_per_epoch)
        self.decay_steps = a.epochs * self.steps_per_epoch

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
    def global_batch_size(self) -> int:
        return self.args.batch_size * self.env.world_size

    @property
    def train_samples(self) -> int:
        return len(self.index.train) if self.index else IMAGENET_TRAIN_IMAGES

    @property
    def eval_samples(self) -> int:
        return len(self.index.val) if self.index else 50_000

    def hyperparameters(self) -> dict:
        a = self.args
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

    def initialized_tensors(self) -> list[str]:
        return self.tensor_names

    def eval_points(self) -> list[EvalPoint]:
        a = self.args
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
        return data.synthetic_batch(batch_size, self.args.image_size, self.num_classes,
                                    self.env.device)

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
        sizes = {self.args.eval_batch_size}
        if getattr(self, "eval_loader", None) is not None:
            sizes.add(len(self.eval_loader.shard(0)) % self.args.eval_batch_size
                      or self.args.eval_batch_size)
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
        a = self.args
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


def _check_cudnn_fusion(a: argparse.Namespace, env) -> None:
    """``--cudnn-fusion`` keeps per-GPU statistics and, on a GPU, needs fp16 and cudnn-frontend."""
    if a.bn_group != 1:
        raise UserError(f"--cudnn-fusion computes batch-norm statistics per GPU: it cannot be "
                        f"combined with --bn-group {a.bn_group}")
    if env.device.type != "cuda":
        return
    if a.precision != "amp-fp16":
        raise UserError(f"--cudnn-fusion needs --precision amp-fp16, not {a.precision}: "
                        f"cuDNN has fusion engines for fp16 only")
    try:
        fused_conv.cudnn_frontend()
    except ImportError as exc:
        raise UserError(f"--cudnn-fusion needs the cuDNN frontend ({exc}): "
                        f"pip install nvidia-cudnn-frontend") from exc
