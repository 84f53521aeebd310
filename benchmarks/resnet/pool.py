"""The stem's 3x3 stride-2 max-pool (padding 1) with a backward that torch.compile makes fast.

``nn.MaxPool2d`` under Inductor recomputes the window arguments in its backward and
gathers every input pixel's gradient from up to four windows of recomputed indices:
1.44 ms of the fused step at batch 256 on the H100. :func:`max_pool_3x3_s2` saves the
position of each window's maximum as one int8 (0-8) and builds the input gradient from
four planes (even/odd rows x even/odd columns) of shifted, masked output gradients,
interleaved by element-wise selects in NHWC order: plain element-wise work (one
Inductor kernel in the CPU build's generated code), laid out channels-last.

Results equal ``F.max_pool2d(x, 3, 2, 1)`` and its gradient: the first maximum in
row-major window order takes the gradient, and NaN wins as in ATen.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

OFFSETS = [(di, dj) for di in range(3) for dj in range(3)]


def _window(padded: Tensor, di: int, dj: int, ho: int, wo: int) -> Tensor:
    return padded[:, :, di:di + 2 * ho - 1:2, dj:dj + 2 * wo - 1:2]


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


class _MaxPool3x3S2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        ho, wo = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        padded = F.pad(x, (1, 1, 1, 1), value=float("-inf"))
        best = _window(padded, 0, 0, ho, wo)
        where = torch.zeros(best.shape, dtype=torch.int8, device=x.device)
        for k, (di, dj) in enumerate(OFFSETS[1:], 1):
            v = _window(padded, di, dj, ho, wo)
            take = (v > best) | torch.isnan(v)
            best, where = torch.where(take, v, best), torch.where(take, k, where)
        ctx.save_for_backward(where)
        ctx.size = (h, w)
        return best.contiguous(memory_format=_layout(x))

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (where,) = ctx.saved_tensors
        h, w = ctx.size
        # Worked in NHWC order, so that Inductor lays the result out channels-last.
        grad_nhwc, where = grad.permute(0, 2, 3, 1), where.permute(0, 2, 3, 1)
        zero = grad.new_zeros(())
        g = [torch.where(where == k, grad_nhwc, zero) for k in range(9)]
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
        return grad_in.contiguous(memory_format=_layout(grad))


def _layout(t: Tensor) -> torch.memory_format:
    channels_last = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if channels_last else torch.contiguous_format


def max_pool_3x3_s2(x: Tensor) -> Tensor:
    """``F.max_pool2d(x, 3, stride=2, padding=1)`` (NCHW or channels-last)."""
    return _MaxPool3x3S2.apply(x)
