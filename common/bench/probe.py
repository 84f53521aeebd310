"""The machine a sweep runs on: devices, versions, commit, and measured peak matmul rates.

    python -m common.bench.probe --precisions fp32,tf32,amp-bf16 --out probe.json

Peak: the best rate of a large square matmul in the dtype each precision
computes in (fp32 strict, fp32 with TF32, bf16, fp16); it is the denominator of
model-FLOPs utilisation, measured here rather than taken from a data sheet.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from common.cli import OneLineParser

REPO = Path(__file__).resolve().parents[2]
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "amp-bf16": torch.bfloat16,
          "amp-fp16": torch.float16}


def peak_tflops(precision: str, device: torch.device, seconds: float = 1.0) -> float:
    """The best matmul rate in ``precision`` on ``device``; the TF32 flag is left as it was."""
    n = 8192 if device.type == "cuda" else 1024
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        a = torch.randn(n, n, device=device, dtype=DTYPES[precision])
        b = torch.randn(n, n, device=device, dtype=DTYPES[precision])
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        a @ b
        sync()
        best, deadline = float("inf"), time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            for _ in range(5):
                a @ b
            sync()
            best = min(best, (time.perf_counter() - t0) / 5)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return 2 * n**3 / best / 1e12


def _run(*cmd) -> str | None:
    try:
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict:
    cuda = torch.cuda.is_available()
    env = {
        "host": platform.node(), "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda
        else None,
        "bf16_supported": torch.cuda.is_bf16_supported() if cuda else True,
        "driver": (_run("nvidia-smi", "--query-gpu=driver_version",
                        "--format=csv,noheader") or "").split("\n")[0] or None,
        "commit": _run("git", "rev-parse", "HEAD"),
        "commit_dirty": bool(_run("git", "status", "--porcelain")),
    }
    return env


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m common.bench.probe", description=__doc__.splitlines()[0])
    p.add_argument("--precisions", default="fp32")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    use_cuda = torch.cuda.is_available() and a.device != "cpu"
    device = torch.device("cuda" if use_cuda else "cpu")
    env = environment()
    env["device"] = device.type
    peaks = {}
    for prec in a.precisions.split(","):
        if prec == "tf32" and not use_cuda:
            continue
        if prec == "amp-bf16" and use_cuda and not env["bf16_supported"]:
            continue
        peaks[prec] = peak_tflops(prec, device)
    a.out.write_text(json.dumps({"environment": env, "peak_tflops": peaks}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
