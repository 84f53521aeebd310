"""The time-to-train driver shared by every workload.

Follows the MLPerf training flow: ``init_start``, build, ``init_stop``,
``run_start``, training blocks each closed by an evaluation on the workload's
schedule (``eval_points``), and ``run_stop`` with status ``success`` at the
quality target, or ``aborted`` at the cap, on a non-finite loss, on SIGTERM or
SIGINT, or on any exception.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import math
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import NoReturn

import torch

from common import dist, dry_run, gc_pauses, hparams, kernel_profile, optimisations, process_exit
from common.cli import OneLineParser
from common.cuda_graph import GraphedStep, graphed_step
from common.errors import UserError, one_line
from common.metering import Throughput, peak_memory_bytes
from common.mllog import MLLog, constants
from common.precision import PRECISIONS, Precision
from common.progress import Progress, say
from common.scoring import BackgroundScorer
from common.stalls import StallWatch
from common.streams import work_stream
from common.workload import COMPILE_MODES, EvalPoint, Workload

# mllog key naming what the run trained on (not an MLPerf key: the checker ignores it).
DATASET_KEY = "dataset"
EXIT_ABORTED = 1
EXIT_USER_ERROR = 2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
MAX_SEED = 2**31 - 1   # numpy's and the MLPerf reference implementations' seeds are 32-bit


class Stopped(BaseException):
    """A signal (preemption, ``scancel``, a time limit, Ctrl-C) ended the run."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class NonFiniteLoss(Exception):
    pass


_handling_pid = 0   # the process that installed the handlers (not a child forked from it)
_stopped_by = 0     # the stop signal received, 0 before one
_chld_at_stop = None   # the SIGCHLD handler the stop set aside


@contextlib.contextmanager
def handling_signals(handler):
    """SIGTERM and SIGINT go to ``handler`` (a function or ``signal.SIG_IGN``) inside."""
    global _handling_pid, _stopped_by
    _handling_pid, _stopped_by = os.getpid(), 0
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_unraisable, hook)
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for s, h in previous.items():
            signal.signal(s, h)
        if _stopped_by:   # the handler the stop set aside (torch's, if a loader had set it)
            signal.signal(signal.SIGCHLD, _chld_at_stop)


def _unraisable(hook, unraisable) -> None:
    """A ``Stopped`` that Python drops (raised where it calls back on its own: a fork's
    handlers, a ``__del__``) is remembered for :func:`raise_if_stopped`, not printed with a
    traceback; anything else goes to ``hook``."""
    if not isinstance(unraisable.exc_value, Stopped):
        hook(unraisable)


def _child_ended(signum, frame):
    """SIGCHLD once the run is stopping: a loader process's end is expected."""


def _stop(signum, frame):
    """Raise ``Stopped`` once; later signals are ignored, so that they cannot cut the
    closing log lines short. Processes forked from the trainer inherit this handler (torch's
    loader processes replace it: ``common.loaders.quiet_on_stop`` does the same there):
    there SIGINT (a Ctrl-C reaches the whole process group) is ignored, as the trainer
    stops them, and SIGTERM (a scheduler's reaches the whole group too) ends them quietly,
    with status 0: raised there, or killed by it, the trainer would see a loader process
    fail instead of its own stop. The signal is also remembered for
    :func:`raise_if_stopped`."""
    global _stopped_by, _chld_at_stop
    if os.getpid() != _handling_pid:   # a forked process: Ctrl-C ignored, SIGTERM ends it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if signum == signal.SIGTERM:
            os._exit(0)
        return
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    # The loader processes the same signal ended are no failure now: torch's SIGCHLD handler
    # would raise one for each, over the stop or in the middle of the closing lines. A
    # handler that does nothing, not SIG_DFL: a SIGCHLD already caught for torch's would
    # then be reported as 'ignored due to race condition', with a traceback.
    _chld_at_stop = signal.signal(signal.SIGCHLD, _child_ended)
    _stopped_by = signum
    raise Stopped(signum)


def raise_if_stopped() -> None:
    """``Stopped`` again for a stop signal whose first one was lost: Python prints and drops
    an exception raised where it calls back into Python code on its own (a garbage-collector
    callback, a ``__del__``), and later signals are ignored. The training loop calls this
    after every step and evaluation."""
    if _stopped_by:
        raise Stopped(_stopped_by)


class WorkloadParser(OneLineParser):
    """The driver's parser: after parsing, ``--optimisations`` is resolved against the
    workload's registry (``common.optimisations.resolve``)."""

    def __init__(self, *a, registry=None, **kw):
        super().__init__(*a, **kw)
        self.registry = registry

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        if self.registry is not None:
            optimisations.resolve(self, self.registry, ns)
        return ns, rest


def build_parser(workload_cls: type[Workload]) -> argparse.ArgumentParser:
    registry = workload_cls.optimisations if len(workload_cls.optimisations) else None
    p = WorkloadParser(prog=f"python -m benchmarks.{workload_cls.name}", registry=registry,
                       description=f"MLPerf {workload_cls.name}: train to the quality target.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=_seed, default=None,
                   help=f"random seed, 0 to {MAX_SEED} (default: fresh)")
    g.add_argument("--log-file", default=None, help="mllog output file (rank 0 writes it)")
    g.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    g.add_argument("--precision", default="amp-bf16", choices=PRECISIONS)
    if registry is None:   # a workload without a registry: the speed-ups as run flags
        g.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True,
                       help="capture the whole training step in one CUDA graph (CUDA only)")
        g.add_argument("--compile", default="none", choices=COMPILE_MODES,
                       help="torch.compile the model with this mode (none: eager kernels)")
    g.add_argument("--log-every", type=hparams.checked(int, hparams.positive), default=50,
                   help="steps between loss read-backs (non-finite loss checks, progress)")
    g.add_argument("--synthetic-data", action="store_true",
                   help="throughput tools only: build without a dataset and step on "
                        "device-resident synthetic batches (a time-to-train run refuses it)")
    g.add_argument("--background-scoring", action="store_true",
                   help="score evaluations in a separate process while training goes on "
                        "(workloads with a scorer, e.g. COCO evaluation)")
    g.add_argument("--init-steps", type=hparams.checked(int, hparams.non_negative), default=0,
                   help="before run_start, train this many steps on synthetic batches and run "
                        "one evaluation forward (compilation, autotuning, CUDA-graph capture), "
                        "then restore the initial training state; 0: off")
    g.add_argument("--bind-cpus", action="store_true",
                   help="bind each rank to its own share of its GPU's NUMA-local CPU cores, "
                        "loader processes included (common/cpu_binding.py)")
    g.add_argument("--dry-run", type=hparams.checked(int, hparams.positive), default=None,
                   metavar="STEPS",
                   help="train STEPS steps, each timed, then one full evaluation pass, and "
                        "report initialization, step p50/p99, p_whole/p_train/p_core and peak "
                        "memory instead of training to the target; the log is marked as a dry "
                        "run and never passes for a result (common/dry_run.py)")
    g.add_argument("--dry-run-profile", type=hparams.checked(int, hparams.positive), default=None,
                   metavar="STEPS",
                   help="with --dry-run on a GPU, STEPS more steps under the profiler after the "
                        "timed ones: GPU kernel time by family, the device timeline's busy and "
                        "idle time per step and the host operations the GPU waited on "
                        "(common/kernel_profile.py)")
    g.add_argument("--gc-freeze", action="store_true",
                   help="before run_start, freeze every object setup made out of the garbage "
                        "collector's reach, so its full collections stay short "
                        "(common/gc_pauses.py)")
    s = p.add_argument_group("submission (mllog submission_* keys)")
    s.add_argument("--submission-org", default=os.environ.get("SUBMISSION_ORG", "unknown-org"))
    s.add_argument("--submission-platform",
                   default=os.environ.get("SUBMISSION_PLATFORM", "unknown-platform"))
    s.add_argument("--submission-division", default="closed", choices=("closed", "open"))
    s.add_argument("--submission-status", default="onprem",
                   choices=("onprem", "cloud", "preview", "research"))
    workload_cls.add_args(p.add_argument_group(f"run: {workload_cls.name}"))
    if workload_cls.hparams is not None:
        hparams.add_args(p.add_argument_group(
            "hyper-parameters (defaults: the MLPerf reference's)"), workload_cls.hparams)
    if registry is not None:
        optimisations.add_args(p, registry)
    return p


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be 0 to {MAX_SEED}, not {value}")
    return value


def warm_up(wl: Workload, step: GraphedStep, steps: int, env) -> None:
    """Initialization before the clock: ``steps`` training steps on synthetic batches (the
    workload's ``warm_up_batches`` in turn) and one evaluation forward, then every tensor of
    ``wl.training_state()`` and the CPU and CUDA random states as they were before. The
    copies (of only the rows the steps can change, ``wl.warm_up_state``) wait in host memory
    (a training state can be most of the device's: DLRM's tables) and go back in place, so
    compiled code and a captured CUDA graph keep using the same tensors. MLPerf allows such
    work before ``run_start`` as long as it does not touch the dataset."""
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state() if env.device.type == "cuda" else None
    batches = wl.warm_up_batches(wl.rank_batch_size)
    state = wl.warm_up_state(batches)
    with torch.no_grad():
        saved = [(t if rows is None else t.index_select(0, rows)).to("cpu", copy=True)
                 for t, rows in state]
    for i in range(steps):
        step(*batches[i % len(batches)])
    with torch.no_grad():
        wl.warm_up_eval()
        for (t, rows), copy in zip(state, saved):
            if rows is None:
                t.copy_(copy)
            else:
                t.index_copy_(0, rows, copy.to(t.device))
    torch.set_rng_state(rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng)
    say(f"init: {steps} warm-up steps on synthetic batches, training state restored",
        env.is_main)


def _log_submission(log: MLLog, wl: type[Workload], args) -> None:
    log.event(constants.SUBMISSION_BENCHMARK, wl.name)
    log.event(constants.SUBMISSION_ORG, args.submission_org)
    log.event(constants.SUBMISSION_DIVISION, args.submission_division)
    log.event(constants.SUBMISSION_STATUS, args.submission_status)
    log.event(constants.SUBMISSION_PLATFORM, args.submission_platform)


def log_workload(log: MLLog, wl: Workload) -> None:
    """The built workload's facts: dataset, sizes, hyper-parameters, initialized tensors."""
    log.event(DATASET_KEY, wl.dataset)
    log.event(constants.GLOBAL_BATCH_SIZE, wl.global_batch_size)
    log.event(constants.TRAIN_SAMPLES, wl.train_samples)
    log.event(constants.EVAL_SAMPLES, wl.eval_samples)
    for key, value in wl.hyperparameters().items():
        log.event(key, value)
    for name in wl.initialized_tensors():
        log.event(constants.WEIGHTS_INITIALIZATION, metadata={"tensor": name})


class _Stream:
    """The training batches across epochs as one stream, with the mllog epoch events
    (none for a workload without epochs)."""

    def __init__(self, wl: Workload, log: MLLog):
        self.wl, self.log = wl, log
        self.per_epoch = wl.steps_per_epoch
        self.epoch = self.in_epoch = 0
        self._batches = None

    def next(self):
        if self._batches is None:
            self.epoch += 1
            if self.per_epoch:
                self.log.start(constants.EPOCH_START, metadata={constants.EPOCH_NUM: self.epoch})
            self._batches, self.in_epoch = iter(self.wl.epoch_batches(self.epoch)), 0
        try:
            return next(self._batches)
        except StopIteration:
            raise RuntimeError(f"epoch {self.epoch} ended after {self.in_epoch} batches; "
                               f"steps_per_epoch is {self.per_epoch}") from None

    def stepped(self) -> None:
        self.in_epoch += 1
        if self.per_epoch and self.in_epoch == self.per_epoch:
            self.log.end(constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: self.epoch})
            self._batches = None


class _LossWindow:
    """The losses since the last read-back, kept on the device (one copy per step, no host
    synchronisation); read back every ``--log-every`` steps to check they are finite."""

    def __init__(self, size: int, device: torch.device):
        self.values = torch.zeros(size, device=device)
        self.epochs = [0] * size   # the epoch of each step's batch
        self.first_step, self.count, self.total, self.read = 0, 0, 0.0, 0

    def add(self, loss: torch.Tensor, step: int, epoch: int) -> None:
        if self.count == 0:
            self.first_step = step
        self.epochs[self.count] = epoch
        self.values[self.count] = loss.detach().float().reshape(())
        self.count += 1

    def read_back(self) -> None:
        """Add the window to the running total; raise at the first non-finite loss."""
        losses = self.values[:self.count].tolist()
        for i, v in enumerate(losses):
            if not math.isfinite(v):
                raise NonFiniteLoss(f"the training loss became non-finite ({v}) at step "
                                    f"{self.first_step + i} (epoch {self.epochs[i]}): lower "
                                    f"the learning rate or check the data")
        self.total += sum(losses)
        self.read += self.count
        self.count = 0

    @property
    def mean(self) -> float:
        return self.total / max(self.read, 1)


@dataclass
class _Outcome:
    reached: bool = False
    metrics: dict | None = None     # the last metrics that arrived


def _evaluated(wl: Workload, log: MLLog, env, point: EvalPoint, metrics: dict,
               outcome: _Outcome, late: bool = False) -> bool:
    """Log and print one evaluation's metrics; True when they meet the target."""
    if late:
        log.event(constants.EVAL_ACCURACY, wl.eval_accuracy(metrics),
                  metadata={constants.EPOCH_NUM: point.epoch_num})
    outcome.metrics = metrics
    outcome.reached = wl.has_reached_target(metrics)
    where = "scored in the background" if late else "eval"
    say(f"{where} at epoch_num {point.epoch_num}: {wl.describe(metrics)}", env.is_main)
    return outcome.reached


def _train_block(wl: Workload, step, stream: _Stream, point: EvalPoint, done: int, args,
                 env, log: MLLog, scorer: BackgroundScorer | None, outcome: _Outcome) -> bool:
    """Train from ``done`` steps up to ``point.step``; True when a background result that
    arrived meanwhile met the target (the run stops there)."""
    steps = point.step - done
    label = f"training to epoch_num {point.epoch_num}"
    progress = Progress(steps, label, enabled=env.is_main)
    window = _LossWindow(args.log_every, env.device)
    meter = Throughput(env.device)
    meter.start()
    with gc_pauses.PauseMeter() as pauses:
        for n in range(1, steps + 1):
            window.add(step(*stream.next()), done + n, stream.epoch)
            stream.stepped()
            raise_if_stopped()
            if n % args.log_every == 0 or n == steps:
                window.read_back()
                progress.update(window.read - progress.n, loss=f"{window.mean:.3f}")
                if scorer and any(_evaluated(wl, log, env, p, m, outcome, late=True)
                                  for p, m in scorer.poll()):
                    progress.close()
                    return True
    seconds = meter.stop(steps * wl.global_batch_size)
    progress.close()
    gc = pauses.summary()
    say(f"{label}: {steps} steps, {meter.samples_per_second:.1f} samples/s, {seconds:.1f} s, "
        f"mean loss {window.mean:.4f}, garbage-collector pauses {gc['ms']:.0f} ms "
        f"({gc['full']} full collections)", env.is_main)
    return False


def run(wl: Workload, step, log: MLLog, args, env,
        scorer: BackgroundScorer | None = None) -> _Outcome:
    """The timed part: train and evaluate on the workload's schedule until the target."""
    stream, done, outcome = _Stream(wl, log), 0, _Outcome()
    for point in wl.eval_points():
        log.start(constants.BLOCK_START, metadata={constants.FIRST_EPOCH_NUM: point.first_epoch_num,
                                                   constants.EPOCH_COUNT: point.epoch_count})
        if _train_block(wl, step, stream, point, done, args, env, log, scorer, outcome):
            return outcome
        done = point.step
        at = {constants.EPOCH_NUM: point.epoch_num}
        t_eval = time.perf_counter()
        log.start(constants.EVAL_START, metadata=at)
        with torch.no_grad():
            if scorer:
                scorer.submit(point, wl.eval_outputs())
                metrics = None
            else:
                metrics = wl.evaluate()
                log.event(constants.EVAL_ACCURACY, wl.eval_accuracy(metrics), metadata=at)
        log.end(constants.EVAL_STOP, metadata=at)
        seconds = time.perf_counter() - t_eval
        say(f"evaluation at epoch_num {point.epoch_num}: {wl.eval_samples} samples, "
            f"{seconds:.2f} s, {wl.eval_samples / seconds:.1f} samples/s"
            f"{' (forward passes; scored in the background)' if scorer else ''}", env.is_main)
        log.end(constants.BLOCK_STOP, metadata={constants.FIRST_EPOCH_NUM: point.first_epoch_num})
        raise_if_stopped()
        if metrics is not None and _evaluated(wl, log, env, point, metrics, outcome):
            return outcome
    while scorer and scorer.pending:   # at the cap: the results still being scored decide
        raise_if_stopped()
        if any(_evaluated(wl, log, env, p, m, outcome, late=True)
               for p, m in scorer.poll(block=True)):
            return outcome
    return outcome


@dataclass(frozen=True)
class _Closing:
    """The workload facts the closing message prints after the process group is gone."""

    targets: str
    dataset: str
    metrics: str


def _prepare_step(wl: Workload, args, env):
    """The training step under the workload's capture policy, and the scorer process."""
    if wl.global_batch_size < 1:
        raise UserError(f"{wl.name}: --batch-size must be 1 or more (the global batch is "
                        f"{wl.global_batch_size})")
    if wl.steps_per_epoch is not None and wl.steps_per_epoch < 1:
        raise UserError(f"{wl.name}: the training set ({wl.train_samples} samples) is smaller "
                        f"than one global batch ({wl.global_batch_size}): lower --batch-size")
    if args.background_scoring and wl.scorer is None:
        raise UserError(f"{wl.name} scores its evaluation in the training processes (it has "
                        f"no scorer): drop --background-scoring")
    torch.backends.cudnn.benchmark = env.device.type == "cuda" and wl.cudnn_benchmark
    policy = wl.capture_policy()
    step = graphed_step(wl.train_step, policy, args.cuda_graph, env.device, args.precision,
                        wl.name)
    if args.cuda_graph and env.device.type == "cuda" and policy.mode == "never":
        say(f"{wl.name}: the training step is not captured as a CUDA graph ({policy.reason})",
            env.is_main)
    return step


def _report_user_error(message: str, rank: int) -> int:
    """Bad input, in one line from one process. Under torchrun every rank leaves it in the
    error file torchrun gives it, and the launcher prints the first failure's
    (``common.launch``); otherwise rank 0 prints it (every rank sees the same input). A stop
    signal from now on is ignored: torchrun's SIGTERM, sent once a peer has reported the same
    input, would otherwise end this report halfway, with a traceback."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    dist.mark_failed()
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
        ErrorHandler().record_exception(UserError(message))
    elif rank == 0:
        print(f"error: {message}", file=sys.stderr)
    return EXIT_USER_ERROR


def _parse_args(workload_cls: type[Workload], argv: list[str] | None, rank: int):
    """The driver's arguments; a bad flag raises ``SystemExit(2)`` after
    :func:`_report_user_error` has reported the parser's one line."""
    parser = build_parser(workload_cls)
    quiet = rank != 0 or os.environ.get("TORCHELASTIC_ERROR_FILE")
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured) if quiet else contextlib.nullcontext():
            args = parser.parse_args(argv)
            if args.synthetic_data:
                parser.error("--synthetic-data is for throughput runs (python -m common.bench, "
                             f"python -m benchmarks.{workload_cls.name}.throughput): a "
                             "time-to-train run needs --data-dir")
            if getattr(args, "data_dir", True) is None:
                parser.error("--data-dir is required: the dataset's folder (docs/data.md)")
            if args.dry_run_profile and not args.dry_run:
                parser.error("--dry-run-profile profiles steps after a dry run's: add "
                             "--dry-run STEPS (DRY_RUN=STEPS)")
    except SystemExit as exc:
        if quiet and exc.code == EXIT_USER_ERROR:
            _report_user_error(captured.getvalue().strip(), rank)
        raise
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little") & MAX_SEED
    return args


def _ended_by(exc: BaseException, rank: int, logged: bool) -> int:
    """Report what ended the run, in one line (with a traceback for a failure); its exit
    status. A stop signal wins over what failed after it: a loader process or a peer rank
    that the same signal ended, a collective cut short. Under ``common.launch``, a worker
    stopped or failing after a peer failed (torchrun's SIGTERM, a collective cut short) says
    nothing: the launcher reports the peer's failure, the cause."""
    signum = _stopped_by or (exc.signum if isinstance(exc, Stopped) else 0)
    if signum:
        if rank == 0 and not dist.peer_failed():
            print(f"error: run stopped by {signal.Signals(signum).name}"
                  f"{': run_stop logged as aborted' if logged else ' before its log began'}",
                  file=sys.stderr)
        return 128 + signum
    if isinstance(exc, UserError):
        return _report_user_error(one_line(exc), rank)
    if dist.peer_failed():
        return EXIT_ABORTED
    dist.mark_failed()
    if isinstance(exc, NonFiniteLoss):
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ABORTED
    traceback.print_exc()
    print(f"error: run failed: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
    return EXIT_ABORTED


def main(workload_cls: type[Workload], argv: list[str] | None = None) -> int:
    """Parse, join the process group and run; the stop signals are handled from the start,
    so a SIGINT or SIGTERM at any moment ends the run (with ``run_stop`` aborted once its
    log has begun) and exits 128 + its number."""
    rank = dist.launcher_rank()
    with handling_signals(_stop):
        try:
            dist.follow_launcher()
            args = _parse_args(workload_cls, argv, rank)
            env = dist.init_distributed(args.device, bind_cpus=args.bind_cpus)
            if args.dry_run_profile and env.device.type != "cuda":
                raise UserError("--dry-run-profile profiles GPU kernels: drop it on the CPU")
        except (UserError, Stopped) as exc:
            return _ended_by(exc, rank, logged=False)
        with work_stream(env.device):
            return _run_logged(workload_cls, args, env)


def program(workload_cls: type[Workload]) -> NoReturn:
    """``python -m benchmarks.<name>``: :func:`main` on the command line's flags, then the
    process ended at once, its helper processes with it (``common.process_exit``)."""
    process_exit.end(main(workload_cls))


def _steps(stream: _Stream, step, count: int) -> None:
    """``count`` training steps on the stream's next batches (their losses unread)."""
    for _ in range(count):
        step(*stream.next())
        stream.stepped()
        raise_if_stopped()


def _dry_run(wl: Workload, step, log: MLLog, args, env, init_s: float) -> None:
    """``--dry-run``: the steps asked for, each timed (``dry_run.StepClock``), then one full
    evaluation pass; the report goes to the log and the console."""
    stream, window = _Stream(wl, log), _LossWindow(args.dry_run, env.device)
    cuda = env.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else lambda: None
    step_s, wait_s = [], []
    note = dry_run.short_epoch_note(wl.train_samples, wl.full_dataset)
    if note:
        say(note, env.is_main)
    progress = Progress(args.dry_run, "dry run", enabled=env.is_main)
    slow_lines = 0

    def record(times):
        nonlocal slow_lines
        for step, wait in times:
            step_s.append(step)
            wait_s.append(wait)
            if dry_run.slow(step_s) and slow_lines < dry_run.SLOW_LINES:
                slow_lines += 1
                say(dry_run.slow_step_line(len(step_s), step, wait, watch.compiles,
                                           watch.spawned), env.is_main)
            progress.update(1, step_ms=f"{step * 1e3:.1f}")

    with StallWatch() as watch:   # what compiled or started a process in each step
        clock = dry_run.StepClock(cuda)
        for n in range(1, args.dry_run + 1):
            watch.begin(n, None)
            batch = stream.next()
            clock.input_ready()
            window.add(step(*batch), n, stream.epoch)
            stream.stepped()
            watch.end()
            record(clock.step_queued())
            raise_if_stopped()
        record(clock.finish())
    progress.close()
    if args.dry_run_profile:
        say(f"dry run: {args.dry_run_profile} more steps profiled, not timed above (the "
            "profiler slows the host: its idle times read high)", env.is_main)
        say(kernel_profile.profiled(lambda: _steps(stream, step, args.dry_run_profile),
                                    args.dry_run_profile), env.is_main)
    window.read_back()
    # the steps' figures before the evaluation, which a stop may cut short
    say(f"dry run: {len(step_s)} steps, step p50 {dry_run.percentile(step_s, 50) * 1e3:.2f} ms, "
        f"input wait p50 {dry_run.percentile(wait_s, 50) * 1e3:.2f} ms; evaluating "
        f"{wl.eval_samples} samples", env.is_main)
    at = {constants.EPOCH_NUM: stream.epoch}
    log.start(constants.EVAL_START, metadata=at)
    t_eval = time.perf_counter()
    with torch.no_grad():
        metrics = wl.evaluate()
    sync()
    eval_s = time.perf_counter() - t_eval
    log.event(constants.EVAL_ACCURACY, wl.eval_accuracy(metrics), metadata=at)
    log.end(constants.EVAL_STOP, metadata=at)
    eval_again_s = None
    if wl.keeps_eval_batches:   # the later evaluations' time (not logged as one)
        t_eval = time.perf_counter()
        with torch.no_grad():
            wl.evaluate()
        sync()
        eval_again_s = time.perf_counter() - t_eval
    report = dry_run.Report.measure(
        step_s, wait_s, global_batch_size=wl.global_batch_size,
        steps_per_epoch=wl.steps_per_epoch, init_s=init_s, eval_s=eval_s,
        eval_samples=wl.eval_samples, peak_device_bytes=peak_memory_bytes(env.device),
        peak_host_bytes=dry_run.peak_host_bytes(),
        eval_points=[[p.step, p.epoch_num] for p in wl.eval_points()],
        train_samples=wl.train_samples,
        full_dataset=list(wl.full_dataset) if wl.full_dataset else None,
        eval_again_s=eval_again_s)
    log.event(dry_run.REPORT_KEY, report.as_dict())
    for line in report.lines():
        say(line, env.is_main)


def _run_logged(workload_cls: type[Workload], args, env) -> int:
    """The logged run, ``run_stop`` whatever ends it, then the closing line."""
    status, run_started, code = constants.ABORTED, False, EXIT_ABORTED
    t_run = t_init = 0.0
    log = wl = scorer = step = None
    outcome = _Outcome()
    try:
        log = MLLog(args.log_file, rank=env.rank)
        log.event(constants.CACHE_CLEAR, True)
        t_init = time.perf_counter()
        log.start(constants.INIT_START)
        if args.dry_run:
            log.event(dry_run.DRY_RUN_KEY, args.dry_run)
        _log_submission(log, workload_cls, args)
        log.event(constants.SEED, args.seed)
        torch.manual_seed(args.seed + env.rank)
        precision = Precision(args.precision, env.device.type)
        precision.apply_backend_flags()
        wl = workload_cls(args, env, precision)
        wl.setup()
        log_workload(log, wl)
        say(f"{wl.name}: dataset {wl.dataset}; {env.world_size} process(es) on "
            f"{env.device.type}; precision {args.precision}; global batch "
            f"{wl.global_batch_size}", env.is_main)
        step = _prepare_step(wl, args, env)
        if args.init_steps:
            warm_up(wl, step, args.init_steps, env)
        if args.background_scoring and not args.dry_run:
            scorer = BackgroundScorer(type(wl).scorer, env)
        if args.gc_freeze:
            gc_pauses.freeze()
        dist.barrier()
        log.end(constants.INIT_STOP)
        log.start(constants.RUN_START)
        run_started, t_run = True, time.perf_counter()
        if args.dry_run:
            _dry_run(wl, step, log, args, env, init_s=t_run - t_init)
            code = 0   # status stays aborted: a dry run is no result
        else:
            outcome = run(wl, step, log, args, env, scorer)
            status = constants.SUCCESS if outcome.reached else constants.ABORTED
            code = 0 if outcome.reached else EXIT_ABORTED
    except BaseException as exc:  # logged as aborted, then reported
        code = _ended_by(exc, env.rank, logged=log is not None)
    finally:
        for s in STOP_SIGNALS:   # a signal now would cut run_stop off
            signal.signal(s, signal.SIG_IGN)
        if scorer is not None:
            scorer.close()
        if log is not None:
            log.end(constants.RUN_STOP, metadata={constants.STATUS: status})
            log.close()
        if wl is not None:
            wl.close()
        if step is not None:
            step.release()
        # keep what the closing lines need, and no reference to the process groups
        wl = (_Closing(", ".join(map(str, wl.targets)), wl.dataset,
                       wl.describe(outcome.metrics) if outcome.metrics else "none")
              if run_started else None)
        dist.shutdown()
    if run_started and env.is_main and args.dry_run and code == 0:
        say(f"dry run: done, its log is no result ({args.log_file or 'no log file'}; "
            f"python -m compliance.projection LOG projects a time-to-train)")
    elif run_started and env.is_main:
        seconds = time.perf_counter() - t_run
        peak = peak_memory_bytes(env.device) / 2**30
        mem = f", peak device memory {peak:.2f} GiB" if env.device.type == "cuda" else ""
        if status == constants.SUCCESS:
            say(f"run_stop: success, target {wl.targets} reached in {seconds:.1f} s on "
                f"{wl.dataset}; last evaluation: {wl.metrics}{mem}")
        else:
            say(f"run_stop: aborted, target {wl.targets} not reached ({seconds:.1f} s on "
                f"{wl.dataset}); last evaluation: {wl.metrics}{mem}")
    return code
