"""The ``fp8-ffn`` optimisation: the feed-forward block's two GEMMs, forward and data gradient,
in FP8 (``torch._scaled_mm``, Hopper's FP8 tensor cores): activations and weights in E4M3,
gradients in E5M2, each tensor with one scale.

The scales are delayed (Transformer Engine's default recipe): a tensor's scale comes from the
largest magnitude it had over its last ``HISTORY`` casts, so each cast is one pass that also
records its magnitude (``fp8_kernels.py``), written beside the bf16 result by the kernels that
produce it (bias + GELU forward and backward, the bias gradient's column sums in the latter's
pass) or a pass of its own (the block's input, its output gradient, the weights with their
transposed copies: FP8 GEMMs take their second operand column-major only). The first training
step, before any history, scales each tensor by its own magnitude. The weight gradients stay
bf16 GEMMs: in FP8 they would need transposed FP8 copies of the [tokens, 4 x hidden]
activations. Evaluation runs the bf16 path.
"""

from __future__ import annotations

import torch

from benchmarks.bert.model import Layer, mix_in
from common.errors import UserError
from common.fusion import on_gpu
from common.optimisations import Optimisation

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HISTORY = 16   # casts a delayed scale looks back over
# a layer's scaled tensors: the block's input and GELU's output (the forward GEMMs' first
# operands), the block's output gradient and GELU's input gradient (the data-gradient GEMMs'),
# the two weights
X, G, DY, DZ, W1, W2 = range(6)
FORMATS = (E4M3, E4M3, E5M2, E5M2, E4M3, E4M3)
# rows, columns and warps of a program: the fastest of 16-64 rows, 64-256 columns and 4 or 8
# warps for [10240, 4096] on one H200 (the GELU kernels 89 and 122 us, a bf16 copy 44 us)
CAST, GELU_FORWARD, GELU_BACKWARD = (64, 128, 4), (16, 128, 8), (64, 64, 4)


def _kernels():
    from benchmarks.bert import fp8_kernels as k
    from benchmarks.bert.kernels import column_sums
    return k, column_sums


def _launch(kernel, tile, rows: int, cols: int, *args, **constants):
    """``kernel`` over [rows, cols] in ``tile``'s programs."""
    br, bc, warps = tile
    kernel[(-(-rows // br), -(-cols // bc))](*args, BR=br, BC=bc, num_warps=warps, **constants)


def _scale_by(t, scale, dtype):
    """``t * scale`` saturated in ``dtype`` (the CPU's reference of the kernels' casts)."""
    fmax = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype)


def _gelu_slope(u):
    return 0.5 * (1.0 + torch.erf(u * 0.7071067811865476)) + u * torch.exp(
        -0.5 * u * u) * 0.3989422804014327


def _advance(history, amaxes, scales, inverses, fmax):
    history.copy_(torch.cat((amaxes[:, None], history[:, :-1]), 1))
    top = history.amax(1)
    scales.copy_(torch.where(torch.isfinite(top) & (top > 0), fmax / top, 1.0))
    inverses.copy_((1.0 / scales)[:, None].expand(inverses.shape))
    amaxes.zero_()


class Scales:
    """The delayed scales of ``layers`` feed-forward blocks' six tensors each: the magnitudes
    of each one's last casts, the scale its next cast multiplies by and its inverse (the FP8
    GEMM's). Casts run as Triton kernels on the GPU, as torch operations on the CPU."""

    def __init__(self, layers: int, device):
        n = len(FORMATS) * layers
        self.history = torch.zeros(n, HISTORY, device=device)
        self.amaxes = torch.zeros(n, device=device)   # this step's, folded in by the casts
        self.scales = torch.ones(n, device=device)
        # a row of four a slot: cuBLASLt takes a scale only at a 16-byte aligned address
        self.inverses = torch.ones(n, 4, device=device)
        self.fmax = torch.tensor([torch.finfo(f).max for f in FORMATS] * layers, device=device)
        self.steps = 0   # training forwards so far

    def advance(self) -> None:
        """A training forward begins: the last step's magnitudes join the history."""
        if self.steps:
            on_gpu(_advance, self.history, self.amaxes, self.scales, self.inverses, self.fmax)
        self.steps += 1

    def _slot(self, t, slot: int):
        """The slot's scale (by ``t``'s own magnitude while there is no history), its amax
        and its inverse scale, each a one-element view."""
        one = slice(slot, slot + 1)
        if self.steps < 2:
            amax = t.abs().amax().float()
            self.scales[one] = torch.where(amax > 0, self.fmax[slot] / amax, 1.0)
            self.inverses[slot] = 1.0 / self.scales[one]
        return self.scales[one], self.amaxes[one], self.inverses[slot, :1]

    def _record(self, t, amax):
        if not t.is_cuda:
            torch.maximum(amax, t.abs().amax().float(), out=amax)

    def cast(self, t, slot: int):
        """``t`` [rows, n] in its slot's format, and the inverse scale."""
        scale, amax, inverse = self._slot(t, slot)
        dtype = FORMATS[slot % len(FORMATS)]
        self._record(t, amax)
        if not t.is_cuda:
            return _scale_by(t, scale, dtype), inverse
        k, _ = _kernels()
        y = torch.empty(t.shape, dtype=dtype, device=t.device)
        _launch(k.cast_kernel, CAST, *t.shape, t, y, scale, amax.view(torch.int32), t.shape[0],
                N=t.shape[1], FMAX=torch.finfo(dtype).max)
        return y, inverse

    def cast_weight(self, w, slot: int):
        """``w`` [r, c] in E4M3, its transpose [c, r] (row-major), and the inverse scale."""
        scale, amax, inverse = self._slot(w, slot)
        self._record(w, amax)
        if not w.is_cuda:
            w8 = _scale_by(w, scale, E4M3)
            return w8, w8.t().contiguous(), inverse
        k, _ = _kernels()
        w8 = torch.empty(w.shape, dtype=E4M3, device=w.device)
        w8t = torch.empty(w.shape[::-1], dtype=E4M3, device=w.device)
        _launch(k.cast_transpose_kernel, CAST, *w.shape, w, w8, w8t, scale,
                amax.view(torch.int32), R=w.shape[0], C=w.shape[1], FMAX=torch.finfo(E4M3).max)
        return w8, w8t, inverse

    def gelu(self, z, bias, slot: int):
        """GELU(z + bias) in ``z``'s dtype and in E4M3, and the inverse scale."""
        if not z.is_cuda:
            g = torch.nn.functional.gelu(z.float() + bias.float())
            return (g.to(z.dtype), *self.cast(g, slot))
        scale, amax, inverse = self._slot(
            torch.nn.functional.gelu(z.float() + bias.float()) if self.steps < 2 else z, slot)
        k, _ = _kernels()
        g = torch.empty_like(z)
        g8 = torch.empty(z.shape, dtype=E4M3, device=z.device)
        _launch(k.gelu_forward_kernel, GELU_FORWARD, *z.shape, z, bias, g, g8, scale,
                amax.view(torch.int32), z.shape[0], N=z.shape[1], FMAX=torch.finfo(E4M3).max)
        return g, g8, inverse

    def gelu_backward(self, dg, z, bias, slot: int):
        """GELU's input gradient in ``dg``'s dtype and in E5M2, the inverse scale, and the
        gradient's column sums (fp32: the bias gradient)."""
        if not dg.is_cuda:
            dz = dg.float() * _gelu_slope(z.float() + bias.float())
            return (dz.to(dg.dtype), *self.cast(dz, slot), dz.sum(0))
        if self.steps < 2:
            dz = dg.float() * _gelu_slope(z.float() + bias.float())
        scale, amax, inverse = self._slot(dz if self.steps < 2 else dg, slot)
        k, column_sums = _kernels()
        rows, n = dg.shape
        dz = torch.empty_like(dg)
        dz8 = torch.empty(dg.shape, dtype=E5M2, device=dg.device)
        partial = torch.empty(-(-rows // GELU_BACKWARD[0]), n, dtype=torch.float32,
                              device=dg.device)
        _launch(k.gelu_backward_kernel, GELU_BACKWARD, rows, n, dg, z, bias, dz, dz8, partial,
                scale, amax.view(torch.int32), rows, N=n, FMAX=torch.finfo(E5M2).max)
        return dz, dz8, inverse, column_sums(partial)


def _mm(a, b_t, scale_a, scale_b, fast: bool):
    """``a @ b_t.t()`` in bf16 of E4M3/E5M2 ``a`` and ``b_t`` (both row-major)."""
    return torch._scaled_mm(a, b_t.t(), scale_a, scale_b, out_dtype=torch.bfloat16,
                            use_fast_accum=fast)


class FeedForward(torch.autograd.Function):
    """``gelu(x @ w1.T + b1) @ w2.T`` (the output block's bias left to it) with FP8 forward and
    data-gradient GEMMs; ``x`` [..., hidden], the output in bf16."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, scales: Scales, base: int):
        h = x.shape[-1]
        x2 = x.reshape(-1, h).to(torch.bfloat16)
        if x.is_cuda and x2.shape[0] % 16:
            raise UserError(f"fp8-ffn: {x2.shape[0]} tokens in a batch; FP8 GEMMs take a "
                            "multiple of 16: add unpad (its token counts are multiples of its "
                            "bucket) or make batch x sequence length a multiple of 16")
        w1_8, w1t_8, w1_inv = scales.cast_weight(w1, base + W1)
        w2_8, w2t_8, w2_inv = scales.cast_weight(w2, base + W2)
        x8, x_inv = scales.cast(x2, base + X)
        z = _mm(x8, w1_8, x_inv, w1_inv, fast=True)
        g, g8, g_inv = scales.gelu(z, b1, base + G)
        y = _mm(g8, w2_8, g_inv, w2_inv, fast=True)
        ctx.save_for_backward(x2, z, g, b1, w1t_8, w2t_8)
        # views of the scales' buffer, which later casts write (not ``inverses[slot]``)
        ctx.inverses = w1_inv, w2_inv
        ctx.scales, ctx.base, ctx.shape, ctx.dtypes = scales, base, x.shape, (
            x.dtype, w1.dtype, w2.dtype)
        return y.view(x.shape[:-1] + (w2.shape[0],))

    @staticmethod
    def backward(ctx, dy):
        x2, z, g, b1, w1t_8, w2t_8 = ctx.saved_tensors
        w1_inv, w2_inv = ctx.inverses
        scales, base = ctx.scales, ctx.base
        x_dtype, w1_dtype, w2_dtype = ctx.dtypes
        dy2 = dy.reshape(-1, dy.shape[-1]).to(torch.bfloat16)
        dy8, dy_inv = scales.cast(dy2, base + DY)
        dg = _mm(dy8, w2t_8, dy_inv, w2_inv, fast=False)
        dz, dz8, dz_inv, db1 = scales.gelu_backward(dg, z, b1, base + DZ)
        dx = _mm(dz8, w1t_8, dz_inv, w1_inv, fast=False)
        return (dx.view(ctx.shape).to(x_dtype), dz.t().mm(x2).to(w1_dtype),
                db1.to(b1.dtype), dy2.t().mm(g).to(w2_dtype), None, None)


class Fp8FeedForward:
    """Mixed into a :class:`Layer` class: in training, the feed-forward block as
    :class:`FeedForward`, then the output block's bias, dropout, residual and LayerNorm."""

    def forward(self, x, mask):
        if not self.training:
            return super().forward(x, mask)
        x = self.attention(x, mask)
        dense1, out = self.intermediate.dense, self.output
        y = FeedForward.apply(x, dense1.weight, dense1.bias, out.dense.weight, *self.fp8)
        return out.after_dense(y, x)


def fp8_ffn(model: torch.nn.Module) -> Scales:
    """Every encoder layer of ``model`` runs its feed-forward GEMMs in FP8 while training."""
    layers = model.bert.encoder.layer
    device = next(model.parameters()).device
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise UserError(f"fp8-ffn: {torch.cuda.get_device_name(device)} has no FP8 tensor "
                        "cores (compute capability 8.9 or later: Ada, Hopper): leave it out")
    c = model.config
    if c.hidden_size % 16 or c.intermediate_size % 16:
        raise UserError(f"fp8-ffn: hidden size {c.hidden_size} and intermediate size "
                        f"{c.intermediate_size} must be multiples of 16 (FP8 GEMMs)")
    scales = Scales(len(layers), device)
    for i, layer in enumerate(layers):
        layer.fp8 = scales, len(FORMATS) * i
    mix_in(model, Layer, Fp8FeedForward)
    model.bert.encoder.register_forward_pre_hook(
        lambda m, _: scales.advance() if m.training else None)
    return scales


FP8_FFN = Optimisation(
    "fp8-ffn", "the feed-forward GEMMs (forward and data gradient) in FP8 with delayed "
    "per-tensor scales, the casts written by the bias + GELU Triton kernels (fp8.py)",
    apply=lambda wl, _: fp8_ffn(wl.net), excludes=("compile",), precisions=("amp-bf16",),
    compare=None, tested_by="tests/benchmarks/bert/test_fp8.py")
