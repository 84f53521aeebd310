"""Baselines in another framework: a worker module run by that framework's own Python.

A workload's ``throughput.py`` lists an ``ExternalWorker`` in ``BASELINES`` next to its
torch factories. The harness runs it as one process, ``PYTHON -m MODULE --mode M
--precision P --batch-size B --iters N --warmup W --workload-args=ARGS --out POINT.json``,
outside torchrun; the module writes the record that ``common.bench.record`` builds (or
``{"skipped": reason}``) and must not import torch.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ExternalWorker:
    framework: str          # the report's framework column, e.g. "mxnet"
    module: str             # e.g. "benchmarks.resnet.mxnet_worker"
    python_var: str         # environment variable naming the interpreter, e.g. MXNET_PYTHON
    venv: str               # else <repo>/<venv>/bin/python
    install: str            # the command that builds that venv
    cuda_reason: str | None = None  # why it cannot run where the harness uses CUDA

    def python(self, repo: Path) -> Path:
        return Path(os.environ.get(self.python_var) or repo / self.venv / "bin" / "python")

    def skip_reason(self, name: str, cuda: bool, gpus: int, repo: Path) -> str | None:
        if cuda and self.cuda_reason:
            return self.cuda_reason
        if gpus > 1:
            return f"{name} runs as one {self.framework} process: use -n 1"
        python = self.python(repo)
        if not python.is_file():
            return (f"{name} needs {self.framework}'s own Python and {python} is missing: "
                    f"run `{self.install}` (or set {self.python_var})")
        return None


def baseline_groups(workload: str) -> dict:
    """``benchmarks.<workload>.throughput.BASELINES``: group -> {variant: torch factory or
    ``ExternalWorker``}; empty when the workload declares none."""
    try:
        module = importlib.import_module(f"benchmarks.{workload}.throughput")
    except ModuleNotFoundError:
        return {}
    return getattr(module, "BASELINES", {})
