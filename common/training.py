"""The time-to-train driver shared by every workload.

Follows the MLPerf training flow: ``init_start``, build, ``init_stop``,
``run_start``, blocks of epochs each closed by an evaluation, and ``run_stop``
with status ``success`` at the quality target or ``aborted`` at the epoch cap
or on any exception.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass

import torch

from common import dist
from common.cli import OneLineParser
from common.cuda_graph import GraphedStep
from common.errors import UserError, one_line
from common.metering import Throughput, peak_memory_bytes
from common.mllog import MLLog, constants
from common.precision import PRECISIONS, Precision
from common.progress import Progress, say
from common.workload import COMPILE_MODES, Workload

# mllog key naming what the run trained on (not an MLPerf key: the checker ignores it).
DATASET_KEY = "dataset"
EXIT_ABORTED = 1
EXIT_USER_ERROR = 2


def build_parser(workload_cls: type[Workload]) -> argparse.ArgumentParser:
    p = OneLineParser(prog=f"python -m benchmarks.{workload_cls.name}",
                      description=f"MLPerf {workload_cls.name}: train to the quality target.")
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    g.add_argument("--log-file", default=None, help="mllog output file (rank 0 writes it)")
    g.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    g.add_argument("--precision", default="amp-bf16", choices=PRECISIONS)
    g.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True,
                   help="capture the whole training step in one CUDA graph (CUDA only)")
    g.add_argument("--compile", default="none", choices=COMPILE_MODES,
                   help="torch.compile the model with this mode (none: eager kernels)")
    g.add_argument("--log-every", type=int, default=50, help="steps between loss read-backs")
    g.add_argument("--init-steps", type=_count, default=0,
                   help="before run_start, train this many steps on synthetic batches and run "
                        "one evaluation forward (compilation, autotuning, CUDA-graph capture), "
                        "then restore the initial training state; 0: off")
    s = p.add_argument_group("submission (mllog submission_* keys)")
    s.add_argument("--submission-org", default=os.environ.get("SUBMISSION_ORG", "unknown-org"))
    s.add_argument("--submission-platform",
                   default=os.environ.get("SUBMISSION_PLATFORM", "unknown-platform"))
    s.add_argument("--submission-division", default="closed", choices=("closed", "open"))
    s.add_argument("--submission-status", default="onprem",
                   choices=("onprem", "cloud", "preview", "research"))
    workload_cls.add_args(p.add_argument_group(workload_cls.name))
    return p


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def warm_up(wl: Workload, step: GraphedStep, steps: int, env) -> None:
    """Initialization before the clock: ``steps`` training steps on a synthetic batch and one
    evaluation forward, then every tensor of ``wl.training_state()`` and the CPU random
    state as they were before. The copies go back in place, so compiled code and a
    captured CUDA graph keep using the same tensors. MLPerf allows such work before
    ``run_start`` as long as it does not touch the dataset."""
    state = wl.training_state()
    saved = [t.detach().clone() for t in state]
    rng = torch.get_rng_state()
    batch = wl.synthetic_batch(wl.global_batch_size // env.world_size)
    for _ in range(steps):
        step(*batch)
    with torch.no_grad():
        wl.warm_up_eval()
        for t, copy in zip(state, saved):
            t.copy_(copy)
    torch.set_rng_state(rng)
    say(f"init: {steps} warm-up steps on synthetic batches, training state restored",
        env.is_main)


def _log_submission(log: MLLog, wl: type[Workload], args) -> None:
    log.event(constants.SUBMISSION_BENCHMARK, wl.name)
    log.event(constants.SUBMISSION_ORG, args.submission_org)
    log.event(constants.SUBMISSION_DIVISION, args.submission_division)
    log.event(constants.SUBMISSION_STATUS, args.submission_status)
    log.event(constants.SUBMISSION_PLATFORM, args.submission_platform)


def _train_epoch(wl: Workload, step: GraphedStep, epoch: int, log: MLLog, args, env) -> None:
    log.start(constants.EPOCH_START, metadata={constants.EPOCH_NUM: wl.epoch_num(epoch)})
    meter = Throughput(env.device)
    batches = wl.epoch_batches(epoch)
    label = f"{wl.unit_name} {wl.epoch_num(epoch)}"
    progress = Progress(len(batches), label, enabled=env.is_main)
    loss_sum = torch.zeros((), device=env.device)
    steps = 0
    meter.start()
    for batch in batches:
        loss_sum += step(*batch).detach().float()
        steps += 1
        if steps % args.log_every == 0:
            progress.update(args.log_every, loss=f"{loss_sum.item() / steps:.3f}")
    seconds = meter.stop(steps * wl.global_batch_size)
    progress.close()
    log.end(constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: wl.epoch_num(epoch)})
    if steps == 0:
        raise UserError(f"{label} had no training batch: the training set is smaller "
                        f"than one global batch ({wl.global_batch_size})")
    say(f"{label}: {steps} steps, {meter.samples_per_second:.1f} samples/s, "
        f"{seconds:.1f} s, mean loss {loss_sum.item() / steps:.4f}", env.is_main)


def run(wl: Workload, step: GraphedStep, log: MLLog, args, env) -> bool:
    """The timed part: returns True when the quality target was reached."""
    for block in wl.blocks():
        first, last = wl.epoch_num(block.first_epoch), wl.epoch_num(block.last_epoch)
        meta = {constants.FIRST_EPOCH_NUM: first,
                constants.EPOCH_COUNT: wl.epoch_count(block)}
        log.start(constants.BLOCK_START, metadata=meta)
        for epoch in block.epochs:
            _train_epoch(wl, step, epoch, log, args, env)
        log.start(constants.EVAL_START, metadata={constants.EPOCH_NUM: last})
        with torch.no_grad():
            quality = wl.evaluate()
        log.event(constants.EVAL_ACCURACY, quality, metadata={constants.EPOCH_NUM: last})
        log.end(constants.EVAL_STOP, metadata={constants.EPOCH_NUM: last})
        log.end(constants.BLOCK_STOP, metadata={constants.FIRST_EPOCH_NUM: first})
        say(f"eval after {wl.unit_name} {last}: {wl.quality_metric} {quality:.4f} "
            f"(target {wl.quality_target})", env.is_main)
        if quality >= wl.quality_target:
            return True
    return False


@dataclass(frozen=True)
class _Closing:
    """The workload facts the closing message prints after the process group is gone."""

    quality_metric: str
    quality_target: float
    dataset: str


def main(workload_cls: type[Workload], argv: list[str] | None = None) -> int:
    args = build_parser(workload_cls).parse_args(argv)
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    try:
        env = dist.init_distributed(args.device)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    log = MLLog(args.log_file, rank=env.rank)
    status, run_started, code = constants.ABORTED, False, EXIT_ABORTED
    t_run = 0.0
    wl = None
    try:
        log.event(constants.CACHE_CLEAR, True)
        log.start(constants.INIT_START)
        _log_submission(log, workload_cls, args)
        log.event(constants.SEED, args.seed)
        torch.manual_seed(args.seed + env.rank)
        precision = Precision(args.precision, env.device.type)
        precision.apply_backend_flags()
        torch.backends.cudnn.benchmark = env.device.type == "cuda"  # fixed shapes: autotune
        wl = workload_cls(args, env, precision)
        wl.build()
        log.event(DATASET_KEY, wl.dataset)
        log.event(constants.GLOBAL_BATCH_SIZE, wl.global_batch_size)
        log.event(constants.TRAIN_SAMPLES, wl.train_samples)
        log.event(constants.EVAL_SAMPLES, wl.eval_samples)
        for key, value in wl.hyperparameters().items():
            log.event(key, value)
        for name in wl.initialized_tensors():
            log.event(constants.WEIGHTS_INITIALIZATION, metadata={"tensor": name})
        say(f"{wl.name}: dataset {wl.dataset}; {env.world_size} process(es) on "
            f"{env.device.type}; precision {args.precision}; global batch {wl.global_batch_size}",
            env.is_main)
        step = GraphedStep(wl.train_step, enabled=args.cuda_graph and env.device.type == "cuda")
        if args.init_steps:
            warm_up(wl, step, args.init_steps, env)
        dist.barrier()
        log.end(constants.INIT_STOP)
        log.start(constants.RUN_START)
        run_started, t_run = True, time.perf_counter()
        reached = run(wl, step, log, args, env)
        status = constants.SUCCESS if reached else constants.ABORTED
        code = 0 if reached else EXIT_ABORTED
    except UserError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        code = EXIT_USER_ERROR
    except BaseException as exc:  # logged as aborted, then reported
        traceback.print_exc()
        print(f"error: run failed: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        code = EXIT_ABORTED
    finally:
        log.end(constants.RUN_STOP, metadata={constants.STATUS: status})
        log.close()
        # keep what the closing lines need, and no reference to the process groups
        wl = _Closing(wl.quality_metric, wl.quality_target, wl.dataset) if run_started else None
        dist.shutdown()
    if run_started and env.is_main:
        seconds = time.perf_counter() - t_run
        peak = peak_memory_bytes(env.device) / 2**30
        mem = f", peak device memory {peak:.2f} GiB" if env.device.type == "cuda" else ""
        if status == constants.SUCCESS:
            say(f"run_stop: success, {wl.quality_metric} target {wl.quality_target} reached "
                f"in {seconds:.1f} s on {wl.dataset}{mem}")
        else:
            say(f"run_stop: aborted, target {wl.quality_target} not reached "
                f"({seconds:.1f} s on {wl.dataset}){mem}")
    return code
