"""The ``cudnn-fusion`` optimisation: the network's forward through batch norm folded into
cuDNN fusion graphs (``fused_conv.py``), with each bottleneck's tail joined to the next
bottleneck's first convolution, and the stem's ReLU and max-pool as one op
(``common.pool``: the pool first, the same result, as ReLU is monotonic; where the order
changes which zero takes a window's gradient, the ReLU's own gradient is zero there).

A bottleneck ends in ``out = relu(y3 * scale3 + bias3 + shortcut)``, and ``out`` has two
consumers: the next unit's first 1x1 convolution and its shortcut. Left to autograd, the
two gradients are summed into a new tensor, and Inductor recomputes the ReLU-masked
gradient in each kernel that needs it (the batch norm's per-channel sums, y3's
gradient, the next shortcut's gradient), reading the same full-size tensors again:
about 10.5 full-size passes per block where 8 do (measured in the generated code of
the H100 step).

:func:`tail_conv` is one operator for ``out`` and the next convolution with its
statistics, so its backward receives the two gradients apart. There :func:`residual_grad`
reads both, ``out`` and y3 once, writes the masked gradient once and returns per-channel
partial sums: one Triton kernel on a GPU. The rest of the backward (the fold into y3's
gradient, the next convolution's gradients) stays with torch.compile.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from benchmarks.resnet.fused_conv import (
    CHANNELS_LAST,
    bn_scale_bias,
    conv_bn,
    conv_stats,
    conv_stats_grads,
    cudnn_frontend,
    stats_dtype,
)
from benchmarks.resnet.model import ResNet50
from common import pool
from common.errors import UserError
from common.fusion import on_gpu

# the Triton kernel: rows x channels per tile, about how many row chunks x column blocks
ROW_BLOCK, CHANNEL_BLOCK, PROGRAMS, WARPS = 32, 128, 1024, 8


def _uses_triton(t: Tensor) -> bool:
    return t.is_cuda and t.dtype in (torch.float16, torch.bfloat16, torch.float32)


def _rows_per_program(rows: int, channels: int) -> int:
    column_blocks = -(-channels // CHANNEL_BLOCK)
    return ROW_BLOCK * max(1, -(-rows * column_blocks // (PROGRAMS * ROW_BLOCK)))


def _chunks(out: Tensor) -> int:
    """How many row chunks :func:`residual_grad` returns partial sums for."""
    if not _uses_triton(out):
        return 1
    n, c, h, w = out.shape
    return -(-n * h * w // _rows_per_program(n * h * w, c))


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def residual_grad_kernel(a_ptr, b_ptr, out_ptr, y_ptr, sc_ptr, g_ptr, partial_ptr,
                             rows, channels, rows_per_program, terms,
                             HAS_SC: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
        chunk = tl.program_id(0)
        cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
        col_ok = cols < channels
        start = chunk * rows_per_program
        end = tl.minimum(start + rows_per_program, rows)
        sum_g = tl.zeros([ROWS, COLS], tl.float32)
        sum_gy = tl.zeros([ROWS, COLS], tl.float32)
        sum_gsc = tl.zeros([ROWS, COLS], tl.float32)
        for first in tl.range(start, end, ROWS):
            r = first + tl.arange(0, ROWS)
            ok = (r < end)[:, None] & col_ok[None, :]
            at = r.to(tl.int64)[:, None] * channels + cols[None, :]
            a = tl.load(a_ptr + at, ok, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + at, ok, other=0.0).to(tl.float32)
            out = tl.load(out_ptr + at, ok, other=0.0)
            g = tl.where(out > 0, a + b, 0.0)
            tl.store(g_ptr + at, g.to(g_ptr.dtype.element_ty), ok)
            sum_g += g
            sum_gy += g * tl.load(y_ptr + at, ok, other=0.0).to(tl.float32)
            if HAS_SC:
                sum_gsc += g * tl.load(sc_ptr + at, ok, other=0.0).to(tl.float32)
        row = partial_ptr + chunk * terms * channels + cols
        tl.store(row, tl.sum(sum_g, 0), col_ok)
        tl.store(row + channels, tl.sum(sum_gy, 0), col_ok)
        if HAS_SC:
            tl.store(row + 2 * channels, tl.sum(sum_gsc, 0), col_ok)

    return residual_grad_kernel


def _channels_last(*tensors: Tensor) -> list[Tensor]:
    return [t.contiguous(memory_format=CHANNELS_LAST) for t in tensors]


@torch.library.custom_op("resnet::residual_grad", mutates_args=())
def residual_grad(grad_a: Tensor, grad_b: Tensor, out: Tensor, y: Tensor,
                  y_sc: Tensor | None) -> tuple[Tensor, Tensor]:
    """``g = where(out > 0, grad_a + grad_b, 0)``, the gradient through a block's final ReLU
    when its output has two consumers, and per-channel partial sums of g, g * y and
    (``y_sc`` given) g * y_sc as ``[chunks, terms, C]`` in fp32 (fp64 for fp64 inputs)."""
    grad_a, grad_b, out, y = _channels_last(grad_a, grad_b, out, y)
    terms = 2 if y_sc is None else 3
    if _uses_triton(out):
        n, c, h, w = out.shape
        rows, per_program = n * h * w, _rows_per_program(n * h * w, c)
        g = torch.empty_like(out)
        partials = out.new_empty((_chunks(out), terms, c), dtype=stats_dtype(out.dtype))
        sc = y if y_sc is None else _channels_last(y_sc)[0]
        grid = (partials.shape[0], -(-c // CHANNEL_BLOCK))
        _kernel()[grid](grad_a, grad_b, out, y, sc, g, partials, rows, c, per_program, terms,
                        HAS_SC=y_sc is not None, ROWS=ROW_BLOCK, COLS=CHANNEL_BLOCK,
                        num_warps=WARPS)
        return g, partials
    wide = stats_dtype(out.dtype)
    g = torch.where(out > 0, grad_a.to(wide) + grad_b.to(wide), 0.0)
    products = [g, g * y.to(wide)] + ([] if y_sc is None else [g * y_sc.to(wide)])
    partials = torch.stack([p.sum((0, 2, 3)) for p in products])[None]
    return g.to(out.dtype).contiguous(memory_format=CHANNELS_LAST), partials


@residual_grad.register_fake
def _(grad_a, grad_b, out, y, y_sc):
    terms = 2 if y_sc is None else 3
    return (torch.empty_like(out, memory_format=CHANNELS_LAST),
            out.new_empty((_chunks(out), terms, out.shape[1]), dtype=stats_dtype(out.dtype)))


def _tail(y: Tensor, scale: Tensor, bias: Tensor, shortcut: Tensor, sc_scale: Tensor | None,
          sc_bias: Tensor | None) -> Tensor:
    if sc_scale is not None:
        shortcut = shortcut * sc_scale + sc_bias
    return torch.relu(y * scale + bias + shortcut).contiguous(memory_format=CHANNELS_LAST)


@torch.library.custom_op("resnet::tail_conv", mutates_args=())
def tail_conv(y: Tensor, scale: Tensor, bias: Tensor, shortcut: Tensor,
              sc_scale: Tensor | None, sc_bias: Tensor | None,
              weight: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A bottleneck's output ``out = relu(y * scale + bias + shortcut)`` (the shortcut through
    ``* sc_scale + sc_bias`` when given), then :func:`conv_stats` of the next unit's 1x1
    stride-1 convolution ``weight`` on it: ``(out, y_next, sum, sum_sq)``."""
    out = on_gpu(_tail, y, scale, bias, shortcut, sc_scale, sc_bias)
    return (out, *conv_stats(out, weight, None, None, 1, 0))


@tail_conv.register_fake
def _(y, scale, bias, shortcut, sc_scale, sc_bias, weight):
    out = torch.empty_like(y, memory_format=CHANNELS_LAST)
    return (out, *conv_stats(out, weight, None, None, 1, 0))


def _setup_context(ctx, inputs, output):
    y, scale, _, shortcut, sc_scale, _, weight = inputs
    ctx.save_for_backward(y, scale, shortcut, sc_scale, weight, output[0], output[1])


def _backward(ctx, grad_out, grad_y_next, grad_sum, grad_sum_sq):
    y, scale, shortcut, sc_scale, weight, out, y_next = ctx.saved_tensors
    grad_conv, grad_weight, _, _ = conv_stats_grads(grad_y_next, grad_sum, grad_sum_sq, out,
                                                    weight, None, None, y_next, 1, 0)
    projected = sc_scale is not None
    g, partials = residual_grad(grad_out, grad_conv, out, y, shortcut if projected else None)
    sums = partials.sum(0).view(partials.shape[1], 1, -1, 1, 1).to(scale.dtype)
    grads = (g * scale, sums[1], sums[0])
    if not projected:
        return (*grads, g, None, None, grad_weight)
    return (*grads, g * sc_scale, sums[2], sums[0], grad_weight)


tail_conv.register_autograd(_backward, setup_context=_setup_context)


def stages(units, x: Tensor) -> Tensor:
    """``model.Bottleneck`` units, in order, on ``x`` through the fused path; each unit's
    tail runs with the next unit's first convolution (1x1, stride 1, as in ResNet v1.5)."""
    y1, scale1, bias1 = conv_bn(units[0].conv1, units[0].bn1, x)
    for unit, following in zip(units, [*units[1:], None]):
        y2, scale2, bias2 = conv_bn(unit.conv2, unit.bn2, y1, scale1, bias1)
        y3, scale3, bias3 = conv_bn(unit.conv3, unit.bn3, y2, scale2, bias2)
        shortcut = (conv_bn(unit.conv1sc, unit.bnsc, x) if unit.has_shortcut
                    else (x, None, None))
        if following is None:
            return _tail(y3, scale3, bias3, *shortcut)
        weight = following.conv1.weight.to(x.dtype)
        x, y1, total, total_sq = tail_conv(y3, scale3, bias3, *shortcut, weight)
        scale1, bias1 = bn_scale_bias(following.bn1, total, total_sq,
                                      y1.numel() // y1.shape[1], x.dtype)


class FusedResNet50(ResNet50):
    """``ResNet50`` with the same parameters, its bottlenecks run by :func:`stages`."""

    def forward(self, x: Tensor) -> Tensor:
        units = [u for i in range(1, 5) for u in getattr(self, f"stage{i}")]
        x = stages(units, pool.relu_max_pool_3x3_s2(self.bn0(self.conv0(x))))
        return self.fc1(torch.flatten(self.pool1(x), 1))


def fuse(net: ResNet50) -> None:
    """``net`` (its weights and buffers as they are) runs the fused path from now on."""
    net.__class__ = FusedResNet50


def select(wl, _) -> None:
    """Checks before anything is built: statistics per GPU; on a GPU fp16 (cuDNN 9.19 has
    fusion engines for fp16 only) and cudnn-frontend. Elsewhere the ops run as plain PyTorch."""
    if wl.hp.bn_group != 1:
        raise UserError(f"optimisation cudnn-fusion computes batch-norm statistics per GPU: "
                        f"drop it or --bn-group {wl.hp.bn_group}")
    if wl.env.device.type == "cuda" and wl.precision.name != "amp-fp16":
        raise UserError(f"optimisation cudnn-fusion runs under --precision amp-fp16 on a GPU, "
                        f"not {wl.precision.name}")
    if wl.env.device.type == "cuda":
        try:
            cudnn_frontend()
        except ImportError as exc:
            raise UserError(f"optimisation cudnn-fusion needs the cuDNN frontend ({exc}): "
                            "pip install nvidia-cudnn-frontend") from exc


def apply(wl, _) -> None:
    fuse(wl.net)
