"""LAMB on one flat buffer of parameters and gradients (``flat-params``, :class:`common.lamb.
ShardedLamb`: whole-buffer and multi-tensor kernels, each rank its shard after one gradient
reduce-scatter), in place of DDP and LAMB one tensor at a time (the reference's). Selected
before ``build()``: the parameters must be views of the buffer before anything wraps them.
"""

from __future__ import annotations

from torch import nn

from common.flat_params import FlatParameters
from common.lamb import LambHyper, ShardedLamb
from common.optimisations import Optimisation


def flat_lamb(wl, train_loss: nn.Module, hyper: LambHyper):
    """``workload.per_tensor_lamb``'s ``(model, optimizer)`` on one flat buffer."""
    flat = FlatParameters(wl.net, wl.env.world_size)
    if wl.env.distributed:
        flat.broadcast(0)   # the same initial weights everywhere
    return train_loss, ShardedLamb(flat, [True] * len(wl.params), hyper, wl.env.rank,
                                   wl.env.world_size)


def select(wl, _) -> None:
    wl.impl.data_parallel = flat_lamb


OPTIMISATION = Optimisation(
    "flat-params", "parameters and gradients in one buffer, LAMB on it with whole-buffer and "
    "multi-tensor kernels and one gradient reduce-scatter (benchmarks/rnnt/flat_lamb.py)",
    select=select, rtol=1e-6)
