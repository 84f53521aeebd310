"""SGD with (Nesterov) momentum whose learning rate is a device tensor.

``torch.optim.SGD`` reads a tensor learning rate back to the host; this one
keeps every step on the device (multi-tensor ``foreach`` kernels), so a
whole training step including the update can be captured as a CUDA graph.
The update is PyTorch's: ``buf = m * buf + g`` (``g`` with weight decay
added), then ``p -= lr * (g + m * buf)`` with Nesterov or ``p -= lr * buf``.

``fused`` runs that update as PyTorch's fused SGD kernel (``torch._fused_sgd_``, which
takes the device learning rate too): each parameter, gradient and momentum buffer read
once and written once, instead of five multi-tensor passes, two of them into new tensors.
The plain path is the reference; the two agree to rounding (a test).
"""

from __future__ import annotations

import torch


class DeviceLRSGD(torch.optim.Optimizer):
    def __init__(self, params, lr: torch.Tensor, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, fused: bool = False):
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum needs momentum > 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      nesterov=nesterov))
        self.fused = fused
        for group in self.param_groups:   # buffers exist before any capture
            for p in group["params"]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if self.fused:
                self._fused_step(group, params, grads)
                continue
            if group["weight_decay"]:
                grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
            m = group["momentum"]
            if m:
                bufs = [self.state[p]["momentum_buffer"] for p in params]
                torch._foreach_mul_(bufs, m)
                torch._foreach_add_(bufs, grads)
                grads = torch._foreach_add(grads, bufs, alpha=m) if group["nesterov"] else bufs
            torch._foreach_add_(params, torch._foreach_mul(grads, -group["lr"]))

    def _fused_step(self, group: dict, params: list, grads: list) -> None:
        """One fused kernel call per device and dtype of ``group``'s parameters."""
        m = group["momentum"]
        batches = {}
        for p, g in zip(params, grads):
            batch = batches.setdefault((p.device, p.dtype), ([], [], []))
            batch[0].append(p)
            batch[1].append(g)
            if m:
                batch[2].append(self.state[p]["momentum_buffer"])
        for ps, gs, bufs in batches.values():
            torch._fused_sgd_(ps, gs, bufs, weight_decay=group["weight_decay"], momentum=m,
                              lr=group["lr"], dampening=0.0, nesterov=group["nesterov"],
                              maximize=False, is_first_step=False)
