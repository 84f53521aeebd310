"""``nn.Linear`` whose weight gradient runs on a side CUDA stream (``split-linear``).

In a linear layer's backward the data gradient ``dX = dY W`` (which the layer below waits for)
and the weight gradients ``dW = dY^T X``, ``db = sum(dY)`` are independent: NVIDIA's MLPerf DLRM
runs them on two streams. ``dX`` stays on the current stream; ``dW`` and ``db`` go to one side
stream per device, forked from the current one, and accumulate straight into ``.grad`` there
(autograd would read a returned gradient on the current stream before the side stream wrote
it). ``wait_for_weight_grads()`` joins the side streams back: call it after ``backward()``,
before anything reads the gradients; joined both ways, the side stream is also legal inside
CUDA-graph capture. On the CPU the same arithmetic runs inline. Under autocast the GEMMs run in
the autocast dtype as ``nn.Linear``'s do; the gradients accumulate in the parameters' dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _fork(device: torch.device) -> torch.cuda.Stream | None:
    """This device's side stream, made to wait for the current stream; None off CUDA."""
    if device.type != "cuda":
        return None
    side = _SIDE_STREAMS.get(device)
    if side is None:
        side = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    return side


def wait_for_weight_grads() -> None:
    """Makes each device's current stream wait for the weight gradients of its side stream."""
    for device, side in _SIDE_STREAMS.items():
        torch.cuda.current_stream(device).wait_stream(side)


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    param.grad.add_(grad)


def _cast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    return t if t is None or dtype is None else t.to(dtype)


class _SplitLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        xc, wc, bc = _cast(x, dtype), _cast(weight, dtype), _cast(bias, dtype)
        ctx.save_for_backward(xc, wc)
        ctx.params, ctx.x_dtype = (weight, bias), x.dtype
        return F.linear(xc, wc, bc)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        weight, bias = ctx.params
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])   # may copy
        side = _fork(dy.device)    # after the reshapes, before dX (dW need not wait for it)
        dx = (dy @ w).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        with torch.cuda.stream(side):    # a no-op for None
            if ctx.needs_input_grad[1]:
                _accumulate(weight, dy2.t() @ x2)
            if bias is not None and ctx.needs_input_grad[2]:
                _accumulate(bias, dy2.sum(0))
        if side is not None:     # else the allocator could hand their memory out too early
            dy2.record_stream(side)
            x2.record_stream(side)
        return dx, None, None


class SplitLinear(nn.Linear):
    """``nn.Linear`` whose weight and bias gradients land in ``.grad`` from the side stream."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SplitLinear.apply(x, self.weight, self.bias)


def split(module: nn.Module) -> None:
    """Every ``nn.Linear`` of ``module`` becomes a :class:`SplitLinear`, in place."""
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = SplitLinear
