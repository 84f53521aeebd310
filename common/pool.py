"""A ResNet stem's ReLU and 3x3 stride-2 max-pool (padding 1) with a gather-free backward
(ResNet-50's ``cudnn-fusion``, SSD's ``fused-pool`` optimisations).

``nn.MaxPool2d`` under Inductor recomputes the window arguments in its backward and
gathers every input pixel's gradient from up to four windows of recomputed indices:
1.44 ms of the fused step at batch 256 on the H100. :func:`relu_max_pool_3x3_s2` saves
the position of each window's maximum as one int8 (0-8, or 9 where the ReLU cuts the
gradient) and builds the input gradient from four planes (even/odd rows x even/odd
columns) of shifted, masked output gradients, interleaved by element-wise selects in
NHWC order: plain element-wise work, laid out like the input.

Forward and backward are two custom operators, opaque to an enclosing torch.compile;
on a GPU each runs its own compiled (fused) kernels. Two other forms failed: as an
``autograd.Function`` the op lost its gradient under torch.compile in torch 2.11 on the
H100 (the stem's backward received zeros), and as plain differentiable selects over
strided views Inductor's backward materialised several padded full-size buffers.

Results equal ``F.relu(F.max_pool2d(x, 3, 2, 1))`` and its gradient: the first maximum
in row-major window order takes the gradient, and NaN wins as in ATen. (The pool and
the ReLU commute, in value and in gradient.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from common.fusion import on_gpu

OFFSETS = [(di, dj) for di in range(3) for dj in range(3)]
NO_GRADIENT = 9  # the position saved for windows whose maximum the ReLU clamps to zero


def _layout(t: Tensor) -> torch.memory_format:
    channels_last = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if channels_last else torch.contiguous_format


def _out_shape(x: Tensor) -> tuple[int, int, int, int]:
    n, c, h, w = x.shape
    return n, c, (h - 1) // 2 + 1, (w - 1) // 2 + 1


def _forward(x: Tensor) -> tuple[Tensor, Tensor]:
    _, _, ho, wo = _out_shape(x)
    padded = F.pad(x, (1, 1, 1, 1), value=float("-inf"))
    windows = [padded[:, :, di:di + 2 * ho - 1:2, dj:dj + 2 * wo - 1:2] for di, dj in OFFSETS]
    best = windows[0]
    where = torch.zeros(best.shape, dtype=torch.int8, device=x.device)
    for k, v in enumerate(windows[1:], 1):
        take = (v > best) | torch.isnan(v)
        best, where = torch.where(take, v, best), torch.where(take, k, where)
    where = torch.where(best <= 0, NO_GRADIENT, where)
    layout = _layout(x)
    return (torch.relu(best).contiguous(memory_format=layout),
            where.contiguous(memory_format=layout))


def _shift(t: Tensor, dim: int, by: int) -> Tensor:
    """NHWC ``t`` with one zero row (``dim`` 1) or column (2) appended (``by`` 0) or
    prepended (``by`` 1): index ``a`` then reads ``t[a - by]``."""
    pad = [0] * 6  # F.pad order: C, then W, then H
    pad[(3 - dim) * 2 + (1 - by)] = 1
    return F.pad(t, pad)


def _upsample2(t: Tensor) -> Tensor:
    """Each element of NHWC ``t`` repeated over a 2x2 block of pixels."""
    n, a, b, c = t.shape
    return t[:, :, None, :, None].expand(n, a, 2, b, 2, c).reshape(n, 2 * a, 2 * b, c)


def _backward(grad: Tensor, where: Tensor, h: int, w: int) -> Tensor:
    # Worked in NHWC order, so that Inductor lays the result out channels-last.
    grad_nhwc, where_nhwc = grad.permute(0, 2, 3, 1), where.permute(0, 2, 3, 1)
    zero = grad.new_zeros(())
    g = [torch.where(where_nhwc == k, grad_nhwc, zero) for k in range(9)]
    # Padded row 2a takes window row a at offset 0 and window row a-1 at offset 2; padded
    # row 2a+1 takes window row a at offset 1. Columns likewise.
    rows = {(p, dj): (_shift(g[dj], 1, 0) + _shift(g[6 + dj], 1, 1)) if p == 0
            else _shift(g[3 + dj], 1, 0) for p in (0, 1) for dj in range(3)}
    planes = [[_upsample2(_shift(rows[p, 0], 2, 0) + _shift(rows[p, 2], 2, 1)),
               _upsample2(_shift(rows[p, 1], 2, 0))] for p in (0, 1)]
    # Interleave the planes by parity with element-wise selects (no concatenation buffer).
    size = planes[0][0].shape
    odd_row = (torch.arange(size[1], device=grad.device) % 2 == 1).view(-1, 1, 1)
    odd_col = (torch.arange(size[2], device=grad.device) % 2 == 1).view(-1, 1)
    full = torch.where(odd_row, torch.where(odd_col, planes[1][1], planes[1][0]),
                       torch.where(odd_col, planes[0][1], planes[0][0]))
    grad_in = full[:, 1:h + 1, 1:w + 1].permute(0, 3, 1, 2)
    return grad_in.contiguous(memory_format=_layout(where))


@torch.library.custom_op("common::relu_max_pool", mutates_args=())
def _relu_max_pool(x: Tensor) -> tuple[Tensor, Tensor]:
    return on_gpu(_forward, x)


@_relu_max_pool.register_fake
def _(x):
    out = x.new_empty(_out_shape(x)).contiguous(memory_format=_layout(x))
    return out, torch.empty_like(out, dtype=torch.int8)


@torch.library.custom_op("common::relu_max_pool_backward", mutates_args=())
def _relu_max_pool_backward(grad: Tensor, where: Tensor, h: int, w: int) -> Tensor:
    return on_gpu(_backward, grad, where, h, w)


@_relu_max_pool_backward.register_fake
def _(grad, where, h, w):
    n, c = grad.shape[:2]
    return grad.new_empty((n, c, h, w)).contiguous(memory_format=_layout(where))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.size = inputs[0].shape[-2:]


def _pool_backward(ctx, grad, _grad_where):
    (where,) = ctx.saved_tensors
    return _relu_max_pool_backward(grad.contiguous(memory_format=_layout(where)), where,
                                   *ctx.size)


_relu_max_pool.register_autograd(_pool_backward, setup_context=_setup_context)


def relu_max_pool_3x3_s2(x: Tensor) -> Tensor:
    """``F.relu(F.max_pool2d(x, 3, stride=2, padding=1))`` (NCHW or channels-last)."""
    return _relu_max_pool(x)[0]
