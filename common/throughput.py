"""Steady-state training throughput of a workload's real step on device-resident batches.

The step is the same ``train_step`` the time-to-train driver runs (optionally
as one CUDA graph); only the data is synthetic, so the figure isolates the
model, optimizer and communication from the input pipeline.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.cli import OneLineParser
from common.metering import Throughput, peak_memory_bytes, reset_peak_memory
from common.mfu import MFU
from common.precision import PRECISIONS


@dataclass(frozen=True)
class Measurement:
    name: str
    batch_size: int
    iters: int
    seconds: float
    peak_memory_bytes: int

    @property
    def samples_per_second(self) -> float:
        return self.batch_size * self.iters / self.seconds


def time_steps(name: str, step: Callable[..., torch.Tensor], batch: tuple[torch.Tensor, ...],
               device: torch.device, warmup: int, iters: int, repeats: int = 3) -> Measurement:
    """Run ``warmup`` steps, then ``repeats`` timed windows of ``iters`` steps; keep the fastest."""
    reset_peak_memory(device)
    for _ in range(warmup):
        step(*batch)
    best = None
    for _ in range(repeats):
        meter = Throughput(device)
        meter.start()
        for _ in range(iters):
            step(*batch)
        seconds = meter.stop(iters * batch[0].shape[0])
        best = seconds if best is None else min(best, seconds)
    return Measurement(name, batch[0].shape[0], iters, best, peak_memory_bytes(device))


def measure_variant(name: str, step: Callable[..., torch.Tensor], batch: tuple, device,
                    warmup: int, iters: int, unit: str, mfu: MFU, profile: int = 0,
                    **row) -> dict:
    """One variant's row for a comparison tool: ``row`` plus samples/s, ``mfu``'s fields and
    peak GiB, printed; or, where the variant fails (out of memory, a kernel's size limit, a
    compile error), the error's first line as ``row["error"]``, printed, so the other variants
    still run."""
    from common.kernel_profile import kernel_breakdown

    try:
        m = time_steps(name, step, batch, device, warmup, iters)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        print(f"{name:22s} failed: {error}", flush=True)
        return {"variant": name, **row, "error": error}
    gib = m.peak_memory_bytes / 2**30
    print(f"{name:22s} batch {m.batch_size}: {m.samples_per_second:8.1f} {unit}, "
          f"{mfu.text(m.samples_per_second)}, peak {gib:.1f} GiB", flush=True)
    if profile:
        print(kernel_breakdown(step, batch, top=profile), flush=True)
    return {"variant": name, **row, "samples_per_second": m.samples_per_second,
            **mfu.row(m.samples_per_second), "peak_memory_gib": gib}


def report_variants(rows: list[dict], references, json_path: str | None) -> int:
    """Print each measured variant's ratio to each reference variant measured, write the
    rows (with the device and torch version) to ``json_path``; 1 if a variant failed (a
    variant may be named twice, e.g. to see the drift between its two runs)."""
    speed = {r["variant"]: r["samples_per_second"] for r in rows if "error" not in r}
    for ref in references:
        if ref in speed:
            for name, value in speed.items():
                print(f"{name:22s} x{value / speed[ref]:.2f} vs {ref}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "results": rows}, f, indent=1)
    return int(any("error" in r for r in rows))


def meta_train_flops(build_model: Callable[[], torch.nn.Module], sample_shape: tuple[int, ...],
                     batch: int = 2) -> float:
    """Forward + backward FLOPs per sample of ``build_model()`` on inputs of ``sample_shape``
    (convolutions and matmuls, counted by torch's FlopCounterMode on meta tensors)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = build_model()
        inputs = torch.empty(batch, *sample_shape)
    with FlopCounterMode(display=False) as counter:
        model(inputs).sum().backward()
    return counter.get_total_flops() / batch


def gpu_variants(parser: argparse.ArgumentParser, text: str, known) -> list[str]:
    """The comma-separated variants of a GPU comparison; ``parser.error`` (one line, exit 2)
    without CUDA or for a name not in ``known``."""
    if not torch.cuda.is_available():
        parser.error("the throughput comparison needs a CUDA device")
    variants = text.split(",")
    unknown = set(variants) - set(known)
    if unknown:
        parser.error(f"unknown variant(s) {sorted(unknown)}; choose from {', '.join(known)}")
    return variants


def tool_parser(prog: str, doc: str, variants: str | None, warmup: int, iters: int,
                precision: bool = True, variants_help: str | None = None,
                profile_kernels: int = 15) -> OneLineParser:
    """The flags every workload's GPU comparison tool shares: ``--precision`` (unless the
    variants fix it), ``--variants``, ``--warmup``, ``--iters``, ``--json``, ``--profile [N]``
    (``args.profile``: how many kernels to list, ``profile_kernels`` when N is left out; 0:
    no profile)."""
    p = OneLineParser(prog=prog, description=doc)
    if precision:
        p.add_argument("--precision", default="amp-bf16", choices=PRECISIONS)
    p.add_argument("--variants", default=variants, help=variants_help)
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--iters", type=int, default=iters)
    p.add_argument("--json", default=None, help="write the results here too")
    p.add_argument("--profile", type=int, nargs="?", const=profile_kernels, default=0,
                   metavar="KERNELS",
                   help="print each variant's GPU kernel time per step by kernel family and "
                        f"its KERNELS (default {profile_kernels}) longest kernels")
    return p
