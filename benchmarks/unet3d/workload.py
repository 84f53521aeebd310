"""MLPerf Training ``unet3d``: the 3D U-Net on KiTS19 to a mean Dice of 0.908.

The hyper-parameters' defaults (``HParams``) are the reference's
(``image_segmentation/pytorch/run_and_time.sh``), the ruleset's batch-2 reference convergence
point. With no optimisation named the network runs as the reference runs it: NCDHW memory,
``F.instance_norm``, eagerly, one process per sample, every rank evaluating every window;
each optimisation (``--list-optimisations``) changes one of these from its own module.
``spatial-group=G`` splits every sample's depth over G consecutive ranks (``spatial.py``); the
ranks of a group train on the same samples, so the global batch is ``batch-size * world / G``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.unet3d import data, fused_norm, inference, spatial, standin
from benchmarks.unet3d.loss import dice_ce_loss, dice_score
from benchmarks.unet3d.model import FILTERS, NUM_CLASSES, Unet3D
from common import dist, fixture_cache, loaders
from common.errors import UserError
from common.hparams import checked, fraction, hparam, non_negative, open_fraction, positive
from common.mllog import constants
from common.optimisations import COMPILE, CUDA_GRAPH, Optimisation, Registry, shared
from common.precision import grad_scaler_state
from common.progress import say
from common.sgd import DeviceLRSGD
from common.throughput import meta_train_flops
from common.workload import CapturePolicy, EvalPoint, Target, Workload, epoch_points, maybe_compile

KITS19_TRAIN, KITS19_EVAL = 168, 42


@dataclass
class HParams:
    """The reference's hyper-parameters (its ``run_and_time.sh`` and the RCP of batch 2)."""

    batch_size: int = hparam(2, "samples per step per replica", positive)
    eval_batch_size: int = hparam(1, "windows per evaluation forward", positive)
    epochs: int = hparam(4000, "epoch cap", positive)
    lr: float = hparam(0.8, "base learning rate", positive)
    init_lr: float = hparam(1e-4, "learning rate of epoch 0", non_negative)
    lr_warmup_epochs: int = hparam(200, "epochs of linear warm-up from --init-lr", non_negative)
    lr_decay_epochs: list[int] = hparam([], "epochs after which the LR decays", positive)
    lr_decay_factor: float = hparam(1.0, "LR factor of each decay", positive)
    momentum: float = hparam(0.9, "Nesterov momentum", open_fraction)
    weight_decay: float = hparam(0.0, "weight decay", non_negative)
    oversampling: float = hparam(0.4, "share of crops around a foreground object", fraction)
    input_shape: list[int] = hparam([128, 128, 128], "training patch D,H,W", positive)
    val_input_shape: list[int] = hparam([128, 128, 128], "sliding window D,H,W", positive)
    overlap: float = hparam(0.5, "sliding-window overlap", open_fraction)
    start_eval_at: int = hparam(1000, "first evaluated epoch", positive)
    evaluate_every: int = hparam(20, "epochs between evaluations", positive)
    filters: list[int] = hparam(list(FILTERS), "channels of the five levels (fewer: fixtures)",
                                positive)


def lr_at(epoch: int, hp: HParams) -> float:
    """The reference's per-epoch LR: linear warm-up from ``init_lr``, then step decays; a decay
    at boundary b applies from epoch b + 1 (the reference steps its MultiStepLR after each
    epoch)."""
    if epoch <= hp.lr_warmup_epochs:
        return hp.init_lr + (hp.lr - hp.init_lr) * epoch / hp.lr_warmup_epochs
    decays = sum(1 for b in hp.lr_decay_epochs if b < epoch)
    return hp.lr * hp.lr_decay_factor ** decays


def _spatial_group(wl: Unet3DWorkload, g: int) -> None:
    world, depth = wl.env.world_size, wl.hp.input_shape[0]
    if g < 2 or world % g or depth % (32 * g):
        raise UserError(f"spatial-group={g} needs G >= 2 dividing the {world} ranks and 32 G "
                        f"dividing the patch depth {depth}")
    wl.impl.sg = spatial.new_spatial_group(g)


def _compile(wl: Unet3DWorkload, mode: str) -> None:
    if wl.sg:   # split by spatial-group, the model alone: the loss's collectives stay outside
        wl.model = maybe_compile(wl.model, mode)
    else:   # the forward and the loss as one graph
        wl.forward_loss = maybe_compile(wl._forward_loss, mode)


class Unet3DWorkload(Workload):
    name = constants.UNET3D
    targets = (Target("mean_dice", 0.908),)
    full_dataset = (KITS19_TRAIN, KITS19_EVAL)
    hparams = HParams
    train_stream = None   # the training batches' loaders.EpochStream, made at the first epoch
    # fp32 on the CPU, the tiny config's three steps: channels-last equal, fused-norm 6.6e-8 off
    optimisations = Registry(
        Optimisation("spatial-group", "=G: each sample's depth split over G ranks (G divides "
                     "the ranks, 32 G the patch depth), halo exchanges overlapped with the "
                     "interior convolutions, norm statistics and loss reduced over the group "
                     "(spatial.py)", select=_spatial_group, value_type=int, default=2,
                     compare=None, tested_by="tests/benchmarks/unet3d/test_spatial.py"),
        Optimisation("channels-last", "weights, activations and batches in channels_last_3d "
                     "memory", rtol=1e-6, select=lambda wl, _: setattr(
                         wl.impl, "memory_format", torch.channels_last_3d)),
        Optimisation("fused-norm", "instance norm + ReLU as two compiled kernels that read "
                     "either layout in place; the transposed convolutions' output gradients "
                     "dense (fused_norm.py)", rtol=1e-5, apply=lambda wl, _: fused_norm.fuse(
                         wl.net, wl.train_net, swaps=spatial.FUSED)),
        shared(COMPILE, apply=_compile, description="torch.compile the forward and the loss "
               "as one graph, under spatial-group the model alone (=MODE: default, tuned, "
               "max-autotune-no-cudagraphs)"),
        # GradScaler reads its overflow flag on the host: amp-fp16 cannot be captured
        shared(CUDA_GRAPH, precisions=("fp32", "tf32", "amp-bf16")),
        Optimisation("sharded-eval", "each case's sliding windows dealt over all ranks, one "
                     "all-reduce of the weighted logits a case (inference.py)",
                     compare=None, tested_by="tests/benchmarks/unet3d/test_spatial.py",
                     apply=lambda wl, _: setattr(
                         wl, "eval_shard", (wl.env.rank, wl.env.world_size))))

    def __init__(self, args: argparse.Namespace, env, precision):
        super().__init__(args, env, precision)
        hp = self.hp
        for flag, shape in (("--input-shape", hp.input_shape),
                            ("--val-input-shape", hp.val_input_shape)):
            if len(shape) != 3 or any(s % 2 ** 5 for s in shape):
                raise UserError(f"{flag} {shape}: need three sizes, each a multiple of 32 "
                                f"(the U-Net halves them five times)")
        if min(int(s * (1 - hp.overlap)) for s in hp.val_input_shape) < 1:
            raise UserError(f"--overlap {hp.overlap}: the window must step by a voxel or more")
        # the reference's until an optimisation's select() changes them
        self.impl.memory_format, self.impl.sg = torch.contiguous_format, None
        self.eval_shard = (0, 1)   # (rank, ranks) dealing the windows: each rank does all

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="folder of case_XXXXX_x.npy / case_XXXXX_y.npy (prepare_data.py)")
        p.add_argument("--workers", type=checked(int, non_negative), default=4,
                       help="loader processes per rank")

    # -- set-up ---------------------------------------------------------------------------
    def build(self) -> None:
        a, hp, env = self.args, self.hp, self.env
        self.train_cases, self.val_cases = ([], []) if self.synthetic else data.scan(a.data_dir)
        self.sg = self.impl.sg
        group = self.sg.size if self.sg else 1
        self.replicas, self.replica = env.world_size // group, env.rank // group
        self.train_set = data.TrainSet(self.train_cases, hp.input_shape, hp.oversampling, a.seed)
        if self.train_samples < self.global_batch_size:
            raise UserError(f"{a.data_dir}: {self.train_samples} training cases are fewer "
                            f"than one global batch ({self.global_batch_size})")
        if self.train_samples % self.global_batch_size:
            say(f"note: global batch {self.global_batch_size} does not divide "
                f"{self.train_samples} training cases; the remainder is dropped each epoch",
                env.is_main)
        self.eval_set: list | None = None  # read at the first evaluation, inside the timed run

        torch.manual_seed(a.seed)   # the same initial weights on every rank
        self.net = Unet3D(hp.filters).to(env.device, memory_format=self.impl.memory_format)
        cl = self.impl.memory_format == torch.channels_last_3d   # the batches' layout too
        self.layout = data.as_channels_last_3d if cl else (lambda images: images)
        self.train_net = spatial.spatial_parallel(self.net, self.sg) if self.sg else self.net
        self.model = dist.data_parallel(self.train_net, env)
        self.forward_loss = self._forward_loss
        self.lr = torch.full((), lr_at(1, hp), device=env.device)   # epoch_batches sets it
        self.optimizer = DeviceLRSGD(self.net.parameters(), lr=self.lr, momentum=hp.momentum,
                                     weight_decay=hp.weight_decay, nesterov=True)
        self.scaler = self.precision.grad_scaler()

    def _eval_case(self, case: data.Case) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = data.load(case)
        dev = self.env.device
        return torch.from_numpy(image)[None].to(dev), torch.from_numpy(label)[None].to(dev)

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (random device-resident tensors)"
        n_train, n_val = len(self.train_cases), len(self.val_cases)
        root = self.args.data_dir
        if fixture_cache.kind(root) == standin.KIND:
            return (f"stand-in: KiTS19's case sizes, random volumes from "
                    f"benchmarks.unet3d.standin, not KiTS19 ({n_train} train / {n_val} eval "
                    f"cases)")
        if fixture_cache.recorded(root) is not None:
            return (f"fixture: synthetic KiTS19-format volumes from benchmarks.unet3d.fixture, "
                    f"not KiTS19 ({n_train} train / {n_val} eval cases)")
        if (n_train, n_val) == (KITS19_TRAIN, KITS19_EVAL):
            return "kits19 (MLPerf preprocessed)"
        return f"KiTS19-format folder {root} ({n_train} train / {n_val} eval cases)"

    @property
    def global_batch_size(self) -> int:
        return self.hp.batch_size * self.replicas

    @property
    def train_samples(self) -> int:
        return KITS19_TRAIN if self.synthetic else len(self.train_cases)

    @property
    def eval_samples(self) -> int:
        return KITS19_EVAL if self.synthetic else len(self.val_cases)

    def hyperparameters(self) -> dict:
        a, c = self.hp, constants
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
        return self.hp.batch_size   # a spatial group's ranks each hold a slab of every sample

    @property
    def steps_per_epoch(self) -> int:
        return self.train_samples // self.global_batch_size   # the remainder is dropped

    def eval_points(self) -> list[EvalPoint]:
        """The reference's schedule: evaluate at ``start_eval_at``, then every ``evaluate_every``
        epochs, and at the cap."""
        a = self.hp
        epochs = list(range(min(a.start_eval_at, a.epochs), a.epochs + 1, a.evaluate_every))
        if epochs[-1] != a.epochs:
            epochs.append(a.epochs)
        return epoch_points(epochs, self.steps_per_epoch)

    @property
    def flops_per_sample(self) -> float:
        """Training FLOPs per sample (forward + backward) of the model on one patch."""
        return meta_train_flops(lambda: Unet3D(self.hp.filters), (1, *self.hp.input_shape))

    def capture_policy(self) -> CapturePolicy:
        return CapturePolicy("static", fp16=False)  # GradScaler reads its overflow flag on the host

    def training_state(self) -> list[torch.Tensor]:
        momenta = [s["momentum_buffer"] for s in self.optimizer.state.values()]
        return [*self.net.state_dict(keep_vars=True).values(), *momenta, self.lr,
                *grad_scaler_state(self.scaler, self.env.device)]

    # -- steps ----------------------------------------------------------------------------
    def epoch_batches(self, epoch: int):
        self.lr.fill_(lr_at(epoch, self.hp))
        if self.train_stream is None:
            # A batch's samples (keys (epoch, case)) are stacked in the loader process that
            # serves it; the same processes serve every epoch, so each meets (reads whole,
            # checks and searches) a case once a run. No pinned memory: the pinning thread's
            # CUDA calls would break the step's graph capture.
            batches = loaders.Batches(self.train_set, torch.utils.data.default_collate)
            self.train_stream = loaders.EpochStream(batches, self.epoch_order,
                                                    self.args.workers, pin=False)
        return _Batches(self, epoch)

    def epoch_order(self, epoch: int) -> list[list[tuple[int, int]]]:
        """This replica's batches of ``epoch`` (``data.epoch_order``)."""
        return data.epoch_order(len(self.train_cases), self.args.seed, epoch,
                                self.global_batch_size, self.replica, self.replicas)

    def close(self) -> None:
        if self.train_stream is not None:
            self.train_stream.close()

    def synthetic_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = data.synthetic_batch(batch_size, self.hp.input_shape, self.env.device)
        if self.sg:
            image, label = self.sg.slab(image).contiguous(), self.sg.slab(label).contiguous()
        return self.layout(image), label

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
        a, env = self.hp, self.env
        self.net.eval()
        scores = torch.zeros(NUM_CLASSES - 1, dtype=torch.float64, device=env.device)
        if self.eval_set is None:  # MLPerf: no data is touched before run_start; kept after
            self.eval_set = [self._eval_case(c) for c in self.val_cases]
        for image, label in self.eval_set:
            with self.precision.autocast():
                logits, crops = inference.sliding_window(
                    self.net, image, a.val_input_shape, a.overlap, NUM_CLASSES,
                    a.eval_batch_size, *self.eval_shard)
            scores += dice_score(logits, inference.crop(label, crops)).double()
        self.net.train()
        scores = scores / len(self.eval_set)
        return {"mean_dice": float(scores.mean()), "kidney_dice": float(scores[0]),
                "tumour_dice": float(scores[1])}


class _Batches:
    """One rank's training batches of an epoch, on the device (its depth slab when split)."""

    def __init__(self, wl: Unet3DWorkload, epoch: int):
        self.wl, self.epoch = wl, epoch

    def __len__(self) -> int:
        return len(self.wl.epoch_order(self.epoch))

    def __iter__(self):
        dev, sg = self.wl.env.device, self.wl.sg
        for image, label in self.wl.train_stream.epoch(self.epoch):
            if sg:
                image, label = sg.slab(image), sg.slab(label)
            image = self.wl.layout(image.to(dev, non_blocking=True).contiguous())
            yield image, label.to(dev, non_blocking=True).contiguous()
