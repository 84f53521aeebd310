"""3D U-Net training throughput at 128^3 on device-resident batches: plain vs optimised.

    python -m benchmarks.unet3d.throughput --batch-size 2 --variants plain,amp,amp-cl,amp-cl-graph

Every variant is the workload's real ``train_step`` (model, Dice + CE loss,
Nesterov SGD) on synthetic 128^3 batches: ``plain`` is fp32 in NCDHW, eager;
``amp`` autocasts to bf16; ``amp-cl`` also keeps activations channels_last_3d;
``amp-cl-graph`` captures the whole step as one CUDA graph; ``amp-fused``,
``amp-cl-fused`` and ``amp-cl-fused-graph`` run instance norm + ReLU as fused
compiled kernels (``--fused-norm``), which read channels_last_3d in place.
"""

from __future__ import annotations

import json
import sys

import torch

from benchmarks.unet3d.workload import Unet3DWorkload
from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.kernel_profile import kernel_breakdown
from common.precision import Precision
from common.throughput import gpu_variants, time_steps, tool_parser
from common.training import build_parser

# variant -> (precision, channels_last_3d, CUDA graph, fused instance norm + ReLU)
VARIANTS = {"plain": ("fp32", False, False, False), "tf32": ("tf32", False, False, False),
            "amp": ("amp-bf16", False, False, False), "amp-cl": ("amp-bf16", True, False, False),
            "amp-cl-graph": ("amp-bf16", True, True, False),
            "amp-fused": ("amp-bf16", False, False, True),
            "amp-cl-fused": ("amp-bf16", True, False, True),
            "amp-cl-fused-graph": ("amp-bf16", True, True, True)}


def build(variant: str, batch_size: int, shape: str, device):
    precision_name, channels_last, graph, fused = VARIANTS[variant]
    precision = Precision(precision_name, device.type)
    precision.apply_backend_flags()
    flags = ["--precision", precision_name, "--seed", "0", "--input-shape", shape,
             "--channels-last" if channels_last else "--no-channels-last",
             "--fused-norm" if fused else "--no-fused-norm"]
    args = Unet3DWorkload.parse_bench_args(build_parser(Unet3DWorkload), flags, "synthetic",
                                           batch_size)
    wl = Unet3DWorkload(args, DistEnv(device=device), precision)
    wl.build()
    wl.lr.fill_(1e-4)
    return GraphedStep(wl.train_step, enabled=graph), wl.synthetic_batch(batch_size)


def main(argv=None) -> int:
    p = tool_parser("python -m benchmarks.unet3d.throughput", __doc__, ",".join(VARIANTS),
                    warmup=15, iters=20, precision=False)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--shape", default="128,128,128")
    a = p.parse_args(argv)
    variants = gpu_variants(p, a.variants, VARIANTS)
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    rows = []
    for v in variants:
        step, batch = build(v, a.batch_size, a.shape, device)
        m = time_steps(v, step, batch, device, a.warmup, a.iters)
        rows.append({"variant": v, "batch_size": a.batch_size, "shape": a.shape,
                     "samples_per_second": m.samples_per_second,
                     "peak_memory_gib": m.peak_memory_bytes / 2**30})
        print(f"{v:18s} batch {a.batch_size} {a.shape}: {m.samples_per_second:7.2f} samples/s, "
              f"peak {m.peak_memory_bytes / 2**30:.1f} GiB", flush=True)
        if a.profile:
            print(kernel_breakdown(step, batch), flush=True)
        del step, batch
        torch.cuda.empty_cache()
    base = rows[0]["samples_per_second"]
    for r in rows:
        print(f"{r['variant']:18s} x{r['samples_per_second'] / base:.2f} vs {rows[0]['variant']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
