"""All parameters (and their gradients) of a module as views into one contiguous buffer.

With every gradient inside one buffer, the data-parallel gradient reduction
is a single all-reduce or reduce-scatter and the parameter all-gather after a
sharded optimizer step is a single all-gather, with no flatten/unflatten
copies. The buffer is padded to a multiple of ``world_size`` so each rank owns
an equal contiguous shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Piece:
    """The part of parameter ``param`` (index into ``FlatParameters.params``) inside a shard."""

    param: int
    start: int   # offset inside the shard
    length: int


class FlatParameters:
    """Moves ``module``'s parameters into ``self.data`` and their gradients into ``self.grad``.

    Tied parameters appear once. Backward accumulates into the gradient views
    in place, so ``zero_grad`` must zero the buffer rather than drop the views;
    :meth:`backward` instead lets autograd keep each gradient apart and writes them
    all into the buffer with a few multi-tensor kernels.
    With a low-precision ``dtype`` (bf16) the model's weights and gradients are
    kept in it (no autocast weight casts, half the gradient traffic) and
    ``self.master`` holds the fp32 weights the optimizer updates; in fp32,
    ``master`` is ``data`` itself.
    """

    def __init__(self, module: nn.Module, world_size: int = 1, dtype=torch.float32):
        named = list(module.named_parameters())
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self.world_size = world_size
        self.shard_size = -(-self.numel // world_size)
        device = self.params[0].device
        self.master = torch.zeros(self.shard_size * world_size, device=device)
        self.data = self.master if dtype == torch.float32 else torch.zeros_like(self.master,
                                                                                dtype=dtype)
        self.grad = torch.zeros_like(self.data)
        self.offsets = []
        offset = 0
        for p, n in zip(self.params, self.sizes):
            self.offsets.append(offset)
            self.master[offset:offset + n].copy_(p.detach().reshape(-1))
            p.data = self.data[offset:offset + n].view_as(p)
            offset += n
        self._refresh_data()
        self.grads = [self.grad[off:off + n].view_as(p)
                      for p, off, n in zip(self.params, self.offsets, self.sizes)]
        self._attach_grads()

    def _attach_grads(self) -> None:
        for p, g in zip(self.params, self.grads):
            p.grad = g

    def backward(self, loss: torch.Tensor, accumulate: bool) -> None:
        """``loss.backward()``, each gradient then copied into the buffer (added to it with
        ``accumulate``: a later micro-batch of a step) by multi-tensor kernels, where
        autograd would add each into its view with a kernel of its own (hundreds a step,
        each with its launch gap in a CUDA graph). A parameter without a gradient keeps
        its view (zeroed unless ``accumulate``)."""
        for p in self.params:
            p.grad = None
        loss.backward()
        have = [(g, p.grad) for p, g in zip(self.params, self.grads) if p.grad is not None]
        if have:
            views, grads = map(list, zip(*have))
            (torch._foreach_add_ if accumulate else torch._foreach_copy_)(views, grads)
        if not accumulate and len(have) < len(self.params):
            torch._foreach_zero_([g for p, g in zip(self.params, self.grads) if p.grad is None])
        self._attach_grads()

    def broadcast(self, src: int = 0) -> None:
        """Every rank takes rank ``src``'s weights (master and model copy)."""
        torch.distributed.broadcast(self.master, src)
        self._refresh_data()

    def _refresh_data(self) -> None:
        """The model's low-precision weights from the master (nothing to do in fp32)."""
        if self.data is not self.master:
            self.data.copy_(self.master)

    def zero_grad(self) -> None:
        self.grad.zero_()

    def shard(self, buffer: torch.Tensor, rank: int) -> torch.Tensor:
        return buffer[rank * self.shard_size:(rank + 1) * self.shard_size]

    def pieces(self, rank: int) -> list[Piece]:
        """Parameters overlapping ``rank``'s shard, in order; they cover it up to the padding."""
        lo, hi = rank * self.shard_size, (rank + 1) * self.shard_size
        out = []
        for i, (off, n) in enumerate(zip(self.offsets, self.sizes)):
            a, b = max(off, lo), min(off + n, hi)
            if a < b:
                out.append(Piece(i, a - lo, b - a))
        return out
