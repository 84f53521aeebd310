"""Elementwise and reduction chains compiled by Inductor into fused kernels."""

from __future__ import annotations

from collections.abc import Callable

import torch

_compiled: dict[Callable, Callable] = {}


def _allow_recompiles() -> None:
    # one function meets many shapes, layouts and grad modes (a graph each): more than
    # Dynamo's default 8 graphs, past which it would silently run the function eagerly
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)


def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by Inductor (forward and backward, dynamic shapes), built on the
    first call and cached. The kernels it generates run inside whole-step CUDA graphs."""
    if fn not in _compiled:
        _allow_recompiles()
        _compiled[fn] = torch.compile(fn, dynamic=True)
    return _compiled[fn]


_static: dict[Callable, Callable] = {}


def on_gpu(fn: Callable, x: torch.Tensor, *args):
    """``fn(x, *args)`` as Inductor-fused kernels (static shapes) when ``x`` is on a GPU,
    eagerly elsewhere (the CPU tests); for the insides of custom operators."""
    if not x.is_cuda:
        return fn(x, *args)
    if fn not in _static:
        _allow_recompiles()
        _static[fn] = torch.compile(fn, dynamic=False)
    return _static[fn](x, *args)
