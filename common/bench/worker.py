"""One point of the sweep, under torchrun: time a workload's real step, write one JSON.

    torchrun --nproc_per_node N -m common.bench.worker --workload resnet --mode train \
        --precision amp-bf16 --batch-size 256 --iters 100 --warmup 20 --out POINT.json

Each rank runs ``--batch-size`` samples per step (weak scaling). Figures:
``seconds`` is the timed window (all ranks, slowest), ``core_seconds`` the sum
of per-step device times (excluding waits for data), latencies per step,
``gc``, each rank's garbage-collector pauses while timed, and ``host_ms``, each
rank's median host time per step and its three slowest steps (index, ms).
Bad input exits 2 with one line; a point the workload cannot run is written
as ``{"skipped": reason}``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import itertools
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from common import dist, gc_pauses
from common.bench.external import ExternalWorker, baseline_groups
from common.bench.record import percentile, point_record
from common.cli import OneLineParser
from common.cuda_graph import graphed_step
from common.errors import UserError, one_line
from common.kernel_profile import profile_overlap
from common.metering import AllocatorCalls, peak_memory_bytes, reset_peak_memory
from common.mfu import count_flops
from common.precision import PRECISIONS, Precision
from common.stalls import StallWatch
from common.streams import work_stream
from common.training import build_parser
from common.workload import Workload

OURS = "ours"


def workload_class(name: str) -> type[Workload]:
    """The Workload subclass named ``name`` in ``benchmarks.<name>.workload``."""
    try:
        module = importlib.import_module(f"benchmarks.{name}.workload")
    except ModuleNotFoundError as exc:
        raise UserError(f"no workload {name!r}: benchmarks/{name}/workload.py not found") from exc
    for obj in vars(module).values():
        if (inspect.isclass(obj) and issubclass(obj, Workload)
                and getattr(obj, "name", None) == name):
            return obj
    raise UserError(f"benchmarks/{name}/workload.py defines no Workload named {name!r}")


def baselines(name: str) -> dict:
    """variant -> factory from ``benchmarks.<name>.throughput.BASELINES`` (flattened; the
    harness runs ``ExternalWorker`` entries outside torchrun)."""
    return {v: f for group in baseline_groups(name).values() for v, f in group.items()
            if not isinstance(f, ExternalWorker)}


class Clock:
    """Per-step timing: CUDA events on the device (no host sync), wall time on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: list = []

    def start(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def stop(self, begin) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.spans.append((begin, e))
        else:
            self.spans.append(time.perf_counter() - begin)

    def seconds(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000 for a, b in self.spans]
        return list(self.spans)


def build_point(a, env: dist.DistEnv, precision: Precision):
    """(step, batches iterator, flops per sample or None, warm-up steps needed, samples per
    step in this rank's batch, samples per step over all ranks, a function that closes the
    workload) for the point. Ranks that share samples (U-Net's spatial groups) count them
    once: the workload's global batch."""
    cls = workload_class(a.workload)
    argv = shlex.split(a.workload_args) + ["--precision", a.precision, "--seed", "0",
                                           "--device", env.device.type]
    args = cls.parse_bench_args(build_parser(cls), argv, a.data, a.batch_size, env.world_size)
    args.cuda_graph = a.cuda_graph
    if a.implementation == OURS:
        wl = cls(args, env, precision)
        wl.setup()
        torch.backends.cudnn.benchmark = env.device.type == "cuda" and wl.cudnn_benchmark
        if a.data == "synthetic":
            batches = itertools.repeat(wl.synthetic_batch(wl.rank_batch_size))
        else:
            batches = (b for epoch in itertools.count(1) for b in wl.epoch_batches(epoch))
        local, samples = wl.rank_batch_size, wl.global_batch_size
        if a.mode == "infer":
            return wl.infer_step, batches, None, 0, local, samples, wl.close
        graphed = graphed_step(wl.train_step, wl.capture_policy(), a.cuda_graph, env.device,
                               a.precision, wl.name)
        flops = wl.flops_per_sample
        return (graphed, batches, flops, (graphed.warmup_steps + 1 if graphed.enabled else 0),
                local, samples, wl.close)
    factories = baselines(a.workload)
    if a.implementation not in factories:
        raise UserError(f"{a.workload} has no baseline {a.implementation!r}; it has "
                        f"{', '.join(factories) or 'none'}")
    if a.data != "synthetic":
        raise UserError("baselines run on synthetic data only")
    step, batch = factories[a.implementation](a.batch_size, precision, env.device, a.mode, args)
    return (step, itertools.repeat(batch), None, 0, a.batch_size, a.batch_size * env.world_size,
            lambda: None)


def measure(a, env: dist.DistEnv) -> dict:
    precision = Precision(a.precision, env.device.type)
    precision.apply_backend_flags()
    torch.backends.cudnn.benchmark = env.device.type == "cuda"
    step, batches, flops, min_warmup, local, per_step, close = build_point(a, env, precision)
    try:
        record = _time_point(a, env, step, batches, flops, max(a.warmup, min_warmup), local,
                             per_step)
        if a.profile:
            record["profile"] = profile_ranks(step, batches, a.profile, env)
        return record
    finally:
        close()   # the workload's loader processes, before this process exits


def _time_point(a, env: dist.DistEnv, step, batches, flops, warmup: int, local: int,
                per_step: int) -> dict:
    first = next(batches)
    if flops is None:  # counted on one real call (eager; compiled variants count the same ops)
        # this rank's share of a step, scaled to a sample of the global batch (spatial groups
        # split each sample over ranks)
        flops = count_flops(step, first, local) * local * env.world_size / per_step
    reset_peak_memory(env.device)
    out = step(*first)
    for _ in range(warmup - 1):
        out = step(*next(batches))
    if a.gc_freeze:
        gc_pauses.freeze()
    clock = Clock(env.device)
    dist.barrier()
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    # each step's host time: a rank's own stall shows there, while the GPU waits it causes
    # show in every rank's device times
    host, gc_steps, limits = [], [], []
    allocator = AllocatorCalls(env.device)
    with gc_pauses.PauseMeter() as pauses, StallWatch() as watch:
        for i in range(a.iters):
            batch = next(batches)
            collections = sum(pauses.counts)
            # a step past twice the median so far has its stack sampled
            limits.append(2 * statistics.median(host) if len(host) >= 3 else None)
            watch.begin(i, limits[-1])
            begin, h0 = clock.start(), time.perf_counter()
            out = step(*batch)
            host.append(time.perf_counter() - h0)
            watch.end()
            clock.stop(begin)
            if sum(pauses.counts) > collections:
                gc_steps.append(i)
        if env.device.type == "cuda":
            torch.cuda.synchronize()
    window = time.perf_counter() - t0
    allocator_calls = allocator.stop()
    steps = clock.seconds()
    finite = bool(torch.isfinite(out.float()).all().item())
    stats = torch.tensor([window, sum(steps), float(peak_memory_bytes(env.device))],
                         dtype=torch.float64, device=env.device)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(stats, op=torch.distributed.ReduceOp.MAX)
    window, core, peak = stats.tolist()
    record = point_record(iters=a.iters, warmup=warmup, per_step=per_step, window=window,
                          core=core, steps=steps, peak_memory=int(peak), flops=flops,
                          mode=a.mode, finite=finite)
    record["gc"] = dist.gather_objects({**pauses.summary(), "steps": gc_steps})  # on rank 0
    record["allocator"] = dist.gather_objects(allocator_calls)
    slowest = sorted(range(len(host)), key=host.__getitem__)[-3:][::-1]
    # steps past their limit by two sampling periods: the watcher woke in them, so a step
    # without a sample held the GIL throughout
    stalls = {i: watch.samples.get(i, ["no sample: the step held the GIL"]) for i in slowest
              if limits[i] is not None and host[i] > limits[i] + 2 * watch.period_s}
    record["host_ms"] = dist.gather_objects(
        {"median": percentile(sorted(x * 1e3 for x in host), 50),
         "slowest": [[i, host[i] * 1e3] for i in slowest], "stalls": stalls,
         "spawned": watch.spawned, "compiles": watch.compiles})
    return record


def profile_ranks(step, batches, steps: int, env: dist.DistEnv) -> list[dict] | None:
    """Every rank's device timeline over ``steps`` more steps (``kernel_profile``): how much
    of a step is communication, how much of that nothing else hides, and how long the GPU
    waits. On rank 0, in rank order; None on the other ranks."""
    if env.device.type != "cuda":
        raise UserError("--profile needs CUDA (it reads the GPU's kernel timeline)")
    def sync():
        dist.barrier()
        torch.cuda.synchronize()
    return dist.gather_objects(profile_overlap(step, batches, steps, sync))


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m common.bench.worker", description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True)
    p.add_argument("--implementation", default=OURS)
    p.add_argument("--mode", choices=("train", "infer"), required=True)
    p.add_argument("--precision", choices=PRECISIONS, required=True)
    p.add_argument("--batch-size", type=int, required=True, help="per rank")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--data", choices=("synthetic", "real"), default="synthetic")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--bind-cpus", action="store_true",
                   help="bind each rank to its share of its GPU's local CPU cores")
    p.add_argument("--gc-freeze", action="store_true",
                   help="freeze the objects setup made out of the garbage collector's reach "
                        "before timing")
    p.add_argument("--workload-args", default="", help="extra workload flags, one string")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="then profile this many steps: communication, overlap, idle time")
    p.add_argument("--out", type=Path, required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.iters < 1 or a.warmup < 1 or a.batch_size < 1 or a.profile < 0:
        print("error: --iters, --warmup and --batch-size must be >= 1, --profile >= 0",
              file=sys.stderr)
        return 2
    try:
        env = dist.init_distributed(a.device, bind_cpus=a.bind_cpus)
    except UserError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    try:
        with work_stream(env.device):
            record = measure(a, env)
    except UserError as exc:
        record = {"skipped": one_line(exc)}
    record.update(gpus=env.world_size, device=env.device.type)
    if env.is_main:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(record, indent=2) + "\n")
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
