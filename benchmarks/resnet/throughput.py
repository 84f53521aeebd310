"""ResNet-50 training throughput on device-resident synthetic batches, ours against baselines.

    python -m benchmarks.resnet.throughput --batch-size 408 --variants config@amp-fp16
    python -m benchmarks.resnet.throughput --batch-size 256 --precision amp-fp16 \
        --variants plain,config,config-minus-cudnn-fusion,torchvision-compile

Ours are the suite's training step with the registry's optimisations: ``plain`` (none),
``config`` (``config_1xH100.sh``'s at its precision, amp-fp16, less the input ones, which the
input pipeline's tool ``benchmarks.resnet.pipeline`` times) and ``config-minus-<name>``. The
baselines: torchvision's resnet50 with momentum SGD, eager or ``torch.compile``-d (``-max``:
autotuned). ``VARIANT@PRECISION`` runs a variant at its own precision; ``--profile`` adds
each variant's kernel time by family. MFU (``common.mfu``) takes the workload's FLOPs per image
for every variant, torchvision's included (the same network).
"""

from __future__ import annotations

import gc
import json
import sys

import torch

from benchmarks.resnet.workload import INPUT, ResNetWorkload
from common.bench.external import ExternalWorker
from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.kernel_profile import kernel_breakdown
from common.mfu import MFU
from common.optimisations import ablation_variants, config_optimisations
from common.precision import PRECISIONS, Precision
from common.throughput import gpu_variants, time_steps, tool_parser
from common.training import build_parser


def ours_variants() -> dict[str, list[str]]:
    """variant -> ``--optimisations`` items, the input optimisations left out."""
    config = [o for o in config_optimisations("resnet", "1xH100")
              if o.partition("=")[0] not in INPUT]
    return ablation_variants(ResNetWorkload.optimisations, config)


# variant -> torch.compile mode (None: eager) for torchvision's resnet50
TORCHVISION = {"torchvision-eager": None, "torchvision-compile": "default",
               "torchvision-compile-max": "max-autotune-no-cudagraphs"}


def ours(batch_size: int, precision: Precision, device, items: list[str]):
    """The workload built with these ``--optimisations`` items, and its synthetic batch."""
    argv = ["--precision", precision.name, "--seed", "0"] + (["--opt", ",".join(items)]
                                                              if items else [])
    args = ResNetWorkload.parse_bench_args(build_parser(ResNetWorkload), argv, "synthetic",
                                           batch_size)
    wl = ResNetWorkload(args, DistEnv(device=device), precision)
    wl.setup()
    return wl, wl.synthetic_batch(batch_size)


def torchvision_step(batch_size: int, precision: Precision, device, compile_mode: str | None,
                     mode: str = "train", image_size: int = 224):
    """torchvision's resnet50 as a user would run it: momentum SGD, eager (``compile_mode``
    None) or torch.compile-d in that mode."""
    import torchvision  # GPU machines only: the CPU wheels cannot load it

    model = torchvision.models.resnet50().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    crit = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    fwd = model if compile_mode is None else torch.compile(model, mode=compile_mode)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with precision.autocast():
            loss = crit(fwd(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    @torch.no_grad()
    def infer(x, y):
        with precision.autocast():
            return fwd(x)

    if mode == "infer":
        model.eval()
    x = torch.randn(batch_size, 3, image_size, image_size, device=device).to(
        memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch_size,), device=device)
    return (step if mode == "train" else infer), (x, y)


def _torchvision(compile_mode: str | None):
    def factory(batch_size, precision, device, mode, workload_args):
        return torchvision_step(batch_size, precision, device, compile_mode, mode,
                                workload_args.image_size)
    return factory


# MXNet Gluon (``mxnet_worker``) in its own venv: mxnet 1.9.1 needs numpy<1.24.
MXNET = ExternalWorker(
    framework="mxnet", module="benchmarks.resnet.mxnet_worker", python_var="MXNET_PYTHON",
    venv=".venv-mxnet", install="make mxnet-venv",
    cuda_reason=("MXNet runs on the CPU only here: the only MXNet GPU builds for recent CUDA "
                 "are mxnet-cu112/mxnet-cu117 1.9.1, a 499.4 MB wheel, and the GPU machines "
                 "have no network and take at most 64 MiB of carried files; add --device cpu "
                 "to time it on the host CPU"))

# Baselines for ``python -m common.bench resnet --baseline torchvision|mxnet``: variant ->
# factory (torch, under torchrun) or ExternalWorker (another framework).
BASELINES = {"torchvision": {name: _torchvision(mode) for name, mode in TORCHVISION.items()},
             "mxnet": {"mxnet-gluon": MXNET}}


def variant_precisions(parser, text: str, default: str, known) -> list[tuple[str, str]]:
    """``VARIANT[@PRECISION],...`` as (variant, precision) pairs, ``default`` where no
    precision is named; ``parser.error`` for an unknown variant or precision."""
    pairs = [(name, precision or default)
             for name, _, precision in (item.partition("@") for item in text.split(","))]
    bad = sorted({precision for _, precision in pairs} - set(PRECISIONS))
    if bad:
        parser.error(f"unknown precision(s) {bad} in --variants; choose from "
                     f"{', '.join(PRECISIONS)}")
    gpu_variants(parser, ",".join(name for name, _ in pairs), known)
    return pairs


def main(argv=None) -> int:
    p = tool_parser("python -m benchmarks.resnet.throughput", __doc__,
                    "plain,config,torchvision-eager,torchvision-compile", warmup=30, iters=100)
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args(argv)
    variants = ours_variants()
    runs = variant_precisions(p, args.variants, args.precision, [*variants, *TORCHVISION])
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    mfu = MFU.measure(lambda: ours(args.batch_size, Precision(args.precision, "cuda"), device,
                                   []), device)
    print(mfu, flush=True)
    results: list[dict] = []
    for v, precision_name in runs:
        precision = Precision(precision_name, "cuda")
        precision.apply_backend_flags()
        if v in variants:
            wl, batch = ours(args.batch_size, precision, device, variants[v])
            step = GraphedStep(wl.train_step, enabled=wl.args.cuda_graph)
        else:
            wl = None
            step, batch = torchvision_step(args.batch_size, precision, device, TORCHVISION[v])
        m = time_steps(v, step, batch, device, args.warmup, args.iters)
        results.append(dict(m.__dict__, precision=precision_name,
                            samples_per_second=m.samples_per_second,
                            **mfu.row(m.samples_per_second)))
        print(f"{v:22s} batch {m.batch_size:4d} {precision_name:9s} "
              f"{m.samples_per_second:9.1f} img/s  {mfu.text(m.samples_per_second)}  "
              f"peak {m.peak_memory_bytes / 2**30:5.1f} GiB", flush=True)
        if args.profile:
            print(kernel_breakdown(step, batch, top=args.profile), flush=True)
        del wl, step, batch
        # ours' workload sits in reference cycles: unless collected, its ~0.3 GiB of weights
        # and optimizer state would count in the next variant's peak memory
        gc.collect()
        torch.cuda.empty_cache()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "train": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
