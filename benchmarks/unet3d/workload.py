"""MLPerf Training ``unet3d``: the 3D U-Net on KiTS19 to a mean Dice of 0.908.

Defaults are the reference's (``image_segmentation/pytorch/run_and_time.sh``
and the ruleset's batch-2 reference convergence point): batch 2, SGD with
Nesterov momentum 0.9, base LR 0.8 reached by a linear warm-up from 1e-4 over
200 epochs, no decay, weight decay 0, foreground oversampling 0.4, 128^3
training and validation windows with overlap 0.5, evaluation every 20 epochs
from epoch 1000, at most 4000 epochs.

``--spatial-group G`` splits every sample's depth over G consecutive ranks
(``spatial.py``); the ranks of a group train on the same samples, so the
global batch is ``batch-size * world / G``. Evaluation deals every case's
sliding windows over all ranks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.unet3d import data, inference, spatial
from benchmarks.unet3d.loss import dice_ce_loss, dice_score
from benchmarks.unet3d.model import FILTERS, NUM_CLASSES, Unet3D, as_channels_last_3d
from common import dist
from common.errors import UserError
from common.hparams import checked, non_negative, positive
from common.mllog import constants
from common.precision import grad_scaler_state
from common.progress import say
from common.sgd import DeviceLRSGD
from common.throughput import meta_train_flops
from common.workload import (
    CapturePolicy,
    EvalPoint,
    Target,
    Workload,
    epoch_points,
    maybe_compile,
)

FIXTURE_MARKER = "FIXTURE_COMPLETE"
KITS19_TRAIN, KITS19_EVAL = 168, 42


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.replace("x", ",").split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers like 128,128,128, got {text!r}") from None


def lr_at(epoch: int, a: argparse.Namespace) -> float:
    """The reference's per-epoch LR: linear warm-up from ``init_lr``, then step decays.

    A decay at boundary b applies from epoch b + 1 (the reference steps its
    MultiStepLR after each epoch).
    """
    if epoch <= a.lr_warmup_epochs:
        return a.init_lr + (a.lr - a.init_lr) * epoch / a.lr_warmup_epochs
    decays = sum(1 for b in a.lr_decay_epochs if b < epoch)
    return a.lr * a.lr_decay_factor ** decays


class Unet3DWorkload(Workload):
    name = constants.UNET3D
    targets = (Target("mean_dice", 0.908),)

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="folder of case_XXXXX_x.npy / case_XXXXX_y.npy (prepare_data.py)")
        p.add_argument("--batch-size", type=checked(int, positive),
                       default=2, help="samples per step per replica")
        p.add_argument("--epochs", type=checked(int, positive), default=4000, help="epoch cap")
        p.add_argument("--lr", type=checked(float, positive),
                       default=0.8, help="base learning rate")
        p.add_argument("--init-lr", type=float, default=1e-4, help="learning rate of epoch 0")
        p.add_argument("--lr-warmup-epochs", type=checked(int, non_negative), default=200)
        p.add_argument("--lr-decay-epochs", type=int, nargs="*", default=[])
        p.add_argument("--lr-decay-factor", type=float, default=1.0)
        p.add_argument("--momentum", type=float, default=0.9)
        p.add_argument("--weight-decay", type=float, default=0.0)
        p.add_argument("--oversampling", type=float, default=0.4)
        p.add_argument("--input-shape", type=_ints, default=(128, 128, 128),
                       help="training patch D,H,W")
        p.add_argument("--val-input-shape", type=_ints, default=(128, 128, 128),
                       help="sliding window D,H,W")
        p.add_argument("--overlap", type=float, default=0.5, help="sliding-window overlap")
        p.add_argument("--start-eval-at", type=checked(int, positive), default=1000)
        p.add_argument("--evaluate-every", type=checked(int, positive), default=20)
        p.add_argument("--eval-batch-size", type=checked(int, positive),
                       default=1, help="windows per forward")
        p.add_argument("--filters", type=_ints, default=FILTERS,
                       help="channels of the five levels; smaller only for the CPU fixture")
        p.add_argument("--spatial-group", type=checked(int, positive), default=1,
                       help="ranks sharing one sample, split along depth")
        p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=False,
                       help="channels_last_3d activations")
        p.add_argument("--fused-norm", action=argparse.BooleanOptionalAction, default=False,
                       help="instance norm + ReLU as compiled kernels that read channels_last_3d "
                            "in place")
        p.add_argument("--workers", type=checked(int, non_negative), default=4,
                       help="loader processes per rank")

    # -- set-up ---------------------------------------------------------------------------
    def build(self) -> None:
        a, env = self.args, self.env
        self._check_args()
        self.train_cases, self.val_cases = ([], []) if self.synthetic else data.scan(a.data_dir)
        self.fixture = not self.synthetic and (a.data_dir / FIXTURE_MARKER).is_file()
        self.sg = spatial.new_spatial_group(a.spatial_group) if a.spatial_group > 1 else None
        self.replicas = env.world_size // a.spatial_group
        self.replica = env.rank // a.spatial_group
        self.train_set = data.TrainSet(self.train_cases, a.input_shape, a.oversampling, a.seed)
        if self.train_samples < self.global_batch_size:
            raise UserError(f"{a.data_dir}: {self.train_samples} training cases are fewer "
                            f"than one global batch ({self.global_batch_size})")
        if self.train_samples % self.global_batch_size:
            say(f"note: global batch {self.global_batch_size} does not divide "
                f"{self.train_samples} training cases; the remainder is dropped each epoch",
                env.is_main)
        self.eval_set: list | None = None  # read at the first evaluation, inside the timed run

        torch.manual_seed(a.seed)   # the same initial weights on every rank
        self.net = Unet3D(a.filters, 1, NUM_CLASSES, a.fused_norm).to(env.device)
        if a.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last_3d)
        train_net = spatial.spatial_parallel(self.net, self.sg) if self.sg else self.net
        self.model = dist.data_parallel(train_net, env)
        # --compile: the forward and the loss as one graph (the spatial loss's collectives stay
        # outside it, so there only the model is compiled)
        if self.sg:
            self.model = maybe_compile(self.model, a.compile)
        self.forward_loss = self._forward_loss if self.sg else maybe_compile(self._forward_loss,
                                                                             a.compile)
        self.lr = torch.zeros((), device=env.device)
        self.optimizer = DeviceLRSGD(self.net.parameters(), lr=self.lr, momentum=a.momentum,
                                     weight_decay=a.weight_decay, nesterov=True)
        self.scaler = self.precision.grad_scaler()

    def _check_args(self) -> None:
        a, env = self.args, self.env
        for flag, shape in (("--input-shape", a.input_shape),
                            ("--val-input-shape", a.val_input_shape)):
            if len(shape) != 3 or any(s % 2 ** 5 for s in shape):
                raise UserError(f"{flag} {shape}: need three sizes, each a multiple of 32 "
                                f"(the U-Net halves them five times)")
        steps = [int(s * (1 - a.overlap)) for s in a.val_input_shape]
        if not 0 <= a.overlap < 1 or min(steps) < 1 or a.lr_warmup_epochs < 0 \
                or a.batch_size < 1:
            raise UserError("need 0 <= --overlap < 1 with a window step of at least one voxel, "
                            "--lr-warmup-epochs >= 0, --batch-size >= 1")
        g = a.spatial_group
        if g < 1 or env.world_size % g:
            raise UserError(f"--spatial-group {g} must divide the {env.world_size} ranks")
        if g > 1 and a.input_shape[0] % (32 * g):
            raise UserError(f"--spatial-group {g}: the patch depth {a.input_shape[0]} must be a "
                            f"multiple of {32 * g}")

    def _eval_case(self, case: data.Case) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = data.load(case)
        dev = self.env.device
        return torch.from_numpy(image)[None].to(dev), torch.from_numpy(label)[None].to(dev)

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (random device-resident tensors)"
        n_train, n_val = len(self.train_cases), len(self.val_cases)
        if self.fixture:
            return (f"fixture: synthetic KiTS19-format volumes from benchmarks.unet3d.fixture, "
                    f"not KiTS19 ({n_train} train / {n_val} eval cases)")
        if (n_train, n_val) == (KITS19_TRAIN, KITS19_EVAL):
            return "kits19 (MLPerf preprocessed)"
        return f"KiTS19-format folder {self.args.data_dir} ({n_train} train / {n_val} eval cases)"

    @property
    def global_batch_size(self) -> int:
        return self.args.batch_size * self.env.world_size // self.args.spatial_group

    @property
    def train_samples(self) -> int:
        return KITS19_TRAIN if self.synthetic else len(self.train_cases)

    @property
    def eval_samples(self) -> int:
        return KITS19_EVAL if self.synthetic else len(self.val_cases)

    def hyperparameters(self) -> dict:
        a, c = self.args, constants
        return {
            c.OPT_NAME: "sgd",
            c.OPT_BASE_LR: a.lr,
            "opt_initial_learning_rate": a.init_lr,
            c.OPT_LR_WARMUP_EPOCHS: a.lr_warmup_epochs,
            c.OPT_LR_DECAY_BOUNDARY_EPOCHS: list(a.lr_decay_epochs),
            c.OPT_LR_DECAY_FACTOR: a.lr_decay_factor,
            c.OPT_WEIGHT_DECAY: a.weight_decay,
            "opt_momentum": a.momentum,
            "oversampling": a.oversampling,
            "training_input_shape": list(a.input_shape),
            "validation_input_shape": list(a.val_input_shape),
            "validation_overlap": a.overlap,
            c.GRADIENT_ACCUMULATION_STEPS: 1,
            "unet3d_filters": list(a.filters),   # not an MLPerf key: 32,64,128,256,320 is MLPerf's
        }

    def initialized_tensors(self) -> list[str]:
        return self.net.tensor_names()

    @property
    def rank_batch_size(self) -> int:
        return self.args.batch_size   # a spatial group's ranks each hold a slab of every sample

    @property
    def steps_per_epoch(self) -> int:
        return self.train_samples // self.global_batch_size   # the remainder is dropped

    def eval_points(self) -> list[EvalPoint]:
        """The reference's schedule: evaluate at ``start_eval_at``, then every ``evaluate_every``
        epochs, and at the cap."""
        a = self.args
        epochs = list(range(min(a.start_eval_at, a.epochs), a.epochs + 1, a.evaluate_every))
        if epochs[-1] != a.epochs:
            epochs.append(a.epochs)
        return epoch_points(epochs, self.steps_per_epoch)

    @property
    def flops_per_sample(self) -> float:
        """Training FLOPs per sample (forward + backward) of the model on one patch."""
        return meta_train_flops(lambda: Unet3D(self.args.filters, 1, NUM_CLASSES),
                                (1, *self.args.input_shape))

    def capture_policy(self) -> CapturePolicy:
        return CapturePolicy("static", fp16=False)  # GradScaler reads its overflow flag on the host

    def training_state(self) -> list[torch.Tensor]:
        momenta = [s["momentum_buffer"] for s in self.optimizer.state.values()]
        return [*self.net.state_dict(keep_vars=True).values(), *momenta, self.lr,
                *grad_scaler_state(self.scaler, self.env.device)]

    # -- steps ----------------------------------------------------------------------------
    def epoch_batches(self, epoch: int):
        self.lr.fill_(lr_at(epoch, self.args))
        return _Batches(self, epoch)

    def synthetic_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = data.synthetic_batch(batch_size, self.args.input_shape, self.env.device)
        if self.sg:
            image, label = self.sg.slab(image).contiguous(), self.sg.slab(label).contiguous()
        if self.args.channels_last:
            image = as_channels_last_3d(image)
        return image, label

    def infer_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), self.precision.autocast():
            return self.net(images)

    def _forward_loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast():
            logits = self.model(images)
        if self.sg:
            return spatial.spatial_loss(logits, labels, self.sg)
        return dice_ce_loss(logits, labels)

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_loss(images, labels)
        # Each rank's gradient is its slab's share; DDP divides by the world, not the replicas.
        scaled = loss * self.sg.size if self.sg else loss
        self.scaler.scale(scaled).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.detach()

    def evaluate(self) -> dict[str, float]:
        a, env = self.args, self.env
        self.net.eval()
        scores = torch.zeros(NUM_CLASSES - 1, dtype=torch.float64, device=env.device)
        if self.eval_set is None:  # MLPerf: no data is touched before run_start; kept after
            self.eval_set = [self._eval_case(c) for c in self.val_cases]
        for image, label in self.eval_set:
            with self.precision.autocast():
                logits, crops = inference.sliding_window(
                    self.net, image, a.val_input_shape, a.overlap, NUM_CLASSES,
                    a.eval_batch_size, env.rank, env.world_size)
            scores += dice_score(logits, inference.crop(label, crops)).double()
        self.net.train()
        scores = scores / len(self.eval_set)
        return {"mean_dice": float(scores.mean()), "kidney_dice": float(scores[0]),
                "tumour_dice": float(scores[1])}


class _Batches:
    """One rank's training batches of an epoch, on the device (its depth slab when split)."""

    def __init__(self, wl: Unet3DWorkload, epoch: int):
        a = wl.args
        self.wl = wl
        order = data.epoch_order(len(wl.train_cases), a.seed, epoch, wl.global_batch_size,
                                 wl.replica, wl.replicas)
        # No pinned memory: the pinning thread's CUDA calls would break the step's graph capture.
        self.loader = torch.utils.data.DataLoader(wl.train_set, batch_sampler=order,
                                                  num_workers=a.workers)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        dev, sg = self.wl.env.device, self.wl.sg
        for image, label in self.loader:
            if sg:
                image, label = sg.slab(image), sg.slab(label)
            image = image.to(dev, non_blocking=True).contiguous()
            if self.wl.args.channels_last:
                image = as_channels_last_3d(image)
            yield image, label.to(dev, non_blocking=True).contiguous()
