"""Where a step's GPU time goes: device kernel time per step, grouped into kernel families,
and into the named parts of the step (:func:`region`) whose kernels are launched eagerly;
and where the GPU waits: its idle time, by the region the host was in as it ran dry.

Used by the throughput tools (``--profile``) to say why a step is as fast as
it is, e.g. how much is convolution/GEMM against fusable memory-bound work.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable

import torch

# (family, substrings of the lower-cased kernel name), first match wins.
# Attention, Triton and batch norm come before conv/gemm: flash kernels mention cutlass,
# Inductor names its kernels after the ops they fuse (``..._convolution_backward_...``), and
# cuDNN's own batch-norm kernels mention cudnn.
FAMILIES = (
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("triton-fused", ("triton",)),
    ("batchnorm", ("batch_norm", "batchnorm", "welford")),
    ("conv/gemm", ("conv", "xmma", "implicit", "dgrad", "wgrad", "cudnn", "cutlass", "gemm",
                   "nvjet", "fprop")),
    ("optimizer (foreach)", ("multi_tensor", "foreach")),
    ("communication", ("nccl",)),
    ("embedding/gather", ("embedding", "indexselect", "index_select", "gather", "scatter")),
    ("elementwise/reduce", ("elementwise", "reduce")),
)


REGION = "region:"     # the prefix of region() ranges among the profiler's events
STEPS = "profiled steps"   # profile_overlap's range around the steps it reads


def region(name: str):
    """A named part of a training step (a ``record_function`` range, next to free when no
    profiler runs): :func:`kernel_breakdown` reports the GPU time of the kernels launched
    inside it. Backward kernels are launched by autograd's engine, outside the forward's
    regions: a region around the backward call holds them all."""
    return torch.profiler.record_function(REGION + name)


def _is_region(event) -> bool:
    """A host range of :func:`region`."""
    return event.device_type.name == "CPU" and event.name.startswith(REGION)


def _is_kernel(event) -> bool:
    """A kernel or copy on the GPU; the GPU spans of annotations (:func:`region`,
    ``Optimizer.step#...``) cover kernels, they are not kernels."""
    return event.device_type.name == "CUDA" and not event.is_user_annotation


def _per_region(events, steps: int, measure: Callable) -> dict[str, float]:
    """``measure(event)`` of each region's ranges, summed per step, by region name."""
    times = collections.Counter()
    for event in filter(_is_region, events):
        times[event.name[len(REGION):]] += measure(event) / steps
    return dict(times)


def region_times(events, steps: int) -> dict[str, float]:
    """Microseconds of device time per step launched inside each region, by name (a nested
    region's time counts in its parents too)."""
    return _per_region(events, steps, lambda event: event.device_time_total)


def region_host_times(events, steps: int) -> dict[str, float]:
    """Microseconds of host time per step inside each region (from entering it to leaving
    it, waits included), by name: where the host spends a step that the GPU waits for."""
    return _per_region(events, steps, lambda event: event.time_range.elapsed_us())


def kernel_times(events, steps: int) -> collections.Counter:
    """Microseconds of device time per step of each kernel (and copy), by name. The GPU
    spans of annotations (:func:`region`, ``Optimizer.step#...``) are not kernels: they
    cover kernels already counted, so they are left out."""
    times = collections.Counter()
    for event in filter(_is_kernel, events):
        times[event.name] += event.device_time / steps
    return times


def kernel_launches(events, steps: int) -> collections.Counter:
    """Launches per step of each kernel (and copy), by name, as :func:`kernel_times` counts
    them: in a CUDA graph each one costs a gap of about a microsecond beside its own time."""
    return collections.Counter({name: n / steps for name, n in collections.Counter(
        event.name for event in filter(_is_kernel, events)).items()})


def family(kernel_name: str) -> str:
    low = kernel_name.lower()
    for name, keys in FAMILIES:
        if any(k in low for k in keys):
            return name
    return "other"


def _covered(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` spans: first start to last end, less the
    gaps."""
    if not spans:
        return 0.0
    width = max(e for _, e in spans) - min(s for s, _ in spans)
    return width - sum(end - start for start, end in _gaps(spans))


def _gaps(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The ``(start, end)`` gaps between the union of ``spans``, first start to last end."""
    gaps, reach = [], None
    for start, end in sorted(spans):
        if reach is not None and start > reach:
            gaps.append((reach, start))
        reach = end if reach is None else max(reach, end)
    return gaps


def _innermost(spans: list, starts: list[float], t: float):
    """The innermost of ``spans`` (``(start, end, name)``, sorted by start, the longer first
    among equal starts; ``starts`` their starts) that holds ``t``: the latest to begin, the
    shortest of those beginning together. None if none holds it."""
    for i in range(bisect.bisect_right(starts, t) - 1, -1, -1):
        if spans[i][1] > t:
            return spans[i]
    return None


def _idle_by(events, steps: int, spans: list) -> dict[str, float]:
    """Milliseconds per step of GPU idle time by the name of the innermost of ``spans``
    (``(start, end, name)``) that holds each gap's start (``(no region)`` where none does)."""
    spans = sorted(spans, key=lambda r: (r[0], -r[1]))
    starts = [r[0] for r in spans]
    kernels = [(e.time_range.start, e.time_range.end) for e in filter(_is_kernel, events)]
    idle = collections.Counter()
    for start, end in _gaps(kernels):
        inside = _innermost(spans, starts, start)
        idle[inside[2] if inside else "(no region)"] += (end - start) / (1e3 * steps)
    return dict(idle)


def idle_by_region(events, steps: int) -> dict[str, float]:
    """Milliseconds per step of GPU idle time (the gaps between kernels), by the innermost
    :func:`region` the host was in as each gap began (``(no region)`` outside them all):
    where the host was when the GPU ran out of work, slow to launch or waiting on a sync."""
    return _idle_by(events, steps, [(e.time_range.start, e.time_range.end,
                                     e.name[len(REGION):]) for e in filter(_is_region, events)])


def idle_by_host_op(events, steps: int) -> dict[str, float]:
    """Milliseconds per step of GPU idle time by the innermost host operation running as each
    gap began, on any thread (autograd's engine runs the backward on its own): an ATen op,
    an autograd node (``autograd::engine::evaluate_function: ...``) or, between ops, the
    region (``region:...``). CUDA runtime calls are left out, so a wait inside one counts for
    the op that made it (``aten::_local_scalar_dense`` for ``.item()``)."""
    return _idle_by(events, steps, [
        (e.time_range.start, e.time_range.end, e.name) for e in events
        if e.device_type.name == "CPU" and not e.name.startswith("cu")])


def overlap_summary(events, steps: int, since: float = float("-inf")) -> dict[str, float]:
    """Milliseconds per step of the device timeline of ``steps`` profiled steps, from the
    kernels that start at ``since`` (microseconds, the profiler's clock) or later: ``span``
    (first kernel's start to last kernel's end), ``busy`` (some kernel or copy running),
    ``communication`` (NCCL kernels running), ``exposed_communication`` (NCCL running and
    nothing else) and ``idle`` (nothing running: host gaps and waits)."""
    spans, comm = [], []
    for event in filter(_is_kernel, events):
        if event.time_range.start >= since:
            span = (event.time_range.start, event.time_range.end)
            (comm if family(event.name) == "communication" else spans).append(span)
    every = spans + comm
    if not every:
        return {}
    busy = _covered(every)
    span = max(e for _, e in every) - min(s for s, _ in every)
    ms = 1e3 * steps
    return {"span": span / ms, "busy": busy / ms, "communication": _covered(comm) / ms,
            "exposed_communication": (busy - _covered(spans)) / ms, "idle": (span - busy) / ms}


def profile_overlap(step: Callable[..., torch.Tensor], batches, steps: int,
                    sync: Callable[[], None] = torch.cuda.synchronize) -> dict[str, float]:
    """:func:`overlap_summary` of ``steps`` calls of an already warmed-up ``step``, each on
    the next of ``batches``. ``sync`` (e.g. a barrier of all ranks, then a device
    synchronize) runs once the profiler is up and before the steps, so that one rank's
    slower profiler start is not counted as the others' communication."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sync()
        with torch.profiler.record_function(STEPS):
            for _ in range(steps):
                step(*next(batches))
            torch.cuda.synchronize()
    events = prof.events()
    since = min(e.time_range.start for e in events if e.name == STEPS)
    return overlap_summary(events, steps, since)


def kernel_breakdown(step: Callable[..., torch.Tensor], batch: tuple[torch.Tensor, ...],
                     steps: int = 5, top: int = 15) -> str:
    """:func:`profiled` of ``steps`` calls of an already warmed-up ``step`` on ``batch``."""
    return profiled(lambda: [step(*batch) for _ in range(steps)], steps, top)


def profiled(run: Callable[[], object], steps: int, top: int = 15) -> str:
    """Profile ``run()``, ``steps`` warmed-up steps; a printable per-step table: kernel time
    by family and by kernel, the timeline (how long the GPU was busy and idle within the
    steps' span) and each region's host and kernel time and the GPU idle time that began in
    it, then the host operations running as the GPU went idle. The profiler slows the host,
    so host times and idle time read high."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    events = prof.events()
    kernels, launches = kernel_times(events, steps), kernel_launches(events, steps)
    families = collections.Counter()
    for name, us in kernels.items():
        families[family(name)] += us
    total = sum(families.values()) or 1.0
    lines = [f"GPU kernel time per step: {total / 1e3:.2f} ms in "
             f"{sum(launches.values()):.0f} kernels and copies"]
    lines += [f"  {name:22s} {us / 1e3:7.2f} ms {100 * us / total:5.1f}%"
              for name, us in families.most_common()]
    lines += [f"    {us / 1e3:6.3f} ms {launches[name]:6.1f}x  {name[:100]}"
              for name, us in kernels.most_common(top)]
    lines.append(f"  the most launched (top {top}):")
    lines += [f"    {n:6.1f}x {kernels[name] / 1e3:6.3f} ms  {name[:100]}"
              for name, n in launches.most_common(top)]
    timeline = overlap_summary(events, steps)
    if timeline:
        lines.append(f"  timeline per step (profiled): span {timeline['span']:.2f} ms, GPU busy "
                     f"{timeline['busy']:.2f} ms, idle {timeline['idle']:.2f} ms")
    regions, host = region_times(events, steps), region_host_times(events, steps)
    if regions:
        idle = idle_by_region(events, steps)
        lines.append("  by region (host time inside it, kernels launched inside it, nested "
                     "regions counting in both; GPU idle time that began while the host was "
                     "in it):")
        lines += [f"    {name:22s} host {host[name] / 1e3:7.2f} ms, kernels {us / 1e3:7.2f} ms "
                  f"{100 * us / total:5.1f}%, idle {idle.get(name, 0.0):6.2f} ms"
                  for name, us in regions.items()]
        if "(no region)" in idle:
            lines.append(f"    {'(no region)':22s} idle {idle['(no region)']:6.2f} ms")
    ops = collections.Counter(idle_by_host_op(events, steps)).most_common(top)
    lines.append(f"  GPU idle time by the host operation running as it began (top {len(ops)}):")
    lines += [f"    {ms:6.2f} ms  {name[:100]}" for name, ms in ops]
    return "\n".join(lines)
