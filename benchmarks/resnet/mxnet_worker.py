"""ResNet-50 v1.5 in MXNet Gluon: one throughput point on the CPU, one JSON record.

    .venv-mxnet/bin/python -m benchmarks.resnet.mxnet_worker --mode train --precision fp32 \
        --batch-size 32 --iters 20 --warmup 5 --workload-args="--image-size 224" --out POINT.json

The second framework of ``python -m common.bench resnet --baseline mxnet``. It runs under
MXNet's own venv (``make mxnet-venv``: mxnet 1.9.1 needs numpy<1.24, which the torch venv
cannot take) and imports no torch. The model is ``model.py``'s, layer for layer (stride on
the 3x3 convolution, ``conv1sc``/``bnsc`` projection shortcuts, zero gamma on each block's
last BN, 25,557,032 parameters), hybridized; a training step is forward, softmax cross-entropy
with label smoothing 0.1, backward and momentum SGD (gluon Trainer), an inference step the
forward pass, on one synthetic NCHW batch made once. Every step ends with ``mx.nd.waitall()``
(MXNet runs asynchronously), so per-step latencies are real.

CPU and fp32 only: the only MXNet GPU builds for recent CUDA on PyPI are ``mxnet-cu112`` and
``mxnet-cu117`` 1.9.1, and ``mxnet_cu112-1.9.1-py3-none-manylinux2014_x86_64.whl`` is 499.4 MB,
while the GPU machines lent to this suite have no network and accept at most 64 MiB of carried
files. Other precisions are written as ``{"skipped": reason}``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

from common.bench.record import point_record
from common.cli import OneLineParser

STAGE_DEPTHS = (3, 4, 6, 3)
STAGE_WIDTHS = (64, 128, 256, 512)
EXPANSION = 4
NUM_CLASSES = 1000


def _conv(cin: int, cout: int, k: int, stride: int = 1, prefix: str = "") -> nn.Conv2D:
    return nn.Conv2D(cout, k, strides=stride, padding=k // 2, use_bias=False, in_channels=cin,
                     prefix=prefix)


class Bottleneck(gluon.HybridBlock):
    def __init__(self, cin: int, width: int, stride: int, **kwargs):
        super().__init__(**kwargs)
        cout = width * EXPANSION
        self.has_shortcut = stride != 1 or cin != cout
        with self.name_scope():
            self.conv1 = _conv(cin, width, 1, prefix="conv1_")
            self.bn1 = nn.BatchNorm(in_channels=width, prefix="bn1_")
            self.conv2 = _conv(width, width, 3, stride, prefix="conv2_")
            self.bn2 = nn.BatchNorm(in_channels=width, prefix="bn2_")
            self.conv3 = _conv(width, cout, 1, prefix="conv3_")
            self.bn3 = nn.BatchNorm(in_channels=cout, gamma_initializer="zeros", prefix="bn3_")
            if self.has_shortcut:
                self.conv1sc = _conv(cin, cout, 1, stride, prefix="conv1sc_")
                self.bnsc = nn.BatchNorm(in_channels=cout, prefix="bnsc_")

    def hybrid_forward(self, F, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        shortcut = self.bnsc(self.conv1sc(x)) if self.has_shortcut else x
        return F.relu(out + shortcut)


class ResNet50(gluon.HybridBlock):
    def __init__(self, num_classes: int = NUM_CLASSES, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv0 = _conv(3, 64, 7, 2, prefix="conv0_")
            self.bn0 = nn.BatchNorm(in_channels=64, prefix="bn0_")
            self.pool0 = nn.MaxPool2D(3, strides=2, padding=1)
            cin = 64
            for i, (depth, width) in enumerate(zip(STAGE_DEPTHS, STAGE_WIDTHS), 1):
                stage = nn.HybridSequential(prefix=f"stage{i}_")
                with stage.name_scope():
                    for u in range(depth):
                        stage.add(Bottleneck(cin, width, 2 if (u == 0 and i > 1) else 1,
                                             prefix=f"unit{u + 1}_"))
                        cin = width * EXPANSION
                setattr(self, f"stage{i}", stage)
            self.pool1 = nn.GlobalAvgPool2D()
            self.fc1 = nn.Dense(num_classes, in_units=cin, weight_initializer=mx.init.Normal(0.01),
                                prefix="fc1_")

    def hybrid_forward(self, F, x):
        x = self.pool0(F.relu(self.bn0(self.conv0(x))))
        x = self.stage4(self.stage3(self.stage2(self.stage1(x))))
        return self.fc1(F.flatten(self.pool1(x)))


class SmoothedCrossEntropy(gluon.HybridBlock):
    """Mean softmax cross-entropy against (1 - eps) one-hot + eps / classes, as torch's
    ``CrossEntropyLoss(label_smoothing=eps)``."""

    def __init__(self, eps: float, classes: int = NUM_CLASSES, **kwargs):
        super().__init__(**kwargs)
        self.on, self.off, self.classes = 1 - eps + eps / classes, eps / classes, classes

    def hybrid_forward(self, F, logits, labels):
        target = F.one_hot(labels, self.classes, on_value=self.on, off_value=self.off)
        return F.mean(-F.sum(F.log_softmax(logits, axis=1) * target, axis=1))


def build_model() -> ResNet50:
    """``model.py``'s initialisation: Kaiming-normal (fan-out) convolutions, BN gamma 1 (0 on
    each block's last), beta 0, fc1 weight N(0, 0.01), bias 0."""
    net = ResNet50(prefix="")  # parameter names as MLPerf's: stage1_unit1_conv1_weight, ...
    net.initialize(mx.init.MSRAPrelu(factor_type="out", slope=0.0), ctx=mx.cpu())
    return net


def trainable_parameters(net: gluon.Block) -> int:
    return sum(int(np.prod(p.shape)) for p in net.collect_params().values()
               if p.grad_req != "null")


def flops_per_sample(net: gluon.Block, image_size: int, mode: str) -> float:
    """Convolution and dense FLOPs per image from the layer shapes, as torch's FlopCounterMode
    counts them: 2 x MACs forward; training adds the grad-weight and grad-input passes (each as
    much again), without grad-input for the layers that read the images."""
    x = mx.nd.zeros((1, 3, image_size, image_size))
    layers: list[tuple[float, bool]] = []

    def hook(block, inputs, output):
        weight = block.weight.shape
        macs = output.size * int(np.prod(weight[1:]))
        layers.append((2.0 * macs, inputs[0] is x))

    handles = []

    def watch(block):
        if isinstance(block, (nn.Conv2D, nn.Dense)):
            handles.append(block.register_forward_hook(hook))

    net.apply(watch)
    net(x)
    for h in handles:
        h.detach()
    forward = sum(f for f, _ in layers)
    if mode == "infer":
        return forward
    return 3 * forward - sum(f for f, reads_images in layers if reads_images)


def build_step(net: ResNet50, mode: str, label_smoothing: float):
    """The timed step: (x, y) -> output, synchronised."""
    net.hybridize(static_alloc=True, static_shape=True)
    if mode == "infer":
        def infer(x, y):
            out = net(x)
            mx.nd.waitall()
            return out
        return infer
    criterion = SmoothedCrossEntropy(label_smoothing)
    criterion.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9, "wd": 5e-5})

    def train(x, y):
        with autograd.record():
            loss = criterion(net(x), y)
        loss.backward()
        trainer.step(1)  # the loss is already a batch mean
        mx.nd.waitall()
        return loss
    return train


def measure(a, image_size: int, label_smoothing: float) -> dict:
    mx.random.seed(0)
    net = build_model()
    flops = flops_per_sample(net, image_size, a.mode)
    step = build_step(net, a.mode, label_smoothing)
    x = mx.nd.random.normal(shape=(a.batch_size, 3, image_size, image_size))
    y = mx.nd.random.randint(0, NUM_CLASSES, shape=(a.batch_size,)).astype("float32")
    for _ in range(a.warmup):
        step(x, y)
    steps = []
    t0 = time.perf_counter()
    for _ in range(a.iters):
        begin = time.perf_counter()
        out = step(x, y)
        steps.append(time.perf_counter() - begin)
    window = time.perf_counter() - t0
    return point_record(iters=a.iters, warmup=a.warmup, per_step=a.batch_size, window=window,
                        core=sum(steps), steps=steps, peak_memory=0, flops=flops, mode=a.mode,
                        finite=bool(np.isfinite(out.asnumpy()).all()))


def workload_args(text: str) -> tuple[argparse.Namespace, list[str]]:
    """The workload flags this model takes (``--image-size``, ``--label-smoothing``) and the
    rest, which apply to the torch implementation only."""
    p = OneLineParser(prog="--workload-args", add_help=False)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    return p.parse_known_args(shlex.split(text))


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m benchmarks.resnet.mxnet_worker",
                      description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("train", "infer"), required=True)
    p.add_argument("--precision", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--workload-args", default="", help="workload flags, one string")
    p.add_argument("--out", type=Path, required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if min(a.iters, a.warmup, a.batch_size) < 1:
        p.error("--iters, --warmup and --batch-size must be >= 1")
    wl, ignored = workload_args(a.workload_args)
    if a.precision != "fp32":
        record = {"skipped": f"the MXNet adapter runs fp32 on the CPU only, not {a.precision}: "
                             "MXNet's GPU build (a 499.4 MB wheel) cannot reach the GPU "
                             "machines, which have no network and take 64 MiB of files"}
    else:
        record = measure(a, wl.image_size, wl.label_smoothing)
        record.update(framework="mxnet", framework_version=mx.__version__,
                      ignored_workload_args=ignored)
    record.update(gpus=1, device="cpu")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
