"""The dropout seeds of BERT's Triton kernels (``triton-attention``, ``triton-layernorm``)
drawn once a forward pass, as one tensor, by a hook on the network: one random kernel a
micro-batch where a draw a call launched 72 in BERT-large (each with its gap in a CUDA graph).
Drawn on the device, so a captured step draws new seeds each replay."""

from __future__ import annotations

import torch
from torch import nn


def draw(n: int, device) -> torch.Tensor:
    """``n`` dropout seeds (int64, below 2**31: the kernels read them as 32-bit words), drawn on
    ``device``."""
    return torch.randint(2**31 - 1, (n,), device=device)


class DropoutSeeds:
    """A forward pre-hook of the network: a training forward draws one seed for each of its
    ``users`` modules; user ``i``'s is ``drawn[i]``."""

    def __init__(self):
        self.users = 0
        self.drawn = None

    def __call__(self, net: nn.Module, args) -> None:
        device = next(net.parameters()).device
        self.drawn = draw(self.users, device) if net.training else None


def number(net: nn.Module, cls: type) -> None:
    """Every ``cls`` module of ``net`` takes its seed from the draw of ``net``'s
    :class:`DropoutSeeds` (made and hooked on the first call)."""
    seeds = getattr(net, "dropout_seeds", None)
    if seeds is None:
        seeds = net.dropout_seeds = DropoutSeeds()
        net.register_forward_pre_hook(seeds)
    for m in net.modules():
        if isinstance(m, cls):
            m.seeds, m.seed_index = seeds, seeds.users
            seeds.users += 1


def seed_of(module: nn.Module) -> torch.Tensor | None:
    """``module``'s seed [1] this forward pass; None for a module not numbered or outside a
    training forward (the kernel's caller then draws one)."""
    seeds = getattr(module, "seeds", None)
    if seeds is None or seeds.drawn is None:
        return None
    return seeds.drawn[module.seed_index:module.seed_index + 1]
