"""Derived figures, report.json, report.csv, PNG plots and the ``--compare`` ratio table."""

from __future__ import annotations

import csv
import json
from pathlib import Path

CSV_COLUMNS = ("timestamp", "framework", "algorithm", "stage", "precision", "batch_size", "gpus",
               "samples_per_s", "latency_ms", "implementation", "p_whole", "p_train", "p_core",
               "e2e_time", "peak_memory_gib", "mfu", "weak_scaling_efficiency",
               "speedup_vs_fp32", "speedup_vs_tf32", "latency_p50_ms", "latency_p90_ms",
               "latency_p95_ms", "latency_p99_ms")


def key(p: dict, **over) -> tuple:
    d = {**p, **over}
    return (d["implementation"], d["stage"], d["precision"], d["batch_size"], d["gpus"])


def derive(points: list[dict], peak_tflops: dict) -> None:
    """Add MFU, weak-scaling efficiency, precision speed-ups and baseline ratios in place."""
    by_key = {key(p): p for p in points}
    for p in points:
        peak = peak_tflops.get(p["precision"])
        flops = p.get("flops_per_sample")
        p["mfu"] = (flops * p["samples_per_s"] / (p["gpus"] * peak * 1e12)
                    if flops and peak else None)
        one = by_key.get(key(p, gpus=1))
        p["weak_scaling_efficiency"] = (p["samples_per_s"] / (p["gpus"] * one["samples_per_s"])
                                        if one else None)
        for ref in ("fp32", "tf32"):
            other = by_key.get(key(p, precision=ref))
            p[f"speedup_vs_{ref}"] = p["samples_per_s"] / other["samples_per_s"] if other else None
    for p in points:
        if p["implementation"] == "ours":
            p["ratio_vs"] = {q["implementation"]: p["samples_per_s"] / q["samples_per_s"]
                             for q in points if q["implementation"] != "ours"
                             and key(q, implementation="ours") == key(p)}


def csv_row(p: dict, timestamp: str) -> dict:
    lat = p["latency_ms"]
    return {
        "timestamp": timestamp, "framework": p["framework"], "algorithm": p["algorithm"],
        "stage": p["stage"], "precision": p["precision"], "batch_size": p["batch_size"],
        "gpus": p["gpus"], "samples_per_s": round(p["samples_per_s"], 3),
        "latency_ms": round(lat["mean"], 4), "implementation": p["implementation"],
        "p_whole": _r(p.get("p_whole")), "p_train": _r(p["p_train"]), "p_core": _r(p["p_core"]),
        "e2e_time": _r(p.get("e2e_time")), "peak_memory_gib": _r(p["peak_memory_bytes"] / 2**30),
        "mfu": _r(p["mfu"], 4), "weak_scaling_efficiency": _r(p["weak_scaling_efficiency"], 4),
        "speedup_vs_fp32": _r(p["speedup_vs_fp32"], 4),
        "speedup_vs_tf32": _r(p["speedup_vs_tf32"], 4),
        **{f"latency_{q}_ms": round(lat[q], 4) for q in ("p50", "p90", "p95", "p99")},
    }


def _r(x, digits: int = 3):
    return "" if x is None else round(x, digits)


def write(report: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(out / "report.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(csv_row(p, report["timestamp"]) for p in report["points"])
    return [out / "report.json", out / "report.csv", *plot(report["points"], out)]


def _label(p: dict) -> str:
    return p["precision"] if p["implementation"] == "ours" else \
        f"{p['implementation']} {p['precision']}"


def plot(points: list[dict], out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [s for s in ("train", "infer") if any(p["stage"] == s for p in points)]
    files = []
    if not stages:
        return files
    # 1. throughput vs GPUs (largest batch of each series) with ideal linear scaling
    fig, axes = plt.subplots(1, len(stages), figsize=(6 * len(stages), 4.5), squeeze=False)
    for ax, stage in zip(axes[0], stages):
        series: dict[str, list[dict]] = {}
        for p in points:
            if p["stage"] == stage:
                series.setdefault(f"{_label(p)} b{p['batch_size']}", []).append(p)
        biggest = {}
        for name, ps in series.items():
            label = name.rsplit(" b", 1)[0]
            if label not in biggest or ps[0]["batch_size"] > biggest[label][0]["batch_size"]:
                biggest[label] = ps
        for label, ps in sorted(biggest.items()):
            ps = sorted(ps, key=lambda p: p["gpus"])
            xs = [p["gpus"] for p in ps]
            line, = ax.plot(xs, [p["samples_per_s"] for p in ps], "o-",
                            label=f"{label} (batch {ps[0]['batch_size']}/GPU)")
            one = next((p for p in ps if p["gpus"] == 1), None)
            if one:
                ax.plot(xs, [one["samples_per_s"] * x for x in xs], "--", color=line.get_color(),
                        alpha=0.5)
        ax.set(title=f"{stage}: throughput vs GPUs (dashed: ideal)", xlabel="GPUs",
               ylabel="samples/s")
        ax.set_xticks(sorted({p["gpus"] for p in points}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    files.append(_save(fig, out / "throughput_vs_gpus.png"))
    # 2. throughput vs batch size per precision (fewest GPUs)
    fig, axes = plt.subplots(1, len(stages), figsize=(6 * len(stages), 4.5), squeeze=False)
    gmin = min(p["gpus"] for p in points)
    for ax, stage in zip(axes[0], stages):
        series = {}
        for p in points:
            if p["stage"] == stage and p["gpus"] == gmin:
                series.setdefault(_label(p), []).append(p)
        for label, ps in sorted(series.items()):
            ps = sorted(ps, key=lambda p: p["batch_size"])
            ax.plot([p["batch_size"] for p in ps], [p["samples_per_s"] for p in ps], "o-",
                    label=label)
        ax.set(title=f"{stage}: throughput vs batch size ({gmin} GPU)", xlabel="batch size per GPU",
               ylabel="samples/s")
        ax.set_xticks(sorted({p["batch_size"] for p in points}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    files.append(_save(fig, out / "throughput_vs_batch.png"))
    # 3. inference latency percentiles per batch size
    infer = [p for p in points if p["stage"] == "infer" and p["gpus"] == gmin]
    if infer:
        labels = sorted({_label(p) for p in infer})
        fig, axes = plt.subplots(1, len(labels), figsize=(4.5 * len(labels), 4), squeeze=False)
        qs = ("p50", "p90", "p95", "p99")
        for ax, label in zip(axes[0], labels):
            ps = sorted((p for p in infer if _label(p) == label), key=lambda p: p["batch_size"])
            width = 0.8 / len(qs)
            for i, q in enumerate(qs):
                ax.bar([j + i * width for j in range(len(ps))],
                       [p["latency_ms"][q] for p in ps], width, label=q)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ps))],
                          [str(p["batch_size"]) for p in ps])
            ax.set(title=f"inference latency: {label}", xlabel="batch size",
                   ylabel="ms per batch")
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=7)
        files.append(_save(fig, out / "latency.png"))
    return files


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def summary_table(points: list[dict]) -> str:
    rows = []
    for p in points:
        ratios = " ".join(f"{k}:{v:.2f}x" for k, v in p.get("ratio_vs", {}).items())
        rows.append([p["implementation"], p["stage"], p["precision"], p["batch_size"], p["gpus"],
                     f"{p['samples_per_s']:.1f}", f"{p['latency_ms']['mean']:.2f}",
                     f"{p['latency_ms']['p99']:.2f}",
                     "" if p["mfu"] is None else f"{100 * p['mfu']:.1f}%",
                     f"{p['peak_memory_bytes'] / 2**30:.2f}", ratios])
    return table(["impl", "stage", "precision", "batch", "gpus", "samples/s", "lat ms",
                  "p99 ms", "MFU", "mem GiB", "ours vs"], rows)


def compare(a_path: Path, b_path: Path) -> str:
    a, b = (json.loads(Path(x).read_text()) for x in (a_path, b_path))
    b_by = {key(p): p for p in b["points"]}
    rows = []
    for p in a["points"]:
        q = b_by.get(key(p))
        if q:
            rows.append([*key(p), f"{p['samples_per_s']:.1f}", f"{q['samples_per_s']:.1f}",
                         f"{q['samples_per_s'] / p['samples_per_s']:.3f}"])
    if not rows:
        return "no common points (implementation, stage, precision, batch, gpus)"
    return table(["impl", "stage", "precision", "batch", "gpus", "A samples/s", "B samples/s",
                  "B/A"], rows)
