"""The ``fp8-ffn`` optimisation: the feed-forward block's forward and data-gradient GEMMs in
FP8 (``torch._scaled_mm``, Hopper's FP8 tensor cores): activations and weights in E4M3,
gradients in E5M2, each tensor with one scale; ``fp8-wgrad``: its weight-gradient GEMMs too.

The scales are delayed (Transformer Engine's default recipe): a tensor's scale comes from the
largest magnitude it had over its last ``HISTORY`` casts, so each cast is one pass that also
records its magnitude (``fp8_kernels.py``): in the bias + GELU kernels forward and backward
(the bias gradient's column sums in the latter's pass), a pass of its own for the block's
input, its output gradient and the weights. An FP8 GEMM takes its first operand row-major and
its second column-major, so the weights' FP8 copies are transposed for the data gradient;
with ``fp8-wgrad`` the activations' and gradients' are too, for the weight gradient, and no
bf16 copy of the activations is kept for the backward. Each transpose is a pass of its own
over the FP8 tensor.
The first training step, before any history, scales each tensor by its own magnitude (as
the kernel computes it: a measuring run of the cast first).
Evaluation runs the bf16 path.
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
# rows, columns and warps of a program (cast, GELU forward with its bf16 copy and without it,
# GELU backward, FP8 transpose): the fastest of 16-128 rows, 32-256 columns and 4 or 8 warps
# for [10240, 4096] on one H200 (GELU forward 89 and 75.5 us, backward 122 us, the transpose
# 26.1 us, a bf16 copy 44 us)
CAST, GELU_BACKWARD, TRANSPOSE = (64, 128, 4), (64, 64, 4), (64, 128, 4)
GELU = {True: (16, 128, 8), False: (32, 128, 4)}   # by whether the bf16 copy is kept


def _kernels():
    """This module's kernels, and BERT's shared ones (``launch``, ``column_sums``)."""
    from benchmarks.bert import fp8_kernels as k
    from benchmarks.bert import kernels as shared
    return k, shared


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
        self.wgrad = False   # fp8-wgrad: the weight-gradient GEMMs in FP8 too

    def advance(self) -> None:
        """A training forward begins: the last step's magnitudes join the history."""
        if self.steps:
            on_gpu(_advance, self.history, self.amaxes, self.scales, self.inverses, self.fmax)
        self.steps += 1

    def _slot(self, slot: int, launch):
        """The slot's scale, its amax and its inverse scale, each a one-element view; while
        there is no history, the scale is by the magnitude that ``launch(scale, amax)`` (the
        cast about to run) records first in a measuring run, so the kernel's own arithmetic
        sets it."""
        one = slice(slot, slot + 1)
        if self.steps < 2:
            launch(self.scales[one], self.amaxes[one])
            amax = self.amaxes[one]
            self.scales[one] = torch.where(amax > 0, self.fmax[slot] / amax, 1.0)
            self.inverses[slot] = 1.0 / self.scales[one]
        return self.scales[one], self.amaxes[one], self.inverses[slot, :1]

    def _fp8(self, t, slot: int):
        """An empty ``t``-shaped tensor in the slot's FP8 format."""
        return torch.empty(t.shape, dtype=FORMATS[slot % len(FORMATS)], device=t.device)

    @staticmethod
    def _transposed(t8):
        """The FP8 [r, c] ``t8``'s transpose [c, r], row-major (``transpose_kernel``)."""
        k, shared = _kernels()
        t8t = torch.empty(t8.shape[::-1], dtype=t8.dtype, device=t8.device)
        shared.launch(k.transpose_kernel, TRANSPOSE, *t8.shape, t8, t8t, t8.shape[0],
                      C=t8.shape[1])
        return t8t

    def cast(self, t, slot: int, transpose: bool):
        """``t`` [r, c] in its slot's format, (``transpose``) its transpose [c, r] row-major or
        None, and the inverse scale."""
        dtype = FORMATS[slot % len(FORMATS)]
        if t.is_cuda:
            k, shared = _kernels()
            t8 = self._fp8(t, slot)

            def launch(scale, amax):
                shared.launch(k.cast_kernel, CAST, *t.shape, t, t8, scale,
                              amax.view(torch.int32), t.shape[0], C=t.shape[1],
                              FMAX=torch.finfo(dtype).max)
                return t8
        else:
            def launch(scale, amax):
                torch.maximum(amax, t.abs().amax().float(), out=amax)
                return _scale_by(t, scale, dtype)
        scale, amax, inverse = self._slot(slot, launch)
        t8 = launch(scale, amax)
        if transpose:
            return t8, self._transposed(t8) if t.is_cuda else t8.t().contiguous(), inverse
        return t8, None, inverse

    def gelu(self, z, bias, slot: int):
        """GELU(z + bias) in E4M3; what the weight gradient needs of it (its FP8 transpose
        with ``wgrad``, else it in ``z``'s dtype); the inverse scale."""
        if not z.is_cuda:
            g = torch.nn.functional.gelu(z.float() + bias.float())
            g8, g8t, inverse = self.cast(g, slot, self.wgrad)
            return g8, g8t if self.wgrad else g.to(z.dtype), inverse
        k, shared = _kernels()
        g8 = self._fp8(z, slot)
        keep = None if self.wgrad else torch.empty_like(z)

        def launch(scale, amax):
            shared.launch(k.gelu_forward_kernel, GELU[keep is not None], *z.shape, z, bias, g8,
                          keep, scale, amax.view(torch.int32), z.shape[0], N=z.shape[1],
                          FMAX=torch.finfo(E4M3).max)

        scale, amax, inverse = self._slot(slot, launch)
        launch(scale, amax)
        return g8, self._transposed(g8) if self.wgrad else keep, inverse

    def gelu_backward(self, dg, z, bias, slot: int):
        """GELU's input gradient in E5M2, what the weight gradient needs of it (as
        :meth:`gelu`), the inverse scale, and its column sums (the bias gradient: summed in
        fp32, in ``bias``'s dtype)."""
        if not dg.is_cuda:
            dz = dg.float() * _gelu_slope(z.float() + bias.float())
            dz8, dz8t, inverse = self.cast(dz, slot, self.wgrad)
            return (dz8, dz8t if self.wgrad else dz.to(dg.dtype), inverse,
                    dz.sum(0).to(bias.dtype))
        k, shared = _kernels()
        rows, n = dg.shape
        dz8 = self._fp8(dg, slot)
        keep = None if self.wgrad else torch.empty_like(dg)
        partial = torch.empty(-(-rows // GELU_BACKWARD[0]), n, dtype=torch.float32,
                              device=dg.device)

        def launch(scale, amax):
            shared.launch(k.gelu_backward_kernel, GELU_BACKWARD, rows, n, dg, z, bias, dz8,
                          keep, partial, scale, amax.view(torch.int32), rows, N=n,
                          FMAX=torch.finfo(E5M2).max)

        scale, amax, inverse = self._slot(slot, launch)
        launch(scale, amax)
        return (dz8, self._transposed(dz8) if self.wgrad else keep, inverse,
                shared.column_sums(partial, bias.dtype))


def _mm(a, b_t, scale_a, scale_b, fast: bool):
    """``a @ b_t.t()`` in bf16 of E4M3/E5M2 ``a`` and ``b_t`` (both row-major)."""
    return torch._scaled_mm(a, b_t.t(), scale_a, scale_b, out_dtype=torch.bfloat16,
                            use_fast_accum=fast)


class FeedForward(torch.autograd.Function):
    """``gelu(x @ w1.T + b1) @ w2.T`` (the output block's bias left to it) with its forward
    and data-gradient GEMMs in FP8, and its weight-gradient GEMMs too where ``scales.wgrad``;
    ``x`` [..., hidden], the output in bf16."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, scales: Scales, base: int):
        h = x.shape[-1]
        x2 = x.reshape(-1, h).to(torch.bfloat16)
        if x.is_cuda and x2.shape[0] % 16:
            raise UserError(f"fp8-ffn: {x2.shape[0]} tokens in a batch; FP8 GEMMs take a "
                            "multiple of 16: add unpad (its token counts are multiples of its "
                            "bucket) or make batch x sequence length a multiple of 16")
        wgrad = scales.wgrad
        w1_8, w1t_8, w1_inv = scales.cast(w1, base + W1, transpose=True)
        w2_8, w2t_8, w2_inv = scales.cast(w2, base + W2, transpose=True)
        x8, x8t, x_inv = scales.cast(x2, base + X, transpose=wgrad)
        z = _mm(x8, w1_8, x_inv, w1_inv, fast=True)
        g8, g_kept, g_inv = scales.gelu(z, b1, base + G)
        y = _mm(g8, w2_8, g_inv, w2_inv, fast=True)
        ctx.save_for_backward(z, b1, x8t if wgrad else x2, g_kept, w1t_8, w2t_8)
        # views of the scales' buffer, which later casts write (not saved tensors): a slot's
        # changes only when the next step begins
        ctx.inverses = x_inv, g_inv, w1_inv, w2_inv
        ctx.scales, ctx.base, ctx.wgrad, ctx.shape, ctx.dtypes = scales, base, wgrad, x.shape, (
            x.dtype, w1.dtype, w2.dtype)
        return y.view(x.shape[:-1] + (w2.shape[0],))

    @staticmethod
    def backward(ctx, dy):
        z, b1, x_kept, g_kept, w1t_8, w2t_8 = ctx.saved_tensors
        x_inv, g_inv, w1_inv, w2_inv = ctx.inverses
        scales, base, wgrad = ctx.scales, ctx.base, ctx.wgrad
        x_dtype, w1_dtype, w2_dtype = ctx.dtypes
        dy2 = dy.reshape(-1, dy.shape[-1]).to(torch.bfloat16)
        dy8, dy8t, dy_inv = scales.cast(dy2, base + DY, transpose=wgrad)
        dg = _mm(dy8, w2t_8, dy_inv, w2_inv, fast=False)
        dz8, dz_kept, dz_inv, db1 = scales.gelu_backward(dg, z, b1, base + DZ)
        dx = _mm(dz8, w1t_8, dz_inv, w1_inv, fast=False)
        if wgrad:   # [out, tokens] row-major times [tokens, in] column-major
            dw1 = _mm(dz_kept, x_kept, dz_inv, x_inv, fast=False)
            dw2 = _mm(dy8t, g_kept, dy_inv, g_inv, fast=False)
        else:
            dw1, dw2 = dz_kept.t().mm(x_kept), dy2.t().mm(g_kept)
        return (dx.view(ctx.shape).to(x_dtype), dw1.to(w1_dtype), db1,
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
    "fp8-ffn", "the feed-forward GEMMs (forward and data gradient) in FP8 with delayed "
    "per-tensor scales, the casts written by the bias + GELU Triton kernels (fp8.py)",
    apply=lambda wl, _: fp8_ffn(wl.net), excludes=("compile",), precisions=("amp-bf16",),
    compare=None, tested_by="tests/benchmarks/bert/test_fp8.py")


def fp8_wgrad(model: torch.nn.Module) -> None:
    """``model``'s ``fp8-ffn`` blocks run their weight-gradient GEMMs in FP8 too."""
    model.bert.encoder.layer[0].fp8[0].wgrad = True


FP8_WGRAD = Optimisation(
    "fp8-wgrad", "fp8-ffn's weight-gradient GEMMs in FP8 too: each FP8 activation and "
    "gradient transposed by a pass of its own, no bf16 activations kept for the backward "
    "(fp8.py)",
    apply=lambda wl, _: fp8_wgrad(wl.net), requires=("fp8-ffn",), precisions=("amp-bf16",),
    compare=None, tested_by="tests/benchmarks/bert/test_fp8.py")
