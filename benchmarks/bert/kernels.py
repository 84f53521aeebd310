"""BERT's Triton kernels (``triton-layernorm``, ``triton-qkv``, ``triton-gelu``): imported on
first use, so that the CPU tests need no Triton.

The GELU kernels (and ``fp8-ffn``'s) take erf from Abramowitz and Stegun's 7.1.26 (one
exponential, a reciprocal and a polynomial; absolute error under 1.5e-7, below the bf16
input's rounding), not libdevice's ``erff``, the backward sharing its exponential with the
derivative's own term."""

import torch
import triton
import triton.language as tl

next_power_of_2 = triton.next_power_of_2


def launch(kernel, tile, rows: int, cols: int, *args, **constants) -> None:
    """``kernel`` over [rows, cols] in ``tile``'s (rows, columns, warps) programs."""
    br, bc, warps = tile
    kernel[(-(-rows // br), -(-cols // bc))](*args, BR=br, BC=bc, num_warps=warps, **constants)


@triton.jit
def column_sum_kernel(partial_ptr, out_ptr, p, n, BP: tl.constexpr, BN: tl.constexpr):
    """``out[c] = sum over rows of partial[:, c]`` for a BN-wide strip of columns, in ``out``'s
    dtype."""
    c = tl.program_id(0) * BN + tl.arange(0, BN)
    total = tl.zeros([BN], tl.float32)
    for r0 in range(0, p, BP):
        r = r0 + tl.arange(0, BP)
        ok = (r[:, None] < p) & (c[None, :] < n)
        total += tl.sum(tl.load(partial_ptr + r[:, None].to(tl.int64) * n + c[None, :],
                                mask=ok, other=0.0), 0)
    tl.store(out_ptr + c, total.to(out_ptr.dtype.element_ty), mask=c < n)


def column_sums(partial: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """The column sums of the programs' partial sums ``partial`` [programs, n] (fp32), summed
    in fp32 and stored in ``dtype`` (a parameter's: no conversion kernel after), a program a
    strip of 32 columns, 256 rows at a time (the fastest tile on an H200 at [640, 3072], [160,
    3072] and [640, 12288])."""
    p, n = partial.shape
    out = torch.empty(n, dtype=dtype, device=partial.device)
    column_sum_kernel[(triton.cdiv(n, 32),)](partial, out, p, n, BP=256, BN=32, num_warps=8)
    return out


@triton.jit
def _sum_in(x_ptr, bias_ptr, res_ptr, keep, at, cols, ok, scale, DROPOUT: tl.constexpr):
    """A quarter row's ``dropout(x + bias) + residual`` in fp32."""
    x = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    x += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if DROPOUT:
        x = tl.where(keep, x * scale, 0.0)
    return x + tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _mix(x):
    """``lowbias32``'s multiply-xorshift rounds (a bijection of 32-bit words with full
    avalanche) but its last xorshift, which leaves the top 16 bits as they are."""
    x ^= x >> 16
    x *= 0x7FEB352D
    x ^= x >> 15
    return x * 0x846CA68B


@triton.jit
def _kept(seed, at, threshold):
    """Whether the dropout keeps element ``at`` (its index in the [rows, H] input): the top
    24 bits of ``_mix`` of the index times the golden ratio plus the seed reach
    ``threshold``. A function of the index alone: the backward redraws it, no mask kept."""
    return _mix(at.to(tl.uint32) * 0x9E3779B9 + seed) >= threshold.to(tl.uint32) << 8


@triton.jit
def _normed(y_ptr, w_ptr, b_ptr, d, rstd, at, c, ok):
    w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + at, (d * rstd * w + b).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def layer_norm_forward_kernel(x_ptr, bias_ptr, res_ptr, w_ptr, b_ptr, y_ptr, mean_ptr,
                              rstd_ptr, seed_ptr, threshold, scale, eps,
                              H: tl.constexpr, Q: tl.constexpr, DROPOUT: tl.constexpr):
    row = tl.program_id(0)
    q = tl.arange(0, Q)
    ok = q < H // 4
    base = row.to(tl.int64) * H
    c0 = q
    c1 = q + H // 4
    c2 = q + H // 2
    c3 = q + 3 * (H // 4)
    k0 = ok
    k1 = ok
    k2 = ok
    k3 = ok
    if DROPOUT:
        seed = tl.load(seed_ptr).to(tl.uint32)
        k0 = _kept(seed, base + c0, threshold)
        k1 = _kept(seed, base + c1, threshold)
        k2 = _kept(seed, base + c2, threshold)
        k3 = _kept(seed, base + c3, threshold)
    s0 = _sum_in(x_ptr, bias_ptr, res_ptr, k0, base + c0, c0, ok, scale, DROPOUT)
    s1 = _sum_in(x_ptr, bias_ptr, res_ptr, k1, base + c1, c1, ok, scale, DROPOUT)
    s2 = _sum_in(x_ptr, bias_ptr, res_ptr, k2, base + c2, c2, ok, scale, DROPOUT)
    s3 = _sum_in(x_ptr, bias_ptr, res_ptr, k3, base + c3, c3, ok, scale, DROPOUT)
    mean = (tl.sum(s0, 0) + tl.sum(s1, 0) + tl.sum(s2, 0) + tl.sum(s3, 0)) / H
    d0 = tl.where(ok, s0 - mean, 0.0)
    d1 = tl.where(ok, s1 - mean, 0.0)
    d2 = tl.where(ok, s2 - mean, 0.0)
    d3 = tl.where(ok, s3 - mean, 0.0)
    var = (tl.sum(d0 * d0, 0) + tl.sum(d1 * d1, 0) + tl.sum(d2 * d2, 0)
           + tl.sum(d3 * d3, 0)) / H
    rstd = 1.0 / tl.sqrt(var + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    _normed(y_ptr, w_ptr, b_ptr, d0, rstd, base + c0, c0, ok)
    _normed(y_ptr, w_ptr, b_ptr, d1, rstd, base + c1, c1, ok)
    _normed(y_ptr, w_ptr, b_ptr, d2, rstd, base + c2, c2, ok)
    _normed(y_ptr, w_ptr, b_ptr, d3, rstd, base + c3, c3, ok)


@triton.jit
def _quarter(dy_ptr, fork_ptr, x_ptr, bias_ptr, res_ptr, w_ptr, seed, threshold, base, c, ok,
             mean, rstd, scale, DROPOUT: tl.constexpr, FORKED: tl.constexpr):
    """The quarter row's normalised sum, output gradient (plus the fork's with ``FORKED``),
    gradient times weight, mask."""
    keep = ok
    if DROPOUT:
        keep = _kept(seed, base + c, threshold)
    s = _sum_in(x_ptr, bias_ptr, res_ptr, keep, base + c, c, ok, scale, DROPOUT)
    xh = tl.where(ok, (s - mean) * rstd, 0.0)
    dy = tl.load(dy_ptr + base + c, mask=ok, other=0.0).to(tl.float32)
    if FORKED:
        dy += tl.load(fork_ptr + base + c, mask=ok, other=0.0).to(tl.float32)
    g = dy * tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    return xh, dy, g, keep


@triton.jit
def _quarter_out(dres_ptr, dx_ptr, g, xh, keep, c1, c2, rstd, scale, at, ok,
                 DROPOUT: tl.constexpr):
    """Stores the quarter row's residual and dense-output gradients; returns the latter."""
    ds = (g - c2 - xh * c1) * rstd
    tl.store(dres_ptr + at, ds.to(dres_ptr.dtype.element_ty), mask=ok)
    dx = tl.where(ok, ds, 0.0)
    if DROPOUT:
        dx = tl.where(keep, dx * scale, 0.0)
    tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=ok)
    return dx


@triton.jit
def _column_sums(out, sx, sw, sb, c, ok, H: tl.constexpr):
    tl.store(out + c, sx, mask=ok)
    tl.store(out + H + c, sw, mask=ok)
    tl.store(out + 2 * H + c, sb, mask=ok)


@triton.jit
def layer_norm_backward_kernel(dy_ptr, fork_ptr, x_ptr, bias_ptr, res_ptr, w_ptr, seed_ptr,
                               mean_ptr, rstd_ptr, dres_ptr, dx_ptr, partial_ptr, rows,
                               threshold, scale, H: tl.constexpr, Q: tl.constexpr,
                               ROWS: tl.constexpr, DROPOUT: tl.constexpr, FORKED: tl.constexpr):
    pid = tl.program_id(0)
    seed = tl.load(seed_ptr).to(tl.uint32) if DROPOUT else 0
    q = tl.arange(0, Q)
    ok = q < H // 4
    c0 = q
    c1 = q + H // 4
    c2 = q + H // 2
    c3 = q + 3 * (H // 4)
    # column sums a quarter: dense bias (dx), LayerNorm weight (dy * xh) and bias (dy)
    sx0 = tl.zeros([Q], tl.float32)
    sx1 = tl.zeros([Q], tl.float32)
    sx2 = tl.zeros([Q], tl.float32)
    sx3 = tl.zeros([Q], tl.float32)
    sw0 = tl.zeros([Q], tl.float32)
    sw1 = tl.zeros([Q], tl.float32)
    sw2 = tl.zeros([Q], tl.float32)
    sw3 = tl.zeros([Q], tl.float32)
    sb0 = tl.zeros([Q], tl.float32)
    sb1 = tl.zeros([Q], tl.float32)
    sb2 = tl.zeros([Q], tl.float32)
    sb3 = tl.zeros([Q], tl.float32)
    for i in range(ROWS):
        row = pid * ROWS + i
        live = ok & (q * 0 + row < rows)
        row = tl.minimum(row, rows - 1)
        base = row.to(tl.int64) * H
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        xh0, dy0, g0, k0 = _quarter(dy_ptr, fork_ptr, x_ptr, bias_ptr, res_ptr, w_ptr,
                                    seed, threshold, base, c0, live, mean, rstd, scale, DROPOUT,
                                    FORKED)
        xh1, dy1, g1, k1 = _quarter(dy_ptr, fork_ptr, x_ptr, bias_ptr, res_ptr, w_ptr,
                                    seed, threshold, base, c1, live, mean, rstd, scale, DROPOUT,
                                    FORKED)
        xh2, dy2, g2, k2 = _quarter(dy_ptr, fork_ptr, x_ptr, bias_ptr, res_ptr, w_ptr,
                                    seed, threshold, base, c2, live, mean, rstd, scale, DROPOUT,
                                    FORKED)
        xh3, dy3, g3, k3 = _quarter(dy_ptr, fork_ptr, x_ptr, bias_ptr, res_ptr, w_ptr,
                                    seed, threshold, base, c3, live, mean, rstd, scale, DROPOUT,
                                    FORKED)
        cx = (tl.sum(g0 * xh0, 0) + tl.sum(g1 * xh1, 0) + tl.sum(g2 * xh2, 0)
              + tl.sum(g3 * xh3, 0)) / H
        cg = (tl.sum(g0, 0) + tl.sum(g1, 0) + tl.sum(g2, 0) + tl.sum(g3, 0)) / H
        sx0 += _quarter_out(dres_ptr, dx_ptr, g0, xh0, k0, cx, cg, rstd, scale, base + c0,
                            live, DROPOUT)
        sx1 += _quarter_out(dres_ptr, dx_ptr, g1, xh1, k1, cx, cg, rstd, scale, base + c1,
                            live, DROPOUT)
        sx2 += _quarter_out(dres_ptr, dx_ptr, g2, xh2, k2, cx, cg, rstd, scale, base + c2,
                            live, DROPOUT)
        sx3 += _quarter_out(dres_ptr, dx_ptr, g3, xh3, k3, cx, cg, rstd, scale, base + c3,
                            live, DROPOUT)
        sw0 += dy0 * xh0
        sw1 += dy1 * xh1
        sw2 += dy2 * xh2
        sw3 += dy3 * xh3
        sb0 += dy0
        sb1 += dy1
        sb2 += dy2
        sb3 += dy3
    out = partial_ptr + pid.to(tl.int64) * 3 * H
    _column_sums(out, sx0, sw0, sb0, c0, ok, H)
    _column_sums(out, sx1, sw1, sb1, c1, ok, H)
    _column_sums(out, sx2, sw2, sb2, c2, ok, H)
    _column_sums(out, sx3, sw3, sb3, c3, ok, H)


@triton.jit
def join_kernel(q_ptr, k_ptr, v_ptr, out_ptr, partial_ptr, rows, q_stride, k_stride, v_stride,
                H: tl.constexpr, RP: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                COPY: tl.constexpr):
    """Program (row group, column block) of ``out = cat((q, k, v), -1)`` [rows, 3H]: copies
    its ``RP`` rows of a BC-wide block ``BR`` rows at a time (unless ``COPY`` is false: ``q,
    k, v`` already are ``out``'s thirds), adding them up in fp32 as it goes, and writes the
    column sums to ``partial[row group]`` (fp32): one reduction a program, not one a tile."""
    group = tl.program_id(0)
    c = tl.program_id(1) * BC + tl.arange(0, BC)   # a column of out; a block lies in one part
    part = (tl.program_id(1) * BC) // H
    if part == 0:
        src, stride = q_ptr, q_stride
    elif part == 1:
        src, stride = k_ptr, k_stride
    else:
        src, stride = v_ptr, v_stride
    src_col = c - part * H
    total = tl.zeros([BR, BC], tl.float32)
    for r0 in range(group * RP, group * RP + RP, BR):
        r = r0 + tl.arange(0, BR)
        ok = (r[:, None] < rows) & (c[None, :] < 3 * H)
        r64 = r[:, None].to(tl.int64)
        tile = tl.load(src + r64 * stride + src_col[None, :], mask=ok, other=0.0)
        if COPY:
            tl.store(out_ptr + r64 * (3 * H) + c[None, :], tile, mask=ok)
        total += tile.to(tl.float32)
    tl.store(partial_ptr + group.to(tl.int64) * (3 * H) + c, tl.sum(total, 0), mask=c < 3 * H)


@triton.jit
def _half_erf(a, e):
    """``0.5 * erf(a)`` for ``a >= 0`` given ``e = exp(-a * a)`` (A&S 7.1.26)."""
    t = 1.0 / (1.0 + 0.3275911 * a)
    p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                     + t * 1.061405429))))
    return 0.5 - 0.5 * p * e


@triton.jit
def _gelu_cdf(u, e):
    """``Phi(u) = 0.5 * (1 + erf(u / sqrt 2))`` given ``e = exp(-u * u / 2)``."""
    half = _half_erf(tl.abs(u) * 0.7071067811865476, e)
    return 0.5 + tl.where(u < 0, -half, half)


@triton.jit
def _gelu_slope(u):
    """``gelu'(u)``, the exponential shared by its two terms."""
    e = tl.exp(-0.5 * u * u)
    return _gelu_cdf(u, e) + u * e * 0.3989422804014327


@triton.jit
def _biased(z_ptr, bias_ptr, rows, N: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """Program (row block, column block)'s tile of ``z + bias`` in fp32: it, its rows, the
    offsets and which lie in [rows, N]."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    ok = (r[:, None] < rows) & (c[None, :] < N)
    at = r[:, None].to(tl.int64) * N + c[None, :]
    u = tl.load(z_ptr + at, mask=ok, other=0.0).to(tl.float32) + tl.load(
        bias_ptr + c, mask=c < N, other=0.0).to(tl.float32)[None, :]
    return u, c, at, ok


@triton.jit
def gelu_kernel(z_ptr, bias_ptr, h_ptr, rows, N: tl.constexpr, BR: tl.constexpr,
                BC: tl.constexpr):
    """``h = gelu(z + bias)`` [rows, N], in ``h``'s dtype."""
    u, c, at, ok = _biased(z_ptr, bias_ptr, rows, N, BR, BC)
    h = u * _gelu_cdf(u, tl.exp(-0.5 * u * u))
    tl.store(h_ptr + at, h.to(h_ptr.dtype.element_ty), mask=ok)


@triton.jit
def gelu_backward_kernel(dh_ptr, z_ptr, bias_ptr, dz_ptr, partial_ptr, rows, N: tl.constexpr,
                         BR: tl.constexpr, BC: tl.constexpr):
    """``dz = dh * gelu'(z + bias)`` in ``dz``'s dtype, and the tile's column sums of ``dz``
    (fp32, before rounding) to ``partial[row block]``."""
    u, c, at, ok = _biased(z_ptr, bias_ptr, rows, N, BR, BC)
    slope = _gelu_slope(u)
    dz = tl.where(ok, tl.load(dh_ptr + at, mask=ok, other=0.0).to(tl.float32) * slope, 0.0)
    tl.store(dz_ptr + at, dz.to(dz_ptr.dtype.element_ty), mask=ok)
    tl.store(partial_ptr + tl.program_id(0).to(tl.int64) * N + c, tl.sum(dz, 0), mask=c < N)
