"""The contract between a benchmark and the shared drivers (time-to-train and throughput)."""

from __future__ import annotations

import abc
import argparse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from common.dist import DistEnv
from common.errors import UserError
from common.precision import Precision

COMPILE_MODES = ("none", "default", "max-autotune-no-cudagraphs")


def maybe_compile(fn: Callable, mode: str, **inductor_options) -> Callable:
    """``torch.compile`` (Inductor-fused kernels) of a module or function unless ``mode``
    is ``none``; ``inductor_options`` (Inductor config names) are added to the mode's.

    The compiled code still runs inside the whole-step CUDA graph; modes
    that add their own CUDA graphs are left out for that reason.

    AOTAutograd's on-disk cache is turned off: in torch 2.11 its key records
    whether autocast is on but not its dtype, so a model compiled under
    amp-bf16 was served to a later amp-fp16 run (measured on the H100;
    pytorch/pytorch#181564). Inductor's own cache, keyed on the traced graph
    with its casts, stays on.
    """
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, not {mode!r}")
    if mode == "none":
        return fn
    import torch._functorch.config as functorch_config

    functorch_config.enable_autograd_cache = False
    if not inductor_options:
        return torch.compile(fn, mode=mode)
    from torch._inductor import list_mode_options

    return torch.compile(fn, options={**list_mode_options(mode), **inductor_options})


@dataclass(frozen=True)
class Block:
    """Epochs trained between two evaluations (mllog ``block_start``/``block_stop``).

    Epoch numbers are 1-based, as the MLPerf references log them.
    """

    first_epoch: int
    epoch_count: int

    @property
    def epochs(self) -> range:
        return range(self.first_epoch, self.first_epoch + self.epoch_count)

    @property
    def last_epoch(self) -> int:
        return self.first_epoch + self.epoch_count - 1


def blocks_every(period: int, offset: int, total_epochs: int) -> list[Block]:
    """Evaluate after epoch ``offset + 1`` and then every ``period`` epochs, and after the last.

    This is MLPerf's ResNet rule (period 4, a first evaluation offset of 0-3),
    and with ``offset = period - 1`` the plain every-``period``-epochs schedule.
    """
    if period < 1 or not 0 <= offset < period or total_epochs < 1:
        raise ValueError(f"bad evaluation schedule: period={period} offset={offset} "
                         f"epochs={total_epochs}")
    blocks, first = [], 1
    end = min(offset + 1, total_epochs)
    while first <= total_epochs:
        blocks.append(Block(first, end - first + 1))
        first, end = end + 1, min(end + period, total_epochs)
    return blocks


class Workload(abc.ABC):
    """One MLPerf benchmark: its constants, model, data and steps.

    Subclasses set the class attributes and implement the methods; the
    drivers in ``common.training`` and ``common.bench`` do the rest.
    """

    name: str                 # mllog submission_benchmark, e.g. "resnet"
    quality_target: float     # reached when evaluate() >= this value
    quality_metric: str       # what evaluate() returns, for people ("top-1 accuracy")
    unit_name = "epoch"       # what one training unit (one epoch_batches call) is, for people
    # amp-fp16 steps keep the loss-scaling overflow check on the device (DeviceLossScaler),
    # so they can be captured in a CUDA graph
    fp16_graph_capturable = False

    def __init__(self, args: argparse.Namespace, env: DistEnv, precision: Precision):
        self.args, self.env, self.precision = args, env, precision

    @staticmethod
    @abc.abstractmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        """Workload flags; defaults are the MLPerf reference values."""

    @abc.abstractmethod
    def build(self) -> None:
        """Model, optimizer, schedule, loss and data readers; runs inside init_start/init_stop."""

    @property
    @abc.abstractmethod
    def dataset(self) -> str:
        """What the run trains on, e.g. ``imagenet`` or ``fixture (...)``; logged and printed."""

    @property
    @abc.abstractmethod
    def global_batch_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def train_samples(self) -> int: ...

    @property
    @abc.abstractmethod
    def eval_samples(self) -> int: ...

    @abc.abstractmethod
    def hyperparameters(self) -> dict:
        """mllog key -> value for every hyper-parameter the ruleset requires."""

    @abc.abstractmethod
    def initialized_tensors(self) -> Sequence[str]:
        """Tensor names for the ``weights_initialization`` events, as the ruleset lists them."""

    @abc.abstractmethod
    def blocks(self) -> list[Block]:
        """The evaluation schedule up to the epoch cap."""

    def epoch_num(self, unit: int) -> float:
        """The mllog ``epoch_num`` of a 1-based training unit.

        Units are epochs by default. Workloads that evaluate inside an epoch
        make a unit the stretch between evaluations and log what the reference
        logs (BERT: samples trained; DLRM: fractional epochs).
        """
        return unit

    def epoch_count(self, block: Block) -> float:
        """The mllog ``epoch_count`` of a block, in the units ``epoch_num`` logs."""
        return block.epoch_count

    @abc.abstractmethod
    def epoch_batches(self, epoch: int) -> Iterable[tuple[torch.Tensor, ...]]:
        """This rank's training batches for a 1-based epoch, already on the device."""

    @abc.abstractmethod
    def train_step(self, *batch: torch.Tensor) -> torch.Tensor:
        """One optimisation step; returns the loss as a device tensor. Must be capturable."""

    @abc.abstractmethod
    def evaluate(self) -> float:
        """The quality metric on the whole evaluation set (same value on every rank)."""

    # -- warm-up before the clock (--init-steps) ---------------------------------------------
    def training_state(self) -> list[torch.Tensor]:
        """Every tensor a training step changes: weights and buffers, optimizer and
        loss-scaler state, step and learning-rate tensors. ``--init-steps`` copies them
        before its warm-up steps and back, in place, after."""
        raise UserError(f"{self.name} does not support --init-steps: it does not list its "
                        f"training state (Workload.training_state)")

    def warm_up_eval(self) -> None:
        """Run the evaluation forward once on a synthetic batch, so that it compiles before
        the clock starts; by default nothing."""
        return None

    # -- throughput harness (common.bench) --------------------------------------------------
    flops_per_sample: float | None = None  # training FLOPs per sample (forward + backward)

    # the --data-dir value that builds the workload without a dataset, for synthetic runs
    synthetic_data_dir: str | None = None

    @classmethod
    def parse_bench_args(cls, parser: argparse.ArgumentParser, argv: list[str], data: str,
                         batch_size: int) -> argparse.Namespace:
        """Flags for a throughput run with per-rank ``batch_size`` on ``synthetic`` data
        (device-resident batches, nothing read) or ``real`` data (the training reader);
        ``argv`` holds the user's extra workload flags.

        By default ``--batch-size`` is the per-rank batch and synthetic runs pass
        ``synthetic_data_dir`` as ``--data-dir``; workloads whose flags differ override this.
        """
        pre = ["--batch-size", str(batch_size)]
        if data == "synthetic":
            if cls.synthetic_data_dir is None:
                raise UserError(f"{cls.name} has no synthetic mode for the harness: use "
                                f"python -m benchmarks.{cls.name}.throughput")
            pre += ["--data-dir", cls.synthetic_data_dir]
        return parser.parse_args(pre + argv)

    def synthetic_batch(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """A device-resident batch of this rank for throughput runs (never used for training)."""
        raise NotImplementedError(f"{self.name} has no synthetic batch")

    def infer_step(self, *batch: torch.Tensor) -> torch.Tensor:
        """Forward pass only (evaluation mode, no gradients), for inference throughput."""
        raise NotImplementedError(f"{self.name} has no inference step")
