"""Triton kernels of ``fp8-ffn`` (``fp8.py``): each cast to FP8 one pass that multiplies by a
slot's scale, saturates, stores, and folds the tile's largest magnitude into the slot's amax
(the float's bits as an int32: the order of non-negative floats), written beside the bf16
result where the producer has one (bias + GELU forward and backward)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _scaled(t, ok, scale_ptr, amax_ptr, FMAX: tl.constexpr):
    """``t`` (fp32) times the slot's scale, saturated at ``FMAX``; its magnitude recorded."""
    tl.atomic_max(amax_ptr, tl.max(tl.max(tl.where(ok, tl.abs(t), 0.0), 1), 0).to(
        tl.int32, bitcast=True))
    return tl.minimum(tl.maximum(t * tl.load(scale_ptr), -FMAX), FMAX)


@triton.jit
def cast_kernel(x_ptr, y_ptr, scale_ptr, amax_ptr, rows, N: tl.constexpr, FMAX: tl.constexpr,
                BR: tl.constexpr, BC: tl.constexpr):
    """``y = x * scale`` in ``y``'s FP8 format, [rows, N] row-major."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    ok = (r[:, None] < rows) & (c[None, :] < N)
    at = r[:, None].to(tl.int64) * N + c[None, :]
    t = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + at, _scaled(t, ok, scale_ptr, amax_ptr, FMAX).to(y_ptr.dtype.element_ty),
             mask=ok)


@triton.jit
def cast_transpose_kernel(x_ptr, y_ptr, yt_ptr, scale_ptr, amax_ptr, R: tl.constexpr,
                          C: tl.constexpr, FMAX: tl.constexpr, BR: tl.constexpr,
                          BC: tl.constexpr):
    """``y = x * scale`` [R, C] and its transpose ``yt`` [C, R], both row-major."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    ok = (r[:, None] < R) & (c[None, :] < C)
    t = tl.load(x_ptr + r[:, None] * C + c[None, :], mask=ok, other=0.0).to(tl.float32)
    y = _scaled(t, ok, scale_ptr, amax_ptr, FMAX).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + r[:, None] * C + c[None, :], y, mask=ok)
    tl.store(yt_ptr + c[:, None] * R + r[None, :], tl.trans(y), mask=tl.trans(ok))


@triton.jit
def gelu_forward_kernel(z_ptr, bias_ptr, g_ptr, g8_ptr, scale_ptr, amax_ptr, rows,
                        N: tl.constexpr, FMAX: tl.constexpr, BR: tl.constexpr,
                        BC: tl.constexpr):
    """``g = gelu(z + bias)`` [rows, N] in ``g``'s dtype and scaled in ``g8``'s FP8."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    ok = (r[:, None] < rows) & (c[None, :] < N)
    at = r[:, None].to(tl.int64) * N + c[None, :]
    u = tl.load(z_ptr + at, mask=ok, other=0.0).to(tl.float32) + tl.load(
        bias_ptr + c, mask=c < N, other=0.0).to(tl.float32)[None, :]
    g = 0.5 * u * (1.0 + tl.math.erf(u * 0.7071067811865476))
    tl.store(g_ptr + at, g.to(g_ptr.dtype.element_ty), mask=ok)
    tl.store(g8_ptr + at, _scaled(g, ok, scale_ptr, amax_ptr, FMAX).to(
        g8_ptr.dtype.element_ty), mask=ok)


@triton.jit
def gelu_backward_kernel(dg_ptr, z_ptr, bias_ptr, dz_ptr, dz8_ptr, partial_ptr, scale_ptr,
                         amax_ptr, rows, N: tl.constexpr, FMAX: tl.constexpr,
                         BR: tl.constexpr, BC: tl.constexpr):
    """``dz = dg * gelu'(z + bias)`` in ``dz``'s dtype and scaled in ``dz8``'s FP8; the tile's
    column sums (fp32) to ``partial[row block]``."""
    rb = tl.program_id(0)
    r = rb * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    ok = (r[:, None] < rows) & (c[None, :] < N)
    at = r[:, None].to(tl.int64) * N + c[None, :]
    u = tl.load(z_ptr + at, mask=ok, other=0.0).to(tl.float32) + tl.load(
        bias_ptr + c, mask=c < N, other=0.0).to(tl.float32)[None, :]
    slope = 0.5 * (1.0 + tl.math.erf(u * 0.7071067811865476)) + u * tl.exp(
        -0.5 * u * u) * 0.3989422804014327
    dz = tl.where(ok, tl.load(dg_ptr + at, mask=ok, other=0.0).to(tl.float32) * slope, 0.0)
    tl.store(dz_ptr + at, dz.to(dz_ptr.dtype.element_ty), mask=ok)
    tl.store(dz8_ptr + at, _scaled(dz, ok, scale_ptr, amax_ptr, FMAX).to(
        dz8_ptr.dtype.element_ty), mask=ok)
    tl.store(partial_ptr + rb.to(tl.int64) * N + c, tl.sum(dz, 0), mask=c < N)
