"""Tiny workloads (logistic regression on a planted rule) that exercise the shared driver.

``ToyWorkload`` is the plain case; the variants cover the rest of the contract:
a dict-valued ``eval_accuracy`` (``DictToy``, named maskrcnn so that the real
checker judges the dict), a lower-is-better metric (``WerToy``, named rnnt),
scoring in a background process (``BackgroundToy``) and batches of dicts with
variable-length tensors (``NestedToy``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from common.hparams import hparam, non_negative, positive
from common.optimisations import COMPILE, Optimisation, Registry, shared
from common.workload import Target, Workload, epoch_points


class ToyWorkload(Workload):
    name = "toy"
    targets = (Target("accuracy", 0.9),)
    steps_per_epoch = 8

    @staticmethod
    def add_args(p):
        p.add_argument("--epochs", type=int, default=4)
        p.add_argument("--target", type=float, default=0.9)
        p.add_argument("--fail-at-epoch", type=int, default=0)
        p.add_argument("--poison-step", type=int, default=0,
                       help="from this 1-based step on, the inputs are NaN")
        p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step")
        p.add_argument("--slow-step", type=int, default=0,
                       help="this 1-based step sleeps 0.5 s more")
        p.add_argument("--eval-every", type=int, default=1, help="epochs between evaluations")

    def build(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(256, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long()
        self.targets = (Target("accuracy", self.args.target),)
        self.model = nn.Linear(8, 2)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.5)
        self.steps_run = 0

    dataset = "toy (planted linear rule)"
    global_batch_size = 32
    train_samples = 256
    eval_samples = 256

    def hyperparameters(self):
        return {"opt_name": "sgd", "opt_base_learning_rate": 0.5,
                "gradient_accumulation_steps": 1}

    def initialized_tensors(self):
        return [n for n, _ in self.model.named_parameters()]

    def eval_points(self):
        return epoch_points(range(self.args.eval_every, self.args.epochs + 1,
                                  self.args.eval_every), self.steps_per_epoch)

    def epoch_batches(self, epoch):
        if epoch == self.args.fail_at_epoch:
            raise RuntimeError("planted failure")
        return list(zip(self.x.split(32), self.y.split(32)))

    def synthetic_batch(self, batch_size):
        return torch.randn(batch_size, 8), torch.randint(0, 2, (batch_size,))

    def training_state(self):
        return list(self.model.parameters())

    def train_step(self, x, y):
        self.steps_run += 1
        if self.args.poison_step and self.steps_run >= self.args.poison_step:
            x = x * float("nan")
        time.sleep(self.args.step_sleep + 0.5 * (self.steps_run == self.args.slow_step))
        self.opt.zero_grad()
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def accuracy(self) -> float:
        return (self.model(self.x).argmax(1) == self.y).float().mean().item()

    def evaluate(self):
        return {"accuracy": self.accuracy()}


class DictToy(ToyWorkload):
    """Two targets met in one evaluation; ``eval_accuracy`` logs both as a dict."""

    name = "maskrcnn"
    targets = (Target("BBOX", 0.45), Target("SEGM", 0.40))

    def build(self):
        super().build()
        self.targets = DictToy.targets

    def evaluate(self):
        acc = self.accuracy()
        return {"BBOX": acc / 2, "SEGM": acc * 0.45}


class WerToy(ToyWorkload):
    """A lower-is-better target: the error rate must fall to at most 0.1."""

    name = "rnnt"
    targets = (Target("wer", 0.1, higher_is_better=False),)

    def build(self):
        super().build()
        self.targets = WerToy.targets

    def evaluate(self):
        return {"wer": 1.0 - self.accuracy()}


def slow_accuracy(outputs) -> dict:
    """The background scorer: sleeps as COCO evaluation would, then scores."""
    predictions, labels, seconds = outputs
    time.sleep(seconds)
    return {"accuracy": (predictions == labels).float().mean().item() * 0.99}


class BackgroundToy(ToyWorkload):
    name = "resnet"
    scorer = staticmethod(slow_accuracy)

    @staticmethod
    def add_args(p):
        ToyWorkload.add_args(p)
        p.add_argument("--score-seconds", type=float, default=1.0)

    def eval_outputs(self):
        return self.model(self.x).argmax(1), self.y, self.args.score_seconds


class NestedToy(ToyWorkload):
    """Batches of (dict of tensors, list of variable-length tensors), as detection targets."""

    def epoch_batches(self, epoch):
        out = []
        for i, (x, y) in enumerate(zip(self.x.split(32), self.y.split(32))):
            boxes = [torch.rand((i + j) % 3, 4) for j in range(len(y))]  # 0-2 boxes per sample
            out.append(({"x": x, "scale": torch.ones(1)}, [y, boxes]))
        return out

    def train_step(self, inputs, targets):
        y, boxes = targets
        assert len(boxes) == len(y) and {b.shape[0] for b in boxes} <= {0, 1, 2}
        return super().train_step(inputs["x"] * inputs["scale"], y)


@dataclass
class ToyHParams:
    lr: float = hparam(0.5, "learning rate", check=positive)
    hidden: int = hparam(0, "hidden width (0: none)", check=non_negative)
    decay_steps: list[int] = hparam([4, 6], "steps where the LR drops", check=positive)


def _scale_lr(wl, factor):
    for g in wl.opt.param_groups:
        g["lr"] *= factor


def _bias_free_select(wl, _):
    wl.impl.bias = False


class OptimisedToy(ToyWorkload):
    """Typed hyper-parameters and a registry: ``double-lr`` and its dependant ``halve-lr``
    (the same step together), ``scale-lr=F``, a selection before ``build()``, and a pair that
    exclude each other."""

    hparams = ToyHParams
    optimisations = Registry(
        Optimisation("double-lr", "twice the LR", apply=lambda wl, _: _scale_lr(wl, 2)),
        Optimisation("halve-lr", "half the LR", requires=("double-lr",),
                     apply=lambda wl, _: _scale_lr(wl, 0.5)),
        Optimisation("scale-lr", "LR times F", value_type=float, default=1.0,
                     apply=_scale_lr),
        Optimisation("no-bias", "a linear without bias", select=_bias_free_select,
                     excludes=("gpu-thing",)),
        Optimisation("gpu-thing", "needs a GPU", cuda=True, apply=lambda wl, _: None),
        shared(COMPILE, apply=lambda wl, mode: None))

    def build(self):
        super().build()
        self.model = nn.Linear(8, 2, bias=getattr(self.impl, "bias", True))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=self.hp.lr)
