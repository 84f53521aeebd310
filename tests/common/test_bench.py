"""The throughput harness on the CPU: tiny ResNet-50, 1 and 2 gloo processes, fp32."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.bench import report

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "common.bench", "resnet", "-n", "1,2", "-b", "2",
         "--precision", "fp32,tf32", "--mode", "train,infer", "--iters", "3", "--warmup", "1",
         "--device", "cpu", "--workload-args", "--image-size 32", "-o", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    logs = "".join(f"\n--- {f.name}:\n" + f.read_text()[-2000:]
                   for f in sorted((out / "logs").glob("*.txt")) if f"{f.stem} ... FAILED"
                   in proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    return out, proc.stdout


@pytest.mark.slow
def test_report_files_and_fields(sweep):
    out, stdout = sweep
    assert "tf32 is a CUDA matmul mode" in stdout           # skipped with the reason
    doc = json.loads((out / "report.json").read_text())
    env = doc["environment"]
    for k in ("torch", "cuda", "gpu", "driver", "commit", "cpu_count"):
        assert k in env
    assert doc["peak_tflops"]["fp32"] > 0
    points = doc["points"]
    assert {(p["stage"], p["gpus"]) for p in points} == {
        ("train", 1), ("train", 2), ("infer", 1), ("infer", 2)}
    assert all(s["precision"] == "tf32" for s in doc["skipped"]) and not doc["failed"]
    for p in points:
        # self-consistent: samples/s x seconds = samples, counted per rank x ranks
        assert p["samples"] == 3 * 2 * p["gpus"]
        assert p["samples_per_s"] * p["seconds"] == pytest.approx(p["samples"], rel=1e-9)
        assert p["p_core"] * p["core_seconds"] == pytest.approx(p["samples"], rel=1e-9)
        assert p["p_whole"] * p["e2e_time"] == pytest.approx(p["total_samples"], rel=1e-9)
        assert p["core_seconds"] <= p["seconds"] * 1.01 and p["e2e_time"] > p["seconds"]
        lat = p["latency_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"]
        assert p["flops_per_sample"] > 0 and 0 < p["mfu"] < 1
        assert p["output_finite"]
        # the collector's pauses while timed, from every rank
        assert len(p["gc"]) == p["gpus"]
        for g in p["gc"]:
            assert g["collections"] >= g["full"] >= 0 and g["ms"] >= g["longest_ms"] >= 0
            # the timed steps a collection ran in: at most one per collection, by index
            assert len(g["steps"]) <= g["collections"] and set(g["steps"]) <= {0, 1, 2}
        # each rank's host time per step: the median and the three slowest steps, slowest first
        assert len(p["host_ms"]) == p["gpus"]
        for h in p["host_ms"]:
            steps, ms = zip(*h["slowest"])
            assert sorted(steps) == [0, 1, 2]   # --iters 3: every timed step, by index
            assert list(ms) == sorted(ms, reverse=True) and ms[-1] <= h["median"] <= ms[0]
            # stacks of those slowest steps that passed twice the median (steps 0-2 have none)
            assert h["stalls"] == {}
            assert h["spawned"] == []   # no subprocess started in a timed step
        # the CUDA allocator's driver calls while timed, from every rank (none on the CPU)
        assert p["allocator"] == [{"cudaMalloc": 0, "cudaFree": 0, "retries": 0}] * p["gpus"]
    assert "gc pauses while timed" in stdout and "host ms per step: median" in stdout
    assert "CUDA allocator calls while timed" in stdout
    assert doc["config"]["gc_freeze"] is False
    train1 = next(p for p in points if p["stage"] == "train" and p["gpus"] == 1)
    train2 = next(p for p in points if p["stage"] == "train" and p["gpus"] == 2)
    assert train1["weak_scaling_efficiency"] == pytest.approx(1.0)
    assert train2["weak_scaling_efficiency"] == pytest.approx(
        train2["samples_per_s"] / (2 * train1["samples_per_s"]))
    assert train1["speedup_vs_fp32"] == pytest.approx(1.0)
    # training FLOPs: the workload's counted figure, 3x the forward pass at 32 px
    infer1 = next(p for p in points if p["stage"] == "infer" and p["gpus"] == 1)
    assert train1["flops_per_sample"] == pytest.approx(3 * infer1["flops_per_sample"], rel=0.02)
    with open(out / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0])[:9] == ("timestamp", "framework", "algorithm", "stage", "precision",
                                  "batch_size", "gpus", "samples_per_s", "latency_ms")
    assert len(rows) == 4 and {r["framework"] for r in rows} == {"pytorch"}
    for name in ("throughput_vs_gpus.png", "throughput_vs_batch.png", "latency.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_compare_prints_ratios(sweep, capsys):
    from common.bench.__main__ import main
    out, _ = sweep
    assert main(["--compare", str(out / "report.json"), str(out / "report.json")]) == 0
    text = capsys.readouterr().out
    assert "B/A" in text and text.count("1.000") == 4


def test_derive_ratios_and_speedups():
    def point(impl, prec, gpus, sps):
        return dict(implementation=impl, stage="train", precision=prec, batch_size=8, gpus=gpus,
                    samples_per_s=sps, flops_per_sample=1e9)
    pts = [point("ours", "fp32", 1, 100.0), point("ours", "amp-bf16", 1, 300.0),
           point("ours", "amp-bf16", 2, 540.0), point("tv", "amp-bf16", 1, 200.0)]
    report.derive(pts, {"amp-bf16": 1.0})
    assert pts[1]["speedup_vs_fp32"] == 3.0 and pts[2]["weak_scaling_efficiency"] == 0.9
    assert pts[1]["ratio_vs"] == {"tv": 1.5}
    assert pts[1]["mfu"] == pytest.approx(300 * 1e9 / 1e12) and pts[0]["mfu"] is None


def test_bad_flags():
    proc = subprocess.run([sys.executable, "-m", "common.bench", "resnet", "--precision",
                           "fp64"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown precision 'fp64'" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "common.bench", "nope"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no workload 'nope'" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "common.bench", "resnet", "--device", "cpu",
                           "--profile", "3"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--profile" in proc.stderr and "needs CUDA" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "common.bench", "resnet", "--device", "cpu",
                           "--bind-cpus"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--bind-cpus" in proc.stderr and "needs CUDA" in proc.stderr


def test_failure_line_is_the_workers_exception_not_torchruns_summary():
    from common.bench.__main__ import failure_line

    torchrun = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                "[rank1]: RuntimeError: Connection closed by peer\n"
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
                "  error_file: <N/A>\n  traceback : To enable traceback see: https://x\n")
    assert failure_line(torchrun) == "RuntimeError: Connection closed by peer"
    assert failure_line("loading\nerror: bad flag --x\n") == "error: bad flag --x"
    assert failure_line("") == "no output"


@pytest.mark.slow
def test_bert_runs_under_the_harness_with_its_flops(tmp_path):
    """Any workload with a synthetic mode runs under the same command: a tiny BERT here."""
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps({"vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "intermediate_size": 64,
                                  "max_position_embeddings": 16}))
    proc = subprocess.run(
        [sys.executable, "-m", "common.bench", "bert", "-n", "1", "-b", "2", "--precision", "fp32",
         "--mode", "train,infer", "--iters", "2", "--warmup", "1", "--device", "cpu",
         "--workload-args", f"--bert-config {config} --max-seq-length 16 --max-predictions 3 "
                            "--opt unpad=16 --synthetic-fill 0.5",
         "-o", str(tmp_path / "out")],
        cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    points = json.loads((tmp_path / "out" / "report.json").read_text())["points"]
    assert {p["stage"] for p in points} == {"train", "infer"}
    train = next(p for p in points if p["stage"] == "train")
    # the workload's own count over the 8 real tokens of each 16 (fill 0.5):
    # 6 * dense params * tokens + attention's 12 * layers * tokens^2 * h
    dense = 4 * 32 * 32 + 2 * 32 * 64
    assert train["flops_per_sample"] == 6 * dense * 8 + 12 * 8 * 8 * 32
    assert train["samples"] == 4 and train["samples_per_s"] > 0


@pytest.mark.slow
def test_spatial_group_counts_each_shared_sample_once(tmp_path):
    """U-Net split over 2 ranks: one sample per step for the pair, FLOPs of a whole sample."""
    args = "--input-shape 64,32,32 --filters 4,8,16,32,40"
    records = {}
    for n, group in ((1, 1), (2, 2)):
        out = tmp_path / f"n{n}"
        proc = subprocess.run(
            [sys.executable, "-m", "common.bench", "unet3d", "-n", str(n), "-b", "1",
             "--precision", "fp32", "--mode", "train", "--iters", "2", "--warmup", "1",
             "--device", "cpu", "--workload-args",
             args + (f" --opt spatial-group={group}" if group > 1 else ""),
             "-o", str(out)],
            cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
            timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (records[n],) = json.loads((out / "report.json").read_text())["points"]
    assert records[1]["samples"] == records[2]["samples"] == 2
    # the halo slices add a little work on the split; otherwise the same whole-sample count
    assert records[2]["flops_per_sample"] == pytest.approx(records[1]["flops_per_sample"],
                                                           rel=0.05)


def test_dlrm_weak_scales_under_the_harness_with_its_global_batch(tmp_path):
    """-b is per process: DLRM's global --batch-size becomes -b times the process count."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "common.bench", "dlrm", "-n", "1,2", "-b", "64", "--precision",
         "fp32", "--mode", "train", "--iters", "2", "--warmup", "1", "--device", "cpu",
         "--gc-freeze", "--workload-args",
         "--max-ind-range 1000 --embedding-dim 8 --arch-mlp-bot 13-16-8 --arch-mlp-top 16-8-1 "
         "--stats-batches 2 --opt fused-sgd,hybrid-embeddings", "-o", str(out)],
        cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    points = doc["points"]
    assert sorted((p["gpus"], p["samples"]) for p in points) == [(1, 128), (2, 256)]
    assert doc["config"]["gc_freeze"] is True
