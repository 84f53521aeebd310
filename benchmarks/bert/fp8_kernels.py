"""Triton kernels of ``fp8-ffn`` and ``fp8-wgrad`` (``fp8.py``): each cast to FP8 one pass that
multiplies by a slot's scale, saturates, stores, and folds the tile's largest magnitude into
the slot's amax (the float's bits as an int32: the order of non-negative floats); the bias +
GELU kernels can also store their result in bf16 (``keep``: what the weight gradient needs of
it without ``fp8-wgrad``). The FP8 transposes the weight gradient needs (an FP8 GEMM's operands
are row-major on one side, column-major on the other) are a pass of their own
(``transpose_kernel``): stored from the casts' own programs, they came out wrong on an H200
(Triton 3.x) for some tiles and input dtypes (docs/history/bert.md).

The GELU kernels take erf from ``kernels._gelu_cdf`` (as ``triton-gelu``'s); the amax is an
atomic maximum with relaxed ordering (only a later kernel reads it). Together about 10% of
either kernel's time ([10240, 4096] on an H100)."""

from __future__ import annotations

import triton
import triton.language as tl

from benchmarks.bert.kernels import _biased, _gelu_cdf, _gelu_slope


@triton.jit
def _store(y_ptr, keep_ptr, t, t8, at, ok):
    """The tile ``t8`` (offsets ``at``) into ``y`` in its FP8 format, and ``t`` into ``keep``
    in its dtype unless ``keep`` is None."""
    tl.store(y_ptr + at, t8.to(y_ptr.dtype.element_ty), mask=ok)
    if keep_ptr is not None:
        tl.store(keep_ptr + at, t.to(keep_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _scaled(t, ok, scale_ptr, amax_ptr, FMAX: tl.constexpr):
    """``t`` (fp32) times the slot's scale, saturated at ``FMAX``; its magnitude recorded."""
    tl.atomic_max(amax_ptr, tl.max(tl.max(tl.where(ok, tl.abs(t), 0.0), 1), 0).to(
        tl.int32, bitcast=True), sem="relaxed")
    return tl.minimum(tl.maximum(t * tl.load(scale_ptr), -FMAX), FMAX)


@triton.jit
def cast_kernel(x_ptr, y_ptr, scale_ptr, amax_ptr, R, C: tl.constexpr, FMAX: tl.constexpr,
                BR: tl.constexpr, BC: tl.constexpr):
    """``y = x * scale`` [R, C] row-major."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    ok = (r[:, None] < R) & (c[None, :] < C)
    t = tl.load(x_ptr + r[:, None].to(tl.int64) * C + c[None, :], mask=ok, other=0.0)
    t8 = _scaled(t.to(tl.float32), ok, scale_ptr, amax_ptr, FMAX)
    # the offsets again, not kept from the load: kept, the sm_90 code computes each 64-bit
    # address twice over
    _store(y_ptr, None, t8, t8, r[:, None].to(tl.int64) * C + c[None, :], ok)


@triton.jit
def gelu_forward_kernel(z_ptr, bias_ptr, g8_ptr, keep_ptr, scale_ptr, amax_ptr, rows,
                        N: tl.constexpr, FMAX: tl.constexpr, BR: tl.constexpr,
                        BC: tl.constexpr):
    """``g = gelu(z + bias)`` [rows, N] scaled in ``g8``'s FP8; ``keep`` as ``_store``."""
    u, c, at, ok = _biased(z_ptr, bias_ptr, rows, N, BR, BC)
    g = u * _gelu_cdf(u, tl.exp(-0.5 * u * u))
    _store(g8_ptr, keep_ptr, g, _scaled(g, ok, scale_ptr, amax_ptr, FMAX), at, ok)


@triton.jit
def gelu_backward_kernel(dg_ptr, z_ptr, bias_ptr, dz8_ptr, keep_ptr, partial_ptr, scale_ptr,
                         amax_ptr, rows, N: tl.constexpr, FMAX: tl.constexpr, BR: tl.constexpr,
                         BC: tl.constexpr):
    """``dz = dg * gelu'(z + bias)`` scaled in ``dz8``'s FP8, and in ``keep``'s dtype unless
    ``keep`` is None; the tile's column sums (fp32) to ``partial[row block]``."""
    u, c, at, ok = _biased(z_ptr, bias_ptr, rows, N, BR, BC)
    slope = _gelu_slope(u)
    dz = tl.where(ok, tl.load(dg_ptr + at, mask=ok, other=0.0).to(tl.float32) * slope, 0.0)
    _store(dz8_ptr, keep_ptr, dz, _scaled(dz, ok, scale_ptr, amax_ptr, FMAX), at, ok)
    tl.store(partial_ptr + tl.program_id(0).to(tl.int64) * N + c, tl.sum(dz, 0), mask=c < N)


@triton.jit
def transpose_kernel(x_ptr, y_ptr, R, C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """``y`` [C, R] = ``x`` [R, C] transposed, both row-major."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    ok = (r[:, None] < R) & (c[None, :] < C)
    t = tl.load(x_ptr + r[:, None].to(tl.int64) * C + c[None, :], mask=ok)
    tl.store(y_ptr + c[:, None].to(tl.int64) * R + r[None, :], tl.trans(t), mask=tl.trans(ok))
