"""The ``flat-params`` and ``sharded-optimizer`` optimisations: every parameter and gradient a
view of one buffer (``common.flat_params``) and LAMB on it (``common.lamb.ShardedLamb``:
whole-buffer and multi-tensor kernels, one gradient collective), in place of DDP and LAMB one
tensor at a time (the reference's); sharded, each rank updates its shard after one
reduce-scatter and one all-gather brings the weights back. Selected before ``build()``: the
parameters must be views of the buffer before anything wraps them.
"""

from __future__ import annotations

from common.flat_params import FlatParameters
from common.lamb import LambHyper, ShardedLamb
from common.optimisations import Optimisation


def flat_lamb(wl, hyper: LambHyper, decay: list[bool]):
    """``(model, optimizer)`` of ``wl.net`` on one flat buffer (of ``wl.impl.weight_dtype``)."""
    env, sharded = wl.env, wl.impl.sharded
    flat = FlatParameters(wl.net, env.world_size if sharded else 1, wl.impl.weight_dtype)
    if env.distributed:
        flat.broadcast(0)   # the same initial weights everywhere
    return wl.net, ShardedLamb(flat, decay, hyper, env.rank, env.world_size, sharded)


FLAT_PARAMS = Optimisation(
    "flat-params", "parameters and gradients in one buffer, LAMB on it with whole-buffer and "
    "multi-tensor kernels and one gradient all-reduce (flat_lamb.py)",
    select=lambda wl, _: setattr(wl.impl, "data_parallel", flat_lamb), rtol=1e-6)
SHARDED_OPTIMIZER = Optimisation(
    "sharded-optimizer", "each rank updates its shard of the flat buffer after one gradient "
    "reduce-scatter, then one all-gather of the weights (flat_lamb.py)",
    select=lambda wl, _: setattr(wl.impl, "sharded", True), requires=("flat-params",),
    rtol=1e-6)
