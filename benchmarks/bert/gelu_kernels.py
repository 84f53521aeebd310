"""The Triton kernels of ``triton-gelu`` (``gelu_triton.py``): imported on first use, so that
the CPU tests need no Triton."""

import triton
import triton.language as tl

next_power_of_2 = triton.next_power_of_2
SQRT1_2 = 0.7071067811865476
INV_SQRT_2PI = 0.3989422804014327


@triton.jit
def _tile(z_ptr, bias_ptr, rows, n, BM: tl.constexpr, BN: tl.constexpr, row0):
    """A [BM, BN] tile of ``z + bias`` from row ``row0`` (fp32), its offsets and mask."""
    r = row0 + tl.arange(0, BM)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    ok = (r[:, None] < rows) & (c[None, :] < n)
    at = r[:, None].to(tl.int64) * n + c[None, :]
    z = tl.load(z_ptr + at, mask=ok, other=0.0).to(tl.float32)
    z += tl.load(bias_ptr + c, mask=c < n, other=0.0).to(tl.float32)[None, :]
    return z, at, ok


@triton.jit
def forward_kernel(z_ptr, bias_ptr, y_ptr, rows, n, BM: tl.constexpr, BN: tl.constexpr):
    """``y = gelu(z + bias)`` (erf form) over a [BM, BN] tile."""
    z, at, ok = _tile(z_ptr, bias_ptr, rows, n, BM, BN, tl.program_id(0) * BM)
    y = 0.5 * z * (1.0 + tl.math.erf(z * SQRT1_2))
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def backward_kernel(dy_ptr, z_ptr, bias_ptr, dz_ptr, partial_ptr, rows, n,
                    BM: tl.constexpr, BN: tl.constexpr, ROWS: tl.constexpr):
    """``dz = dy * gelu'(z + bias)`` over ``ROWS`` rows of a BN-wide column strip, and the
    strip's column sums of ``dz`` (the bias gradient's part) in ``partial``."""
    total = tl.zeros([BN], tl.float32)
    for i in range(0, ROWS, BM):
        z, at, ok = _tile(z_ptr, bias_ptr, rows, n, BM, BN, tl.program_id(0) * ROWS + i)
        cdf = 0.5 * (1.0 + tl.math.erf(z * SQRT1_2))
        grad = cdf + z * INV_SQRT_2PI * tl.exp(-0.5 * z * z)
        dz = tl.load(dy_ptr + at, mask=ok, other=0.0).to(tl.float32) * grad
        tl.store(dz_ptr + at, dz.to(dz_ptr.dtype.element_ty), mask=ok)
        total += tl.sum(dz, 0)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    tl.store(partial_ptr + tl.program_id(0).to(tl.int64) * n + c, total, mask=c < n)
