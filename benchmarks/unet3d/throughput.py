"""3D U-Net training throughput on device-resident batches: the registry's variants against
the compiled plain model.

    python -m benchmarks.unet3d.throughput --batch-size 2 \
        --variants compiled,config,config-minus-compile,config-minus-fused-norm

Every variant is the workload's real ``train_step`` (model, Dice + CE loss, Nesterov SGD) on
synthetic ``--shape`` batches at ``--precision``: ``plain`` with no optimisation (NCDHW,
``F.instance_norm``, eager), ``config`` with the 1xH100 config's but ``sharded-eval`` (not a
step's), ``config-minus-<name>`` without one (and what requires it). ``compiled``, the baseline
(always measured, first), is what a user would run: the plain model under
``torch.compile(model)``, channels_last_3d. MFU: the model's FLOPs per sample (forward and
backward) times samples/s over the measured bf16 matmul peak (``common.mfu``).
"""

from __future__ import annotations

import sys

import torch

from benchmarks.unet3d.workload import Unet3DWorkload
from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.mfu import MFU
from common.optimisations import ablation_variants, config_optimisations
from common.precision import Precision
from common.throughput import gpu_variants, measure_variant, report_variants, tool_parser
from common.training import build_parser

BASELINE = "compiled"
EVALUATION = ("sharded-eval",)


def ours_variants() -> dict[str, list[str]]:
    """variant -> ``--optimisations`` items; the baseline's model is compiled by ``build``."""
    config = [o for o in config_optimisations("unet3d", "1xH100")
              if o.partition("=")[0] not in EVALUATION]
    return {BASELINE: ["channels-last"],
            **ablation_variants(Unet3DWorkload.optimisations, config)}


def build(variant: str, items: list[str], batch_size: int, shape: str, precision: Precision,
          device):
    """(workload, batch) of one variant."""
    flags = ["--precision", precision.name, "--seed", "0", "--input-shape", shape]
    args = Unet3DWorkload.parse_bench_args(
        build_parser(Unet3DWorkload), flags + (["--opt", ",".join(items)] if items else []),
        "synthetic", batch_size)
    wl = Unet3DWorkload(args, DistEnv(device=device), precision)
    wl.setup()
    if variant == BASELINE:
        wl.model = torch.compile(wl.model)
    wl.lr.fill_(1e-4)
    return wl, wl.synthetic_batch(batch_size)


def main(argv=None) -> int:
    p = tool_parser("python -m benchmarks.unet3d.throughput", __doc__,
                    "compiled,config,config-minus-compile,config-minus-fused-norm",
                    warmup=15, iters=20)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--shape", default="128,128,128")
    a = p.parse_args(argv)
    known = ours_variants()
    variants = gpu_variants(p, a.variants, known)

    # last: after a step compiled around the fused norm, the norm's own compiled functions ran
    # eagerly in the same process (one H100: config-minus-compile 26.97, not 47.01 samples/s)
    def late(v):
        return "fused-norm" in known[v] and any(i.startswith("compile") for i in known[v])
    variants = [BASELINE] + sorted((v for v in variants if v != BASELINE), key=late)
    device = torch.device("cuda")
    precision = Precision(a.precision, device.type)
    precision.apply_backend_flags()
    torch.backends.cudnn.benchmark = True
    mfu = MFU.measure(lambda: build("plain", [], a.batch_size, a.shape, precision, device), device)
    print(mfu, flush=True)
    rows = []
    for v in variants:
        wl, batch = build(v, known[v], a.batch_size, a.shape, precision, device)
        step = GraphedStep(wl.train_step, enabled=wl.args.cuda_graph)
        rows.append(measure_variant(v, step, batch, device, a.warmup, a.iters, "samples/s",
                                    mfu, a.profile, batch_size=a.batch_size, shape=a.shape))
        del step, batch, wl
        torch._dynamo.reset()   # each variant compiles afresh, as in its own process
        torch.cuda.empty_cache()
    return report_variants(rows, (BASELINE,), a.json)


if __name__ == "__main__":
    sys.exit(main())
