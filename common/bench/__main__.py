"""Throughput sweep of any workload: GPUs x batch sizes x precisions x train/infer.

    python -m common.bench resnet -n 1,2,4,8 -b 64,128,256 \
        --precision fp32,tf32,amp-bf16,amp-fp16 --mode train,infer --iters 100 --warmup 20 \
        --data synthetic -o report/ [--baseline torchvision,mxnet]
    python -m common.bench --compare A/report.json B/report.json

Each point runs under torchrun (``common.bench.worker``), or, for a baseline in
another framework, in that framework's own Python (``common.bench.external``),
and writes its own JSON; points the machine cannot run are skipped with the
reason. The report holds samples/s, FlagPerf's e2e_time, p_whole, p_train,
p_core, peak memory, weak-scaling efficiency, speed-ups against fp32/tf32,
inference latency percentiles and model-FLOPs utilisation against the measured
matmul peak.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from common.bench import report
from common.bench.external import ExternalWorker, baseline_groups
from common.cli import OneLineParser
from common.precision import PRECISIONS

REPO = Path(__file__).resolve().parents[2]


def csv_list(kind):
    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",") if x]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"bad list {text!r}: {exc}") from exc
    return parse


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m common.bench", description=__doc__.splitlines()[0])
    p.add_argument("workload", nargs="?", help="benchmarks/<name>, e.g. resnet")
    p.add_argument("-n", "--gpus", type=csv_list(int), default=[1],
                   help="process counts (GPUs; CPU processes without CUDA)")
    p.add_argument("-b", "--batch-size", type=csv_list(int), default=[64], help="per GPU")
    p.add_argument("--precision", type=csv_list(str), default=["amp-bf16"])
    p.add_argument("--mode", type=csv_list(str), default=["train"])
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--data", choices=("synthetic", "real"), default="synthetic")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True,
                   help="capture our training step as one CUDA graph (as the trainer does)")
    p.add_argument("--gc-freeze", action="store_true",
                   help="freeze the objects setup made out of the garbage collector's reach "
                        "before timing (as the trainer's --gc-freeze does)")
    p.add_argument("--bind-cpus", action="store_true",
                   help="bind each rank to its share of its GPU's local CPU cores (as the "
                        "trainer's --bind-cpus does)")
    p.add_argument("--workload-args", default="", help="extra workload flags, one string")
    p.add_argument("--baseline", type=csv_list(str), default=[],
                   help="baselines from benchmarks/<name>/throughput.py, e.g. torchvision,mxnet")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="after timing, profile this many steps of each point on every GPU: "
                        "communication time, how much of it is exposed, idle time")
    p.add_argument("--timeout", type=int, default=900, help="seconds per point")
    p.add_argument("-o", "--out", type=Path, default=Path("report"))
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"))
    return p


def validate(p, a) -> None:
    if a.compare:
        return
    if not a.workload:
        p.error("name a workload (e.g. resnet) or use --compare A.json B.json")
    bad = [x for x in a.precision if x not in PRECISIONS]
    if bad:
        p.error(f"unknown precision {bad[0]!r}: choose from {', '.join(PRECISIONS)}")
    bad = [x for x in a.mode if x not in ("train", "infer")]
    if bad:
        p.error(f"unknown mode {bad[0]!r}: choose train, infer")
    if min(a.gpus + a.batch_size) < 1 or a.iters < 1 or a.warmup < 1:
        p.error("GPU counts, batch sizes, --iters and --warmup must be >= 1")
    if a.profile < 0 or (a.profile and a.device == "cpu"):
        p.error("--profile takes a number of steps >= 0 and needs CUDA (not --device cpu)")
    if a.bind_cpus and a.device == "cpu":
        p.error("--bind-cpus places each rank next to its GPU: it needs CUDA (not --device cpu)")
    if not (REPO / "benchmarks" / a.workload / "workload.py").is_file():
        p.error(f"no workload {a.workload!r}: benchmarks/{a.workload}/workload.py not found")


def probe(a, out: Path) -> dict:
    path = out / "probe.json"
    cmd = [sys.executable, "-m", "common.bench.probe", "--precisions", ",".join(a.precision),
           "--device", a.device, "--out", str(path)]
    subprocess.run(cmd, cwd=REPO, check=True, timeout=600)
    return json.loads(path.read_text())


def plan(a, env: dict) -> tuple[list[dict], list[dict]]:
    """(points to run, points skipped with the reason)."""
    cuda = env["device"] == "cuda"
    impls = ["ours"] + [v for b in a.baseline for v in baseline_variants(a.workload, b)]
    run, skipped = [], []
    for impl in impls:
        for stage in a.mode:
            for prec in a.precision:
                for bs in a.batch_size:
                    for n in a.gpus:
                        point = dict(implementation=impl, stage=stage, precision=prec,
                                     batch_size=bs, gpus=n)
                        reason = skip_reason(a, env, cuda, point)
                        (skipped if reason else run).append(
                            {**point, "reason": reason} if reason else point)
    return run, skipped


def baseline_variants(workload: str, name: str) -> list[str]:
    groups = baseline_groups(workload)
    group = groups.get(name) or [v for g in groups.values() for v in g if v == name]
    if not group:
        raise SystemExit(f"python -m common.bench: error: {workload} has no baseline {name!r}")
    return list(group)


def external_worker(workload: str, impl: str) -> ExternalWorker | None:
    entry = next((g[impl] for g in baseline_groups(workload).values() if impl in g), None)
    return entry if isinstance(entry, ExternalWorker) else None


def skip_reason(a, env: dict, cuda: bool, p: dict) -> str | None:
    n, prec, impl = p["gpus"], p["precision"], p["implementation"]
    if cuda and n > env["gpu_count"]:
        return f"needs {n} GPUs, this machine has {env['gpu_count']}"
    if not cuda and n > (env["cpu_count"] or 1):
        return f"needs {n} processes, this CPU has {env['cpu_count']} cores"
    if prec == "tf32" and not cuda:
        return "tf32 is a CUDA matmul mode: no CUDA device here"
    if prec == "amp-bf16" and cuda and not env["bf16_supported"]:
        return f"{env['gpu']} has no bf16"
    if impl != "ours" and a.data != "synthetic":
        return "baselines run on synthetic data only"
    external = None if impl == "ours" else external_worker(a.workload, impl)
    if external:
        return external.skip_reason(impl, cuda, n, REPO)
    if impl != "ours" and not cuda:
        return (f"{impl} needs torchvision, which cannot be imported with the CPU-only torch "
                "wheel (its ops need libtorch_cuda)")
    return None


def point_id(p: dict) -> str:
    return f"{p['implementation']}_{p['stage']}_{p['precision']}_b{p['batch_size']}_n{p['gpus']}"


_EXCEPTION = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?((?:\w+\.)*\w*(?:Error|Exception)\b.*)")


def failure_line(output: str) -> str:
    """The line of a failed point's output that says why: the worker's own exception (not
    torchrun's ChildFailedError summary), else the last line mentioning an error."""
    lines = [x.strip() for x in output.splitlines() if x.strip()]
    for line in reversed(lines):
        m = _EXCEPTION.match(line)
        if m and "ChildFailedError" not in line:
            return m.group(1)
    return next((x for x in reversed(lines) if "error" in x.lower()),
                lines[-1] if lines else "no output")


def launch(a, p: dict, out: Path, cuda_here: bool) -> tuple[dict | None, str]:
    """Run one point; (record, '') or (None, why it failed)."""
    pid = point_id(p)
    result = out / "points" / f"{pid}.json"
    result.unlink(missing_ok=True)
    flags = ["--mode", p["stage"], "--precision", p["precision"],
             "--batch-size", str(p["batch_size"]), "--iters", str(a.iters),
             "--warmup", str(a.warmup), f"--workload-args={a.workload_args}",
             "--out", str(result)]
    external = external_worker(a.workload, p["implementation"])
    if a.profile and not external:
        flags += ["--profile", str(a.profile)]
    if external:
        cmd = [str(external.python(REPO)), "-m", external.module, *flags]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(p["gpus"]), "-m", "common.bench.worker",
               "--workload", a.workload, "--implementation", p["implementation"],
               "--data", a.data, "--device", a.device,
               "--cuda-graph" if a.cuda_graph else "--no-cuda-graph",
               *(["--gc-freeze"] if a.gc_freeze else []),
               *(["--bind-cpus"] if a.bind_cpus else []), *flags]
    log = out / "logs" / f"{pid}.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    if a.device == "cpu" or not cuda_here:
        # CPU ranks share the cores: one rank per core share, no oversubscription
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // p["gpus"])))
    t0 = time.perf_counter()
    try:
        with open(log, "w") as f:
            proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env,
                                  timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {a.timeout} s (log: {log})"
    e2e = time.perf_counter() - t0
    if proc.returncode != 0 or not result.is_file():
        why = failure_line(log.read_text(errors="replace"))
        return None, f"exit {proc.returncode}: {why[:300]} (log: {log})"
    record = json.loads(result.read_text())
    if "skipped" in record:
        return {"skipped": record["skipped"]}, ""
    record.update(p, e2e_time=e2e, p_whole=record["total_samples"] / e2e)
    return record, ""


def sweep(a) -> int:
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    print(f"probing the machine and its peak matmul rates ({', '.join(a.precision)}) ...",
          flush=True)
    probed = probe(a, out)
    env = probed["environment"]
    todo, skipped = plan(a, env)
    reasons: dict[str, list[str]] = {}
    for s in skipped:
        reasons.setdefault(s["reason"], []).append(point_id(s))
    for reason, ids in reasons.items():
        more = f" and {len(ids) - 1} more" if len(ids) > 1 else ""
        print(f"skip {ids[0]}{more}: {reason}", flush=True)
    points, failed = [], []
    for i, p in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {point_id(p)} ...", end=" ", flush=True)
        record, why = launch(a, p, out, env["device"] == "cuda")
        if record is None:
            failed.append({**p, "reason": why})
            print(f"FAILED: {why}", flush=True)
        elif "skipped" in record:
            skipped.append({**p, "reason": record["skipped"]})
            print(f"skipped: {record['skipped']}", flush=True)
        else:
            record.setdefault("framework", "pytorch")
            record["algorithm"] = a.workload
            points.append(record)
            print(f"{record['samples_per_s']:.1f} samples/s, "
                  f"{record['latency_ms']['mean']:.2f} ms/step", flush=True)
            for rank, t in enumerate(record.get("profile", [])):
                print(f"    rank {rank}: " + ", ".join(f"{k} {v:.2f}" for k, v in t.items())
                      + " ms/step", flush=True)
            if "gc" in record:
                print("    gc pauses while timed (rank: collections, full ones, ms, longest ms, "
                      "in steps): " + "; ".join(
                          f"{r}: {g['collections']}, {g['full']}, {g['ms']:.1f}, "
                          f"{g['longest_ms']:.1f}, {g['steps']}"
                          for r, g in enumerate(record["gc"])),
                      flush=True)
            if "allocator" in record:
                print("    CUDA allocator calls while timed (rank: cudaMalloc, cudaFree, "
                      "retries): " + "; ".join(
                          f"{r}: {c['cudaMalloc']}, {c['cudaFree']}, {c['retries']}"
                          for r, c in enumerate(record["allocator"])), flush=True)
            for rank, h in enumerate(record.get("host_ms", [])):
                print(f"    rank {rank} host ms per step: median {h['median']:.2f}, slowest "
                      + ", ".join(f"{ms:.1f} (step {i})" for i, ms in h["slowest"]), flush=True)
                for i, command, where in h.get("spawned", []):
                    print(f"      step {i} started {command!r} from: {where}", flush=True)
                for i, what, seconds in h.get("compiles", []):
                    print(f"      step {i} compiled ({what}) for {seconds:.2f} s", flush=True)
                for i, threads in h.get("stalls", {}).items():
                    print(f"      step {i} past 2x the median, at: " + "\n        ".join(threads),
                          flush=True)
        files = write_report(a, probed, points, skipped, failed)  # kept current point by point
    if not todo:
        files = write_report(a, probed, points, skipped, failed)
    if points:
        print(report.summary_table(points))
    print("wrote " + ", ".join(str(f) for f in files))
    return 1 if failed else 0


def write_report(a, probed: dict, points: list, skipped: list, failed: list) -> list[Path]:
    env = probed["environment"]
    report.derive(points, probed["peak_tflops"])
    doc = {"timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(["python -m common.bench", *sys.argv[1:]]),
           "workload": a.workload, "environment": env, "peak_tflops": probed["peak_tflops"],
           "config": {"iters": a.iters, "warmup": a.warmup, "data": a.data,
                      "cuda_graph": a.cuda_graph, "gc_freeze": a.gc_freeze,
                      "bind_cpus": a.bind_cpus,
                      "workload_args": a.workload_args},
           "points": points, "skipped": skipped, "failed": failed}
    return report.write(doc, a.out)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    validate(p, a)
    if a.compare:
        for path in a.compare:
            if not path.is_file():
                p.error(f"{path}: no such report")
        print(report.compare(*a.compare))
        return 0
    return sweep(a)


if __name__ == "__main__":
    sys.exit(main())
