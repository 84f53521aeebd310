"""A tiny workload (logistic regression on a planted rule) that exercises the shared driver."""

from __future__ import annotations

import torch
from torch import nn

from common.workload import Target, Workload, epoch_points


class ToyWorkload(Workload):
    name = "toy"
    targets = (Target("accuracy", 0.9),)

    @staticmethod
    def add_args(p):
        p.add_argument("--epochs", type=int, default=4)
        p.add_argument("--target", type=float, default=0.9)
        p.add_argument("--fail-at-epoch", type=int, default=0)

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
        return {"opt_name": "sgd", "opt_base_learning_rate": 0.5}

    def initialized_tensors(self):
        return [n for n, _ in self.model.named_parameters()]

    steps_per_epoch = 8

    def eval_points(self):
        return epoch_points(range(1, self.args.epochs + 1), self.steps_per_epoch)

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
        self.opt.zero_grad()
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def evaluate(self):
        return {"accuracy": (self.model(self.x).argmax(1) == self.y).float().mean().item()}
