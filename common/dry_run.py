"""``--dry-run STEPS``: a config run as written for a bounded number of training steps and
one full evaluation pass, every step timed, instead of training to the target.

The log says so (key ``dry_run``), so that the compliance check and the packager refuse it,
and carries the measurements (key ``dry_run_report``) from which ``python -m
compliance.projection`` projects a time-to-train. FlagPerf's throughputs, over the dry run's
samples: ``p_whole`` over initialization, training and the evaluation; ``p_train`` over the
training steps with their waits for input; ``p_core`` over the steps less those waits.

On a GPU the steps are timed on the device's timeline (:class:`StepClock`), the host kept one
step ahead as in a run, so a batch's host-side loading overlaps the step before as it does
there; a step's wait for input is the GPU's idle time (or input work) before it began.
"""

from __future__ import annotations

import math
import resource
import statistics
import time
from dataclasses import asdict, dataclass

import torch

DRY_RUN_KEY = "dry_run"          # value: the steps asked for
REPORT_KEY = "dry_run_report"    # value: a Report as a dict
SLOW_FACTOR = 3.0    # a step this many times the median before it gets a line of its own
SLOW_LINES = 20      # such lines at most, each printed as its step ends


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by the nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def slow(step_s: list[float]) -> bool:
    """Whether the last of ``step_s`` gets a line: the first step (where one-off costs land:
    the loader's first batches, the real data's first compilations) and any that took over
    ``SLOW_FACTOR`` times the median of the steps before it."""
    return len(step_s) == 1 or step_s[-1] > SLOW_FACTOR * statistics.median(step_s[:-1])


def slow_step_line(n: int, step_s: float, wait_s: float, compiles, spawned) -> str:
    """Step ``n``'s line, for a step that ran :func:`slow`: its time, its wait for input and
    what compiled or started a process during it (``common.stalls.StallWatch``'s
    ``compiles`` and ``spawned``: a graph recorded or a kernel compiled inside a timed step
    is a one-off cost that a projection at the steps' mean would charge to every step)."""
    kinds: dict[str, list[float]] = {}
    for step, what, seconds in compiles:
        if step == n:
            kinds.setdefault(what, []).append(seconds)
    made = ", ".join(f"{what} {len(t)} x, {sum(t):.1f} s" for what, t in kinds.items())
    started = sum(1 for step, *_ in spawned if step == n)
    return (f"dry run: step {n} took {step_s * 1e3:,.1f} ms (input wait {wait_s * 1e3:,.1f} "
            f"ms; compiled or recorded: {made or 'nothing'}; processes started: {started})")


class StepClock:
    """Each step's time and wait for input. On a GPU, from CUDA events: a step ends at its
    last kernel; its wait is the device's time from the step before's end to the start of its
    own work (idle, or running the input's own kernels and copies), so host work that
    overlaps the step before is not counted. The host runs one step ahead (it waits for step
    n - 1 to end once step n is queued): a step's times are read then. On the CPU, host
    times, each step ending before the next is loaded."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._pending: list = []   # (input ready, step end) marks of steps not yet read
        self._start = None
        self._prev = self._mark()  # the last read step's end

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def input_ready(self) -> None:
        """The step's batch is in hand: its own work begins."""
        self._start = self._mark()

    def step_queued(self) -> list[tuple[float, float]]:
        """(step_s, wait_s) of the steps that ended: on a GPU the one before this."""
        self._pending.append((self._start, self._mark()))
        return self._read(1 if self.cuda else 0)

    def finish(self) -> list[tuple[float, float]]:
        """(step_s, wait_s) of the steps not yet read (waits for them to end)."""
        return self._read(0)

    def _read(self, keep: int) -> list[tuple[float, float]]:
        done = []
        while len(self._pending) > keep:
            start, end = self._pending.pop(0)
            if self.cuda:
                end.synchronize()
                done.append((self._prev.elapsed_time(end) / 1e3,
                             self._prev.elapsed_time(start) / 1e3))
            else:
                done.append((end - self._prev, start - self._prev))
            self._prev = end
        return done


def short_epoch_note(train_samples: int, full_dataset: tuple[int, int] | None) -> str | None:
    """Where the run's epoch is a fraction of the real dataset's (a stand-in), a note that
    schedules given in epochs (warm-ups, decays) come that many times sooner in steps: a
    loss that diverges then may not on the real data. None on the real dataset."""
    if not full_dataset or train_samples >= full_dataset[0]:
        return None
    times = full_dataset[0] / train_samples
    return (f"dry run: note: an epoch of this data is 1/{times:,.1f} of the real dataset's, so "
            f"an LR warm-up or decay given in epochs comes {times:,.1f}x sooner in steps than "
            f"on the real data (scale it by {times:,.1f}, e.g. --warmup-epochs, to run the "
            f"real schedule's first steps)")


def peak_host_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True)
class Report:
    steps: int
    global_batch_size: int
    steps_per_epoch: int | None
    init_s: float
    step_p50_s: float
    step_p99_s: float
    input_wait_p50_s: float
    train_s: float            # the steps' wall time, waits for input included
    input_wait_s: float
    eval_s: float
    eval_samples: int
    peak_device_bytes: int
    peak_host_bytes: int
    eval_points: list         # the schedule: [optimizer steps, epoch_num] of each evaluation
    train_samples: int
    full_dataset: list | None  # the real dataset's [training, evaluation] samples, if epochs
    eval_again_s: float | None = None   # a second evaluation, where the workload keeps batches

    @property
    def step_scale(self) -> float:
        """The real dataset's steps per epoch over the run's (1 on the real dataset)."""
        if not self.full_dataset or not self.steps_per_epoch:
            return 1.0
        return max(1.0, self.full_dataset[0] // self.global_batch_size / self.steps_per_epoch)

    @property
    def eval_scale(self) -> float:
        """The real evaluation set's samples over the run's (1 on the real dataset)."""
        return max(1.0, self.full_dataset[1] / self.eval_samples) if self.full_dataset else 1.0

    @classmethod
    def measure(cls, step_s: list[float], wait_s: list[float], **fields) -> Report:
        return cls(steps=len(step_s), step_p50_s=percentile(step_s, 50),
                   step_p99_s=percentile(step_s, 99), input_wait_p50_s=percentile(wait_s, 50),
                   train_s=sum(step_s), input_wait_s=sum(wait_s), **fields)

    @property
    def samples(self) -> int:
        return self.steps * self.global_batch_size

    @property
    def p_whole(self) -> float:
        return self.samples / (self.init_s + self.train_s + self.eval_s)

    @property
    def p_train(self) -> float:
        return self.samples / self.train_s

    @property
    def p_core(self) -> float:
        return self.samples / (self.train_s - self.input_wait_s)

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        gib = 2**30
        again = ("" if self.eval_again_s is None
                 else f" (again, from the batches it kept: {self.eval_again_s:.2f} s)")
        return [
            f"dry run: {self.steps} steps of {self.global_batch_size} after {self.init_s:.1f} s "
            f"of initialization; step p50 {self.step_p50_s * 1e3:.2f} ms, p99 "
            f"{self.step_p99_s * 1e3:.2f} ms, waiting for input p50 "
            f"{self.input_wait_p50_s * 1e3:.2f} ms",
            f"dry run: p_whole {self.p_whole:.1f}, p_train {self.p_train:.1f}, p_core "
            f"{self.p_core:.1f} samples/s; evaluation of {self.eval_samples} samples "
            f"{self.eval_s:.2f} s{again}; peak memory {self.peak_device_bytes / gib:.2f} GiB "
            f"device, {self.peak_host_bytes / gib:.2f} GiB host (this process)",
        ]
