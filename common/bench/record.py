"""One point's figures from its timings. Imports no torch: other frameworks' workers use it too."""

from __future__ import annotations

import math


def point_record(*, iters: int, warmup: int, per_step: int, window: float, core: float,
                 steps: list[float], peak_memory: int, flops: float | None, mode: str,
                 finite: bool) -> dict:
    """The record a worker writes: ``iters`` timed steps of ``per_step`` samples in ``window``
    seconds, ``core`` the device seconds of those steps, ``steps`` each step's seconds."""
    samples = iters * per_step
    lat = sorted(s * 1000 for s in steps)
    return {
        "samples": samples, "seconds": window, "samples_per_s": samples / window,
        "core_seconds": core, "p_core": samples / core, "p_train": samples / window,
        "total_samples": (warmup + iters) * per_step,
        "warmup": warmup, "peak_memory_bytes": int(peak_memory),
        "flops_per_sample": flops,
        "flops_counted": "forward+backward" if mode == "train" else "forward",
        "latency_ms": {"mean": sum(lat) / len(lat), **{f"p{q}": percentile(lat, q)
                                                       for q in (50, 90, 95, 99)}},
        "output_finite": finite,
    }


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of already sorted values."""
    pos = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
