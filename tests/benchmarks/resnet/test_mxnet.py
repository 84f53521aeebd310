"""The MXNet Gluon ResNet-50 baseline: its model against ours, its skips, and a CPU sweep.

Needs ``.venv-mxnet`` (``make mxnet-venv``): skipped without it, failed under CI, which
builds it.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.resnet.model import ResNet50, mllog_tensor_name
from benchmarks.resnet.throughput import MXNET
from common.bench.__main__ import parser, plan
from common.throughput import meta_train_flops

REPO = Path(__file__).resolve().parents[3]
IMAGE = 32

DESCRIBE = f"""
import json
import mxnet as mx
from mxnet.gluon import nn
from benchmarks.resnet import mxnet_worker as m

net = m.build_model()
trainable = {{p.name: p for p in net.collect_params().values() if p.grad_req != "null"}}
strides = {{}}
net.apply(lambda b: strides.update({{b.weight.name: list(b._kwargs["stride"])}})
          if isinstance(b, nn.Conv2D) else None)
h = net.pool0(mx.nd.relu(net.bn0(net.conv0(mx.nd.zeros((1, 3, 224, 224))))))
shapes = [h.shape]
for i in range(1, 5):
    h = getattr(net, f"stage{{i}}")(h)
    shapes.append(h.shape)
print(json.dumps({{
    "count": m.trainable_parameters(net),
    "params": {{k: list(p.shape) for k, p in trainable.items()}},
    "gammas": {{k: sorted(set(p.data().asnumpy().tolist()))
               for k, p in trainable.items() if k.endswith("_gamma")}},
    "strides": strides, "shapes": shapes, "out": net(mx.nd.zeros((1, 3, 224, 224))).shape,
    "flops": {{mode: m.flops_per_sample(net, {IMAGE}, mode) for mode in ("infer", "train")}},
}}))
"""


@pytest.fixture(scope="module")
def mxnet_python() -> Path:
    python = MXNET.python(REPO)
    if not python.is_file():
        why = f"{python} is missing: run `make mxnet-venv`"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return python


@pytest.fixture(scope="module")
def gluon(mxnet_python):
    proc = subprocess.run([str(mxnet_python), "-c", DESCRIBE], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_gluon_model_is_ours_layer_for_layer(gluon):
    ours = ResNet50()
    norms = {f"{n}.{p}" for n, m in ours.named_modules() if isinstance(m, torch.nn.BatchNorm2d)
             for p in ("weight", "bias")}
    params = {mllog_tensor_name(n, n in norms): list(p.shape) for n, p in ours.named_parameters()}
    assert gluon["count"] == sum(p.numel() for p in ours.parameters()) == 25_557_032
    assert gluon["params"] == params                       # same names, order-free, and shapes
    strides = {mllog_tensor_name(f"{n}.weight", False): list(m.stride)
               for n, m in ours.named_modules() if isinstance(m, torch.nn.Conv2d)}
    assert gluon["strides"] == strides                     # v1.5: stride on the 3x3 conv
    assert gluon["strides"]["stage2_unit1_conv2_weight"] == [2, 2]
    gammas = {mllog_tensor_name(f"{n}.weight", True): sorted(set(m.weight.tolist()))
              for n, m in ours.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
    assert gluon["gammas"] == gammas                       # zero gamma on each block's bn3
    assert gluon["gammas"]["stage1_unit1_bn3_gamma"] == [0.0]
    with torch.no_grad():
        h = ours.pool0(ours.relu(ours.bn0(ours.conv0(torch.zeros(1, 3, 224, 224)))))
        shapes = [list(h.shape)]
        for i in range(1, 5):
            h = getattr(ours, f"stage{i}")(h)
            shapes.append(list(h.shape))
    assert gluon["shapes"] == shapes and gluon["out"] == [1, 1000]


def test_gluon_flops_equal_torch_counter(gluon):
    with torch.device("meta"):
        model, x = ResNet50(), torch.empty(2, 3, IMAGE, IMAGE)
    with FlopCounterMode(display=False) as counter:
        model(x)
    assert gluon["flops"]["infer"] == counter.get_total_flops() / 2
    assert gluon["flops"]["train"] == meta_train_flops(lambda: ResNet50(1000), (3, IMAGE, IMAGE))


def _plan(monkeypatch, argv, device="cpu", python=sys.executable):
    monkeypatch.setenv("MXNET_PYTHON", str(python))
    env = {"device": device, "cpu_count": 8, "gpu_count": 8 if device == "cuda" else 0,
           "bf16_supported": True, "gpu": "H100" if device == "cuda" else None}
    run, skipped = plan(parser().parse_args(["resnet", "--precision", "fp32", *argv]), env)
    return ({(p["implementation"], p["gpus"]) for p in run},
            {(s["implementation"], s["gpus"]): s["reason"] for s in skipped})


def test_skip_reasons(monkeypatch, tmp_path):
    argv = ["--baseline", "mxnet,torchvision-eager", "-n", "1,2"]
    run, skipped = _plan(monkeypatch, argv)
    assert run == {("ours", 1), ("ours", 2), ("mxnet-gluon", 1)}
    assert "runs as one mxnet process" in skipped[("mxnet-gluon", 2)]
    assert "needs torchvision" in skipped[("torchvision-eager", 1)]
    assert not any("torchvision" in r for k, r in skipped.items() if k[0] == "mxnet-gluon")
    run, skipped = _plan(monkeypatch, argv, device="cuda")
    assert ("torchvision-eager", 2) in run and not any(k[0] == "mxnet-gluon" for k in run)
    assert "499.4 MB" in skipped[("mxnet-gluon", 1)] and "--device cpu" in skipped[
        ("mxnet-gluon", 1)]
    _, skipped = _plan(monkeypatch, argv, python=tmp_path / "none")
    assert "run `make mxnet-venv`" in skipped[("mxnet-gluon", 1)]
    _, skipped = _plan(monkeypatch, [*argv, "--data", "real"])
    assert skipped[("mxnet-gluon", 1)] == "baselines run on synthetic data only"


@pytest.mark.slow
def test_sweep_with_mxnet_baseline(mxnet_python, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MXNET_PYTHON=str(mxnet_python))
    proc = subprocess.run(
        [sys.executable, "-m", "common.bench", "resnet", "--baseline", "mxnet", "-n", "1",
         "-b", "2", "--precision", "fp32", "--mode", "train,infer", "--iters", "2",
         "--warmup", "1", "--device", "cpu", "--workload-args", f"--image-size {IMAGE}",
         "-o", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "report.json").read_text())
    assert not doc["failed"] and not doc["skipped"]
    points = {(p["implementation"], p["stage"]): p for p in doc["points"]}
    assert set(points) == {(i, s) for i in ("ours", "mxnet-gluon") for s in ("train", "infer")}
    for stage in ("train", "infer"):
        mx, ours = points["mxnet-gluon", stage], points["ours", stage]
        assert (mx["framework"], ours["framework"]) == ("mxnet", "pytorch")
        assert mx["samples"] == 2 * 2
        assert mx["samples_per_s"] * mx["seconds"] == pytest.approx(mx["samples"], rel=1e-9)
        assert mx["p_core"] * mx["core_seconds"] == pytest.approx(mx["samples"], rel=1e-9)
        assert mx["flops_per_sample"] == pytest.approx(ours["flops_per_sample"], rel=0.01)
        assert 0 < mx["latency_ms"]["p50"] <= mx["latency_ms"]["p99"] and mx["output_finite"]
        assert ours["ratio_vs"] == {
            "mxnet-gluon": pytest.approx(ours["samples_per_s"] / mx["samples_per_s"])}
    with open(tmp_path / "report.csv") as f:
        frameworks = {(r["implementation"], r["framework"]) for r in csv.DictReader(f)}
    assert frameworks == {("ours", "pytorch"), ("mxnet-gluon", "mxnet")}
    assert "mxnet-gluon:" in proc.stdout                   # the summary's "ours vs" column
