"""The ``fp8-ffn`` optimisation: the feed-forward block's GEMMs (forward, data gradient and
weight gradient) in FP8 (``torch._scaled_mm``, Hopper's FP8 tensor cores): activations and
weights in E4M3, gradients in E5M2, each tensor with one scale.

The scales are delayed (Transformer Engine's default recipe): a tensor's scale comes from the
largest magnitude it had over its last ``HISTORY`` casts, so each cast is one pass that also
records its magnitude (``fp8_kernels.py``). Each writes the tensor and its transpose (an FP8
GEMM takes its first operand row-major and its second column-major: the forward, data- and
weight-gradient products each need one side transposed): in the bias + GELU kernels forward
and backward (the bias gradient's column sums in the latter's pass), as a pass of its own for
the block's input, its output gradient and the weights. No bf16 copy of the activations is
kept for the backward. The first training step, before any history, scales each tensor by
its own magnitude. Evaluation runs the bf16 path.
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
# rows, columns and warps of a program: 64 x 64 tiles store runs of 64 bytes both ways
CAST = GELU_FORWARD = GELU_BACKWARD = (64, 64, 4)


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

    def _outputs(self, t, slot: int):
        """Empty ``t``-shaped FP8 tensors in the slot's format: the cast and its transpose."""
        dtype = FORMATS[slot % len(FORMATS)]
        return (torch.empty(t.shape, dtype=dtype, device=t.device),
                torch.empty(t.shape[::-1], dtype=dtype, device=t.device), dtype)

    def cast(self, t, slot: int):
        """``t`` [r, c] in its slot's format, its transpose [c, r] (row-major), and the inverse
        scale."""
        scale, amax, inverse = self._slot(t, slot)
        if not t.is_cuda:
            torch.maximum(amax, t.abs().amax().float(), out=amax)
            t8 = _scale_by(t, scale, FORMATS[slot % len(FORMATS)])
            return t8, t8.t().contiguous(), inverse
        k, _ = _kernels()
        t8, t8t, dtype = self._outputs(t, slot)
        _launch(k.cast_transpose_kernel, CAST, *t.shape, t, t8, t8t, scale,
                amax.view(torch.int32), t.shape[0], C=t.shape[1], FMAX=torch.finfo(dtype).max)
        return t8, t8t, inverse

    def gelu(self, z, bias, slot: int):
        """GELU(z + bias) cast as :meth:`cast` casts."""
        if not z.is_cuda or self.steps < 2:
            g = torch.nn.functional.gelu(z.float() + bias.float())
            if not z.is_cuda:
                return self.cast(g, slot)
        scale, amax, inverse = self._slot(g if self.steps < 2 else z, slot)
        k, _ = _kernels()
        g8, g8t, dtype = self._outputs(z, slot)
        _launch(k.gelu_forward_kernel, GELU_FORWARD, *z.shape, z, bias, g8, g8t, scale,
                amax.view(torch.int32), z.shape[0], N=z.shape[1], FMAX=torch.finfo(dtype).max)
        return g8, g8t, inverse

    def gelu_backward(self, dg, z, bias, slot: int):
        """GELU's input gradient cast as :meth:`cast` casts, and its column sums (fp32: the
        bias gradient)."""
        if not dg.is_cuda or self.steps < 2:
            dz = dg.float() * _gelu_slope(z.float() + bias.float())
            if not dg.is_cuda:
                return (*self.cast(dz, slot), dz.sum(0))
        scale, amax, inverse = self._slot(dz if self.steps < 2 else dg, slot)
        k, column_sums = _kernels()
        rows, n = dg.shape
        dz8, dz8t, dtype = self._outputs(dg, slot)
        partial = torch.empty(-(-rows // GELU_BACKWARD[0]), n, dtype=torch.float32,
                              device=dg.device)
        _launch(k.gelu_backward_kernel, GELU_BACKWARD, rows, n, dg, z, bias, dz8, dz8t, partial,
                scale, amax.view(torch.int32), rows, N=n, FMAX=torch.finfo(dtype).max)
        return dz8, dz8t, inverse, column_sums(partial)


def _mm(a, b_t, scale_a, scale_b, fast: bool):
    """``a @ b_t.t()`` in bf16 of E4M3/E5M2 ``a`` and ``b_t`` (both row-major)."""
    return torch._scaled_mm(a, b_t.t(), scale_a, scale_b, out_dtype=torch.bfloat16,
                            use_fast_accum=fast)


class FeedForward(torch.autograd.Function):
    """``gelu(x @ w1.T + b1) @ w2.T`` (the output block's bias left to it) with its forward,
    data-gradient and weight-gradient GEMMs in FP8; ``x`` [..., hidden], the output bf16."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, scales: Scales, base: int):
        h = x.shape[-1]
        x2 = x.reshape(-1, h).to(torch.bfloat16)
        if x.is_cuda and x2.shape[0] % 16:
            raise UserError(f"fp8-ffn: {x2.shape[0]} tokens in a batch; FP8 GEMMs take a "
                            "multiple of 16: add unpad (its token counts are multiples of its "
                            "bucket) or make batch x sequence length a multiple of 16")
        w1_8, w1t_8, w1_inv = scales.cast(w1, base + W1)
        w2_8, w2t_8, w2_inv = scales.cast(w2, base + W2)
        x8, x8t, x_inv = scales.cast(x2, base + X)
        z = _mm(x8, w1_8, x_inv, w1_inv, fast=True)
        g8, g8t, g_inv = scales.gelu(z, b1, base + G)
        y = _mm(g8, w2_8, g_inv, w2_inv, fast=True)
        ctx.save_for_backward(z, b1, x8t, g8t, w1t_8, w2t_8)
        # views of the scales' buffer, which later casts write (not saved tensors): a slot's
        # changes only when the next step begins
        ctx.inverses = x_inv, g_inv, w1_inv, w2_inv
        ctx.scales, ctx.base, ctx.shape, ctx.dtypes = scales, base, x.shape, (
            x.dtype, w1.dtype, w2.dtype)
        return y.view(x.shape[:-1] + (w2.shape[0],))

    @staticmethod
    def backward(ctx, dy):
        z, b1, x8t, g8t, w1t_8, w2t_8 = ctx.saved_tensors
        x_inv, g_inv, w1_inv, w2_inv = ctx.inverses
        scales, base = ctx.scales, ctx.base
        x_dtype, w1_dtype, w2_dtype = ctx.dtypes
        dy2 = dy.reshape(-1, dy.shape[-1]).to(torch.bfloat16)
        dy8, dy8t, dy_inv = scales.cast(dy2, base + DY)
        dg = _mm(dy8, w2t_8, dy_inv, w2_inv, fast=False)
        dw2 = _mm(dy8t, g8t, dy_inv, g_inv, fast=False)
        dz8, dz8t, dz_inv, db1 = scales.gelu_backward(dg, z, b1, base + DZ)
        dx = _mm(dz8, w1t_8, dz_inv, w1_inv, fast=False)
        dw1 = _mm(dz8t, x8t, dz_inv, x_inv, fast=False)
        return (dx.view(ctx.shape).to(x_dtype), dw1.to(w1_dtype), db1.to(b1.dtype),
                dw2.to(w2_dtype), None, None)


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
    "fp8-ffn", "the feed-forward GEMMs (forward, data and weight gradients) in FP8 with "
    "delayed per-tensor scales, the casts written by the bias + GELU Triton kernels (fp8.py)",
    apply=lambda wl, _: fp8_ffn(wl.net), excludes=("compile",), precisions=("amp-bf16",),
    compare=None, tested_by="tests/benchmarks/bert/test_fp8.py")
