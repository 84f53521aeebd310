"""The contract between a benchmark and the shared drivers (time-to-train and throughput)."""

from __future__ import annotations

import abc
import argparse
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from common import dist
from common.dist import DistEnv
from common.errors import UserError
from common.hparams import from_args
from common.optimisations import Registry
from common.precision import Precision

COMPILE_MODES = ("none", "default", "tuned", "max-autotune-no-cudagraphs")
# compile modes of ours that are Inductor options over one of torch.compile's modes
_OPTION_MODES = {"tuned": ("default", {"coordinate_descent_tuning": True})}


def maybe_compile(fn: Callable, mode: str, dynamic: bool | None = None,
                  **inductor_options) -> Callable:
    """``torch.compile`` (Inductor-fused kernels) of a module or function unless ``mode``
    is ``none``; ``dynamic`` as ``torch.compile``'s; ``inductor_options`` (Inductor config
    names) are added to the mode's. ``tuned`` is ``default`` plus Inductor's coordinate-descent
    tuning: each generated kernel's block sizes are searched by timing it on its first call
    (a longer first step, no convolution autotuning).

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
    mode, options = _OPTION_MODES.get(mode, (mode, {}))
    inductor_options = {**options, **inductor_options}
    if inductor_options.get("coordinate_descent_tuning"):
        logging.getLogger("torch._inductor.runtime.triton_heuristics").addFilter(
            _skipped_tuning_config)
    if not inductor_options:
        return torch.compile(fn, mode=mode, dynamic=dynamic)
    from torch._inductor import list_mode_options

    return torch.compile(fn, dynamic=dynamic,
                         options={**list_mode_options(mode), **inductor_options})


def _skipped_tuning_config(record: logging.LogRecord) -> bool:
    """False for Inductor's log of a Triton compile failure. Coordinate-descent tuning tries
    block sizes that Triton 3.x sometimes fails to compile; Inductor logs each failure with
    the kernel's whole source, then the tuner skips that candidate (seen on the H100 with
    SSD's loss). A failure outside the tuning still raises."""
    return not str(record.msg).startswith("Triton compilation failed")


@dataclass(frozen=True)
class Target:
    """One quality threshold on a named metric of ``Workload.evaluate()``."""

    metric: str
    value: float
    higher_is_better: bool = True

    def met(self, metrics: Mapping[str, float]) -> bool:
        v = metrics[self.metric]
        return v >= self.value if self.higher_is_better else v <= self.value

    def __str__(self) -> str:
        return f"{self.metric} {'>=' if self.higher_is_better else '<='} {self.value}"


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation: after ``step`` optimizer steps in all, logged as ``epoch_num``.

    ``first_epoch_num`` and ``epoch_count`` describe the block of training that
    ends here (mllog ``block_start``), in the units ``epoch_num`` uses.
    """

    step: int
    epoch_num: float
    first_epoch_num: float
    epoch_count: float


def evaluation_epochs(period: int, offset: int, total_epochs: int) -> list[int]:
    """Evaluate after epoch ``offset + 1``, then every ``period`` epochs, and after the last.

    This is MLPerf's ResNet rule (period 4, a first evaluation offset of 0-3),
    and with ``offset = period - 1`` the plain every-``period``-epochs schedule.
    """
    if period < 1 or not 0 <= offset < period or total_epochs < 1:
        raise ValueError(f"bad evaluation schedule: period={period} offset={offset} "
                         f"epochs={total_epochs}")
    epochs = list(range(offset + 1, total_epochs + 1, period))
    return epochs if epochs[-1:] == [total_epochs] else [*epochs, total_epochs]


def epoch_points(eval_epochs: Sequence[int], steps_per_epoch: int) -> list[EvalPoint]:
    """Evaluations after whole 1-based epochs; a block runs from the epoch after the last
    evaluation (as the MLPerf references log ``first_epoch_num``)."""
    if list(eval_epochs) != sorted(set(eval_epochs)) or not eval_epochs or eval_epochs[0] < 1:
        raise ValueError(f"evaluation epochs must rise from 1 or more: {list(eval_epochs)}")
    points, prev = [], 0
    for e in eval_epochs:
        points.append(EvalPoint(e * steps_per_epoch, e, prev + 1, e - prev))
        prev = e
    return points


def interval_points(steps: Sequence[int], epoch_num: Callable[[int], float],
                    start: float = 0) -> list[EvalPoint]:
    """Evaluations after the given cumulative step counts, in a continuous unit such as
    samples trained (BERT) or fractional epochs (DLRM): ``epoch_num(step)``, which is
    ``start`` before the first step. A block starts where the previous one ended."""
    if list(steps) != sorted(set(steps)) or not steps or steps[0] < 1:
        raise ValueError(f"evaluation steps must rise from 1 or more: {list(steps)}")
    points, prev = [], start
    for s in steps:
        num = epoch_num(s)
        count = num - prev
        # fractional epochs: the difference of two rounded values, without float noise
        points.append(EvalPoint(s, num, prev, round(count, 9) if isinstance(count, float)
                                else count))
        prev = num
    return points


@dataclass(frozen=True)
class CapturePolicy:
    """How the training step may be captured as CUDA graphs.

    ``never``: the step reads data-dependent values or sizes (all-to-all splits,
    proposals), so it runs eagerly; ``static``: every batch has one shape, one
    graph; ``bucketed``: batches come in at most ``max_graphs`` shapes, one graph
    each (``eager_beyond``: further shapes run eagerly, else they are an error).
    ``fp16``: an amp-fp16 step keeps its loss-scaling checks on the device and can
    be captured.
    """

    mode: str = "static"
    max_graphs: int = 1
    fp16: bool = False
    eager_beyond: bool = False
    reason: str = ""    # why a step is never captured, for people

    def __post_init__(self):
        if self.mode not in ("never", "static", "bucketed"):
            raise ValueError(f"capture mode must be never, static or bucketed, not {self.mode!r}")
        if self.max_graphs < 1 or (self.mode == "static" and self.max_graphs != 1):
            raise ValueError(f"bad max_graphs {self.max_graphs} for capture mode {self.mode}")


class Workload(abc.ABC):
    """One MLPerf benchmark: its constants, model, data and steps.

    Subclasses set the class attributes and implement the methods; the
    drivers in ``common.training`` and ``common.bench`` do the rest.
    """

    name: str                      # mllog submission_benchmark, e.g. "resnet"
    targets: tuple[Target, ...]    # all must be met in one evaluation (has_reached_target)
    # module-level function: evaluation outputs (eval_outputs) -> metrics, picklable so that
    # it can run in a separate process while training goes on; None: evaluate() does all
    scorer: Callable[[Any], dict[str, float]] | None = None
    # --batch-size is the global batch (DLRM), not the per-rank one
    batch_size_is_global = False
    # False: the workload has no torch.compile path, and --compile is refused, not ignored
    compiles = True
    # the typed hyper-parameters (a dataclass of common.hparams fields; None: flags only)
    hparams: type | None = None
    # the optimisations over the reference path (empty: the run flags --compile, --cuda-graph)
    optimisations = Registry()
    # the real dataset's (training, evaluation) samples: a dry run's projection on a stand-in
    # fraction scales its steps and evaluation to them; None where the schedule counts samples
    full_dataset: tuple[int, int] | None = None
    # True where evaluations after the first reuse what the first kept (DLRM's cache-eval):
    # a dry run times a second evaluation, which the projection charges to the later ones
    keeps_eval_batches = False
    # the ruleset's names of the initialised tensors, in order (set by build())
    tensor_names: Sequence[str] = ()

    def __init__(self, args: argparse.Namespace, env: DistEnv, precision: Precision):
        mode = getattr(args, "compile", "none")
        if mode != "none" and not self.compiles:
            raise UserError(f"--compile {mode}: {self.name} has no torch.compile path; "
                            "leave --compile out")
        self.args, self.env, self.precision = args, env, precision
        # the optimisations named, {name: value} in order of application
        self.opts: dict[str, Any] = getattr(args, "optimisations", None) or {}
        self.optimisations.check_environment(self.opts, env.device.type, precision.name,
                                             env.world_size)
        self.hp = from_args(self.hparams, args) if self.hparams else None
        # implementations the optimisations' select() picked (the reference's where none)
        self.impl = argparse.Namespace()

    def setup(self) -> None:
        """The named optimisations' selections, ``build()``, then their transforms of the built
        parts, in the registry's order."""
        self.optimisations.select(self, self.opts)
        self.build()
        self.optimisations.apply(self, self.opts)

    @property
    def synthetic(self) -> bool:
        """``--synthetic-data``: built without a dataset, for throughput runs on
        device-resident synthetic batches (the time-to-train driver refuses it)."""
        return self.args.synthetic_data

    @staticmethod
    @abc.abstractmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        """Workload flags; defaults are the MLPerf reference values."""

    @abc.abstractmethod
    def build(self) -> None:
        """The reference path's model, optimizer, schedule, loss and data readers (called by
        ``setup()``, inside init_start/init_stop)."""

    @property
    @abc.abstractmethod
    def dataset(self) -> str:
        """What the run trains on, e.g. ``imagenet`` or ``fixture (...)``; logged and printed."""

    @property
    def global_batch_size(self) -> int:
        """Samples in one step over all ranks: the per-rank ``batch_size`` hyper-parameter times
        the world size (a workload whose batch flag is global overrides this)."""
        return self.hp.batch_size * self.env.world_size

    @property
    def rank_batch_size(self) -> int:
        """Samples in one step's batch on this rank (what ``synthetic_batch`` takes)."""
        return self.global_batch_size // self.env.world_size

    @property
    @abc.abstractmethod
    def train_samples(self) -> int: ...

    @property
    @abc.abstractmethod
    def eval_samples(self) -> int: ...

    @abc.abstractmethod
    def hyperparameters(self) -> dict:
        """mllog key -> value for every hyper-parameter the ruleset requires."""

    def initialized_tensors(self) -> Sequence[str]:
        """Tensor names for the ``weights_initialization`` events, as the ruleset lists them:
        ``tensor_names``, which ``build()`` sets."""
        return self.tensor_names

    # -- the schedule ---------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def steps_per_epoch(self) -> int | None:
        """Global steps in one epoch (``epoch_batches`` yields exactly these); None when the
        training data is one endless stream without epochs (``epoch_batches(1)``)."""

    @abc.abstractmethod
    def eval_points(self) -> list[EvalPoint]:
        """The evaluation schedule up to the cap (the last point)."""

    @abc.abstractmethod
    def epoch_batches(self, epoch: int) -> Iterable:
        """This rank's training batches of a 1-based epoch, on the device. A batch is a tuple
        of step arguments, each a tensor or any nesting of tuples, lists and dicts of them."""

    # -- steps ----------------------------------------------------------------------------
    @abc.abstractmethod
    def train_step(self, *batch) -> torch.Tensor:
        """One optimisation step; returns the loss as a device tensor."""

    def capture_policy(self) -> CapturePolicy:
        """How ``train_step`` may be captured as CUDA graphs (after ``build``)."""
        return CapturePolicy()

    @property
    def cudnn_benchmark(self) -> bool:
        """cuDNN autotuning: on where shapes repeat, off where every batch has another shape."""
        return True

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Every metric on the whole evaluation set (the same on every rank)."""
        if self.scorer is None:
            raise NotImplementedError(f"{self.name} defines neither evaluate() nor a scorer")
        outputs = self.eval_outputs()
        return dist.broadcast_object(self.scorer(outputs) if self.env.is_main else None)

    def eval_outputs(self) -> Any:
        """The part of evaluation that needs the model (forward passes), gathered on rank 0:
        what ``scorer`` takes there; None on the other ranks."""
        raise NotImplementedError(f"{self.name} has no separate scorer")

    def has_reached_target(self, metrics: Mapping[str, float]) -> bool:
        return all(t.met(metrics) for t in self.targets)

    def eval_accuracy(self, metrics: Mapping[str, float]) -> float | dict[str, float]:
        """The mllog ``eval_accuracy`` value: the target metric, or a dict of them when
        there are several (Mask R-CNN's ``{"BBOX": .., "SEGM": ..}``)."""
        if len(self.targets) == 1:
            return metrics[self.targets[0].metric]
        return {t.metric: metrics[t.metric] for t in self.targets}

    @classmethod
    def describe(cls, metrics: Mapping[str, float]) -> str:
        """Every metric with its target, for people."""
        goals = {t.metric: t for t in cls.targets}
        return ", ".join(f"{k} {v:.4f}" + (f" (target {goals[k].value})" if k in goals else "")
                         for k, v in metrics.items())

    # -- warm-up before the clock (--init-steps) ---------------------------------------------
    @abc.abstractmethod
    def training_state(self) -> list[torch.Tensor]:
        """Every tensor a training step changes: weights and buffers, optimizer and
        loss-scaler state, step and learning-rate tensors. ``--init-steps`` copies them
        before its warm-up steps and back, in place, after."""

    def warm_up_state(self, batches: list[tuple]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """``(tensor, rows)`` for every tensor of :meth:`training_state`: the rows (of dim 0)
        that training steps on ``batches`` can change, or None where any may change. The
        warm-up keeps a copy of only those rows; by default every tensor whole."""
        return [(t, None) for t in self.training_state()]

    def warm_up_eval(self) -> None:
        """Run the evaluation forward once on a synthetic batch, so that it compiles before
        the clock starts; by default nothing."""
        return None

    def close(self) -> None:
        """Stop what runs beside the step (loader processes); the driver calls it once,
        after ``run_stop``. By default nothing."""
        return None

    # -- throughput harness (common.bench) --------------------------------------------------
    flops_per_sample: float | None = None  # training FLOPs per sample (forward + backward)

    @classmethod
    def parse_bench_args(cls, parser: argparse.ArgumentParser, argv: list[str], data: str,
                         batch_size: int, world_size: int = 1) -> argparse.Namespace:
        """Flags for a throughput run with per-rank ``batch_size`` on ``synthetic`` data
        (device-resident batches, nothing read: ``--synthetic-data``) or ``real`` data
        (the training reader); ``argv`` holds the user's extra workload flags."""
        size = batch_size * world_size if cls.batch_size_is_global else batch_size
        pre = ["--batch-size", str(size)] + (["--synthetic-data"] if data == "synthetic" else [])
        return parser.parse_args(pre + argv)

    def synthetic_batch(self, batch_size: int) -> tuple:
        """A device-resident batch of this rank for throughput runs (never used for training)."""
        raise NotImplementedError(f"{self.name} has no synthetic batch")

    def warm_up_batches(self, batch_size: int) -> list[tuple]:
        """The synthetic batches ``--init-steps`` trains on in turn: by default one; a
        workload whose batches come in a few shapes gives one of each, so that the graphs
        of every shape are built before the clock."""
        return [self.synthetic_batch(batch_size)]

    def infer_step(self, *batch) -> torch.Tensor:
        """Forward pass only (evaluation mode, no gradients), for inference throughput."""
        raise NotImplementedError(f"{self.name} has no inference step")
