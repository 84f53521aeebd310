"""DLRM training throughput (samples/s) on a device-resident synthetic batch: the registry's
variants.

    python -m benchmarks.dlrm.throughput --batch-size 55296 --max-ind-range 10000000 \\
        --precision amp-bf16 --variants plain,config
    torchrun --nproc_per_node 8 -m benchmarks.dlrm.throughput --max-ind-range 40000000 \\
        --variants config-plus-model-parallel-embeddings,config

Every variant is the workload's real ``train_step`` on one global batch of ``--batch-size`` with
power-law category ids (``data.power_law_ids``) and its index plan, built once: no input
pipeline (``prefetch``), no evaluation. ``plain``: no optimisation (one process only);
``config``: the 1xH100 config's optimisations; ``config-minus-<name>`` without one (and what
requires it); ``config-plus-<name>`` with one more (in place of what it excludes);
``config-8xH200``: the 8xH200 config's. Under
torchrun each rank trains its share of the global batch; rank 0 prints the global samples/s. A
variant whose tables would not fit the free device memory is skipped with one line.
``plain-compiled``: ``plain`` with its forward under ``torch.compile``.
Each hybrid variant also prints its index plan's time, which the step leaves out (the plan is
built once here; ``prefetch`` computes it during the step before). ``--profile`` adds the GPU
kernel time by kernel family; MFU (``common.mfu``) counts the MLPs and
the interaction, over the peak of all the GPUs. Bandwidth: the embeddings' least traffic a step
(:func:`embedding_bytes`) over the step's time, against the device-to-device copy rate measured
in the same process (read and write counted).
"""

from __future__ import annotations

import gc
import json
import math
import sys

import torch

from benchmarks.dlrm import data
from benchmarks.dlrm.hybrid import HybridEmbedding, table_offsets
from benchmarks.dlrm.workload import DLRMWorkload
from common import dist
from common.cli import one_line_errors
from common.cuda_graph import graphed_step
from common.kernel_profile import kernel_breakdown
from common.mfu import MFU
from common.optimisations import ablation_variants, config_optimisations, plus_variants
from common.precision import Precision
from common.progress import say
from common.throughput import gpu_variants, time_steps, tool_parser
from common.training import build_parser

NOT_A_STEPS = ("prefetch", "cache-eval")   # the input pipeline's and evaluation's
SHARDED = {"hybrid-embeddings", "model-parallel-embeddings"}
DEFAULT_VARIANTS = {False: "plain,config",   # by distributed: plain is one process only
                    True: "config-plus-model-parallel-embeddings,config"}


def _step(system: str) -> list[str]:
    """A config's optimisations that change the step."""
    return [o for o in config_optimisations("dlrm", system)
            if o.partition("=")[0] not in NOT_A_STEPS]


def variants() -> dict[str, list[str]]:
    """variant -> ``--optimisations`` items."""
    registry = DLRMWorkload.optimisations
    config = _step("1xH100")
    ablation = ablation_variants(registry, config)
    return {"plain": ablation.pop("plain"), "plain-compiled": [], **ablation,
            "config-8xH200": _step("8xH200"), **plus_variants(registry, config, NOT_A_STEPS)}


def embedding_bytes(ids: torch.Tensor, dim: int, offsets: torch.Tensor, lp_bytes: int,
                    masters: bool = True) -> int:
    """The least bytes the embeddings move in a training step of global batch ``ids`` [B, T]:
    each lookup's row read and its output written, the output's gradient read (``lp_bytes``
    each element), and each distinct row's fp32 master read and written and its copy written
    (the copy only with ``lp_bytes`` < 4); without ``masters`` (``bf16-tables``) each distinct
    row read and written in ``lp_bytes``."""
    lookups = ids.numel()
    rows = torch.unique(ids.to(offsets.device) + offsets).numel()
    per_row = (8 + (lp_bytes if lp_bytes < 4 else 0)) if masters else 2 * lp_bytes
    return dim * (3 * lookups * lp_bytes + rows * per_row)


def _event_ms(fn) -> float:
    """Milliseconds from the start to the end of ``fn()``'s work on the current stream (host
    syncs inside included)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


def plan_time_ms(wl: DLRMWorkload, ids: torch.Tensor, repeats: int = 5) -> float | None:
    """The median time of the index plan of global batch ``ids`` (:func:`_event_ms`), ms;
    None where the embeddings take the ids as they are."""
    if not isinstance(wl.emb, HybridEmbedding):
        return None
    ids = ids.to(wl.env.device)
    times = [_event_ms(lambda: wl._index(ids)) for _ in range(repeats + 1)]
    return sorted(times[1:])[repeats // 2]   # the first call warms up


def copy_rate(device, nbytes: int = 2**30, iters: int = 20) -> float:
    """Device-to-device copy bytes/s (each byte read and written counted)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    ms = _event_ms(lambda: [b.copy_(a) for _ in range(iters)])
    return 2 * nbytes * iters / (ms / 1e3)


VARIANTS = variants()


def workload_args(variant: str, a):
    """The workload's flags for ``variant``."""
    items = VARIANTS[variant]
    return build_parser(DLRMWorkload).parse_args(
        ["--synthetic-data", "--precision", a.precision, "--seed", "0",
         "--batch-size", str(a.batch_size), "--max-ind-range", str(a.max_ind_range),
         *(["--opt", ",".join(items)] if items else [])])


def table_bytes(args, world: int, lp_bytes: int) -> int:
    """Device bytes of one rank's embedding tables: plain, every row in fp32; hybrid (an upper
    bound), the frequent rows (at most the statistics' lookups / threshold) and this rank's
    share of the rest, each in fp32 and its ``lp_bytes`` copy (``bf16-tables``: the rest in
    bf16 alone)."""
    total = sum(data.cap_sizes(data.CRITEO_TB_SIZES, args.max_ind_range))
    opts = args.optimisations
    threshold = (math.inf if "model-parallel-embeddings" in opts
                 else opts.get("hybrid-embeddings"))
    if threshold is None:
        return total * args.embedding_dim * 4
    lookups = args.stats_batches * args.batch_size * data.NUM_SPARSE
    frequent = total if threshold <= 0 else min(total, math.floor(lookups / threshold))
    rare = -(-total // world) * (2 if "bf16-tables" in opts else 4 + lp_bytes)
    return (frequent * (4 + lp_bytes) + rare) * args.embedding_dim


def fits(variant: str, need: int, env: dist.DistEnv) -> bool:
    """Whether ``need`` bytes are free on every rank's GPU; says why not (rank 0)."""
    free = torch.cuda.mem_get_info(env.device)[0]
    short = dist.all_reduce_sum(torch.tensor(float(need > free), device=env.device)).item() > 0
    if short:
        say(f"{variant}: skipped: its embedding tables need {need / 2**30:.1f} GiB per GPU, "
            f"{free / 2**30:.1f} GiB are free (lower --max-ind-range)", env.is_main)
    return not short


@one_line_errors
def main(argv=None) -> int:
    p = tool_parser("python -m benchmarks.dlrm.throughput", __doc__, None, warmup=10, iters=30,
                    variants_help=f"comma-separated, of {', '.join(VARIANTS)} (default: "
                                  f"{DEFAULT_VARIANTS[False]}; under torchrun "
                                  f"{DEFAULT_VARIANTS[True]})", profile_kernels=25)
    p.add_argument("--batch-size", type=int, default=55296, help="global batch")
    p.add_argument("--max-ind-range", type=int, default=10_000_000,
                   help="cap on every table's rows (40000000: the reference's full tables)")
    a = p.parse_args(argv)
    variants = gpu_variants(p, a.variants or ",".join(VARIANTS), VARIANTS)
    env = dist.init_distributed("cuda")
    if a.variants is None:
        variants = DEFAULT_VARIANTS[env.distributed].split(",")
    try:
        return _run(p, a, variants, env)
    finally:
        dist.shutdown()


def _run(p, a, variants: list[str], env: dist.DistEnv) -> int:
    single = [v for v in variants if not {i.partition("=")[0] for i in VARIANTS[v]} & SHARDED]
    if env.distributed and single:
        p.error(f"{', '.join(single)}: one nn.EmbeddingBag a table runs in one process only: "
                "run it without torchrun")
    precision = Precision(a.precision, "cuda")
    precision.apply_backend_flags()
    lp = precision.autocast_dtype
    # the formula reads only the flags: the workload is not built (no tables)
    mfu = MFU.measure(lambda: (DLRMWorkload(workload_args(variants[0], a),
                                            env, precision),
                               None), env.device, env.world_size)
    say(str(mfu), env.is_main)
    rate_limit = copy_rate(env.device)
    say(f"device-to-device copy: {rate_limit / 1e9:.0f} GB/s (read + write)", env.is_main)
    rows = []
    for v in variants:
        args = workload_args(v, a)
        need = table_bytes(args, env.world_size, lp.itemsize if lp else 0)
        if not fits(v, need, env):
            rows.append({"variant": v, "skipped": "embedding tables exceed free GPU memory",
                         "table_gib_per_gpu": need / 2**30})
            continue
        wl = DLRMWorkload(args, env, precision)
        wl.setup()
        if v == "plain-compiled":
            wl._forward = torch.compile(wl._forward)
        state = wl.synthetic_rng.get_state()
        batch = wl.synthetic_batch(a.batch_size)
        ids = data.synthetic_batch(a.batch_size, wl.sizes,   # the same batch's ids
                                   torch.Generator().set_state(state)).sparse
        step = graphed_step(wl.train_step, wl.capture_policy(), args.cuda_graph, env.device,
                            a.precision, "dlrm")
        capture = step.warmup_steps + 1 if step.enabled else 0   # eager steps, then the capture
        m = time_steps(v, step, batch, env.device, a.warmup + capture, a.iters)
        rate = a.batch_size * m.iters / m.seconds
        moved = embedding_bytes(ids, args.embedding_dim,
                                torch.tensor(table_offsets(wl.sizes), device=env.device),
                                lp.itemsize if lp else 4,
                                masters="bf16-tables" not in args.optimisations
                                ) * m.iters / m.seconds / env.world_size
        rows.append({"variant": v, "samples_per_second": rate, **mfu.row(rate),
                     "embedding_gb_per_second": moved / 1e9,
                     "copy_rate_gb_per_second": rate_limit / 1e9,
                     "peak_memory_gib": m.peak_memory_bytes / 2**30,
                     "table_gib_per_gpu": need / 2**30})
        say(f"{v:38s} batch {a.batch_size} on {env.world_size} GPU(s) {a.precision}: "
            f"{rate:10.0f} samples/s  {mfu.text(rate)}  embeddings {moved / 1e9:5.0f} GB/s "
            f"({moved / rate_limit:.1%} of copy)  peak "
            f"{m.peak_memory_bytes / 2**30:5.1f} GiB (rank 0)", env.is_main)
        plan_ms = plan_time_ms(wl, ids)
        if plan_ms is not None:
            rows[-1]["plan_ms"] = plan_ms
            say(f"{'':38s} index plan {plan_ms:.2f} ms a batch (its stream's elapsed time), not "
                f"in the step: prefetch computes it during the step before, on its own stream",
                env.is_main)
        if a.profile:
            say(kernel_breakdown(step, batch, top=a.profile), env.is_main)
        step.release()
        del wl, batch, step
        gc.collect()
        torch.cuda.empty_cache()
    timed = [r for r in rows if "samples_per_second" in r]
    for r in timed[1:]:
        say(f"{r['variant']:38s} x{r['samples_per_second'] / timed[0]['samples_per_second']:.2f} "
            f"vs {timed[0]['variant']}", env.is_main)
    if a.json and env.is_main:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "world_size": env.world_size, "batch_size": a.batch_size,
                       "max_ind_range": a.max_ind_range, "precision": a.precision,
                       "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
