"""LARS (layer-wise adaptive rate scaling) as MLPerf's ResNet-50 references apply it.

For each tensor in a group with ``lars=True`` (convolution and fully connected
weights):

    trust  = eta * ||w|| / (||g|| + wd * ||w|| + eps)   (1 when ||w|| or ||g|| is 0)
    v      = momentum * v + lr * trust * (g + wd * w)
    w      = w - v

Groups with ``lars=False`` (BN parameters and biases) take neither the trust
ratio nor weight decay: ``v = momentum * v + lr * g``. With ``lars=False`` on
every group and weight decay on the weights this is plain momentum SGD, the
alternative optimizer the ruleset allows.

``lr`` may be a float or a 0-dim device tensor; with a tensor the whole step is
host-sync free and can be captured in a CUDA graph. The math uses multi-tensor
(``torch._foreach_*``) kernels.

``step(skip=...)`` takes an optional 0-dim device tensor (1.0 after a loss-scaling
overflow, else 0.0) and applies it without a host sync: with ``keep = 1 - skip``

    v = (momentum * keep + skip) * v + keep * lr * trust * (g + wd * w)
    w = w - keep * v

so a skipped step leaves ``v`` and ``w`` as they were (the gradients must be
finite, e.g. zeroed by ``DeviceLossScaler.unscale``; a zero entry may change its
sign), and ``skip=0`` gives bit for bit the step without ``skip``.

``step(grads=...)`` takes the gradients to use instead of ``p.grad``: one tensor (or
None) per parameter, in the order of the parameter groups, such as the unscaled
gradients that ``DeviceLossScaler.unscale`` returns.
"""

from __future__ import annotations

import torch

from common.norms import stacked_norms


class LARS(torch.optim.Optimizer):
    def __init__(self, params, lr, momentum: float = 0.9, weight_decay: float = 0.0,
                 eta: float = 0.001, epsilon: float = 0.0):
        if momentum < 0 or weight_decay < 0 or eta <= 0:
            raise ValueError("LARS needs momentum >= 0, weight_decay >= 0, eta > 0")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta,
                        epsilon=epsilon, lars=True)
        super().__init__(params, defaults)
        # Made here rather than at the first step, so a compiled step is traced only once.
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self, closure=None, skip: torch.Tensor | None = None,
             grads: list[torch.Tensor | None] | None = None):
        loss = closure() if closure is not None else None
        keep = None if skip is None else 1 - skip
        all_params = [p for group in self.param_groups for p in group["params"]]
        if grads is None:
            grads = [p.grad for p in all_params]
        elif len(grads) != len(all_params):
            raise ValueError(f"LARS.step got {len(grads)} gradients for {len(all_params)} "
                             f"parameters")
        start = 0
        for group in self.param_groups:
            group_grads = grads[start:start + len(group["params"])]
            start += len(group["params"])
            params = [p for p, g in zip(group["params"], group_grads) if g is not None]
            gs = [g for g in group_grads if g is not None]
            if not params:
                continue
            bufs = [self.state[p]["momentum_buffer"] for p in params]
            lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
            if keep is not None:
                lr, momentum = lr * keep, momentum * keep + skip
            updates = torch._foreach_add(gs, params, alpha=wd) if wd else gs
            if group["lars"]:
                w_norm = stacked_norms(params)
                g_norm = stacked_norms(gs)
                trust = group["eta"] * w_norm / (g_norm + wd * w_norm + group["epsilon"])
                trust = torch.where((w_norm > 0) & (g_norm > 0), trust, torch.ones_like(trust))
                updates = torch._foreach_mul(updates, list((trust * lr).unbind(0)))
            else:
                updates = torch._foreach_mul(updates, lr)
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, updates)
            torch._foreach_sub_(params, bufs if keep is None else torch._foreach_mul(bufs, keep))
        return loss


def param_groups(model: torch.nn.Module, weight_decay: float, lars: bool) -> list[dict]:
    """Weights of convolutions and linear layers get weight decay (and LARS when ``lars``);
    BN parameters and biases get neither."""
    decay, no_decay = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            is_norm = isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
            (no_decay if is_norm or name == "bias" else decay).append(p)
    return [dict(params=decay, weight_decay=weight_decay, lars=lars),
            dict(params=no_decay, weight_decay=0.0, lars=False)]
