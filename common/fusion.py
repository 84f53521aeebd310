"""Elementwise and reduction chains compiled by Inductor into fused kernels."""

from __future__ import annotations

from collections.abc import Callable

import torch

_compiled: dict[Callable, Callable] = {}


def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by Inductor (forward and backward, dynamic shapes), built on the
    first call and cached. The kernels it generates run inside whole-step CUDA graphs."""
    if fn not in _compiled:
        # one function meets many shapes, layouts and grad modes (a graph each): more than
        # Dynamo's default 8 graphs, past which it would silently run the function eagerly
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _compiled[fn] = torch.compile(fn, dynamic=True)
    return _compiled[fn]
