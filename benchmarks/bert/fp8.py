"""The ``fp8-ffn`` optimisation: the feed-forward block's two GEMMs, forward and data gradient,
in FP8 (``torch._scaled_mm``, Hopper's FP8 tensor cores): activations and weights in E4M3,
gradients in E5M2, each tensor with one scale.

The activations' and gradients' scales are delayed (Transformer Engine's default recipe): a
tensor's scale comes from the largest magnitude it had over its last ``HISTORY`` casts, so its
cast is one pass that also records its magnitude, compiled by Inductor into the kernel that
produces it (bias + GELU forward, GELU's backward) or a pass of its own (the block's input and
its output gradient, [tokens, hidden]). The first training step, before any history, scales
each tensor by its own magnitude. The weights are cast each step by their current magnitude,
each with a transposed copy for the data gradient (FP8 GEMMs take their second operand
column-major only). The weight gradients stay bf16 GEMMs: in FP8 they would need transposed
FP8 copies of the [tokens, 4 x hidden] activations. Evaluation runs the bf16 path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.bert.model import Layer, mix_in
from common.errors import UserError
from common.fusion import compiled
from common.optimisations import Optimisation

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HISTORY = 16   # casts a delayed scale looks back over
# a layer's four scaled tensors: the block's input, GELU's output (the GEMMs' first operands,
# E4M3), the block's output gradient and GELU's input gradient (E5M2)
X, G, DY, DZ = range(4)
FORMATS = (E4M3, E4M3, E5M2, E5M2)


def _fast(fn):
    """``fn`` as Inductor's kernels on a GPU, eager on the CPU."""
    return lambda x, *args: (compiled(fn) if x.is_cuda else fn)(x, *args)


def _quantise(t, dtype, scales, amaxes, slot, current: bool):
    """``t`` scaled into ``dtype`` (saturating) and the inverse scale; its magnitude written to
    ``amaxes[slot]``. The scale: ``scales[slot]``, or from ``t``'s own magnitude if ``current``."""
    fmax = torch.finfo(dtype).max
    amax = t.abs().amax().float().view(1)
    amaxes.index_copy_(0, slot, amax)
    scale = torch.where(amax > 0, fmax / amax, 1.0) if current else scales.index_select(0, slot)
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype), 1.0 / scale


@_fast
def _cast(t, dtype, scales, amaxes, slot, current: bool):
    return _quantise(t, dtype, scales, amaxes, slot, current)


@_fast
def _cast_weight(w):
    """``w`` in E4M3 by its current magnitude, a transposed contiguous copy, the inverse scale."""
    amax = w.abs().amax().float().view(1)
    scale = torch.where(amax > 0, torch.finfo(E4M3).max / amax, 1.0)
    w8 = (w.float() * scale).clamp(-torch.finfo(E4M3).max, torch.finfo(E4M3).max).to(E4M3)
    return w8, w8.t().contiguous(), 1.0 / scale


@_fast
def _bias_gelu(z, bias, scales, amaxes, slot, current: bool):
    """GELU(z + bias) in ``z``'s dtype and in E4M3 with its inverse scale."""
    g = F.gelu(z.float() + bias.float())
    return (g.to(z.dtype), *_quantise(g, E4M3, scales, amaxes, slot, current))


@_fast
def _bias_gelu_backward(dg, z, bias, scales, amaxes, slot, current: bool):
    """GELU's input gradient in ``dg``'s dtype and in E5M2 with its inverse scale, and its
    column sums (the bias gradient, fp32)."""
    u = z.float() + bias.float()
    slope = 0.5 * (1.0 + torch.erf(u * 0.7071067811865476)) + u * torch.exp(
        -0.5 * u * u) * 0.3989422804014327
    dz = dg.float() * slope
    return (dz.to(dg.dtype), *_quantise(dz, E5M2, scales, amaxes, slot, current), dz.sum(0))


def _advance(history, amaxes, scales, fmax):
    history.copy_(torch.cat((amaxes[:, None], history[:, :-1]), 1))
    top = history.amax(1)
    scales.copy_(torch.where(torch.isfinite(top) & (top > 0), fmax / top, 1.0))


class Scales:
    """The delayed scales of ``layers`` feed-forward blocks' four tensors each: the magnitudes
    of each one's last casts, and the scale its next cast multiplies by."""

    def __init__(self, layers: int, device):
        n = len(FORMATS) * layers
        self.history = torch.zeros(n, HISTORY, device=device)
        self.amaxes = torch.zeros(n, device=device)   # the latest cast's, written by the casts
        self.scales = torch.ones(n, device=device)
        self.fmax = torch.tensor([torch.finfo(f).max for f in FORMATS] * layers, device=device)
        # one index tensor a slot (a tensor input, so one compiled graph serves every slot)
        self.slots = [torch.tensor([i], device=device) for i in range(n)]
        self.steps = 0   # training forwards so far

    @property
    def current(self) -> bool:
        """Whether the casts scale by their own magnitude (no history yet)."""
        return self.steps < 2

    def advance(self) -> None:
        """A training forward begins: the last step's magnitudes join the history."""
        if self.steps:
            _fast(_advance)(self.history, self.amaxes, self.scales, self.fmax)
        self.steps += 1

    def cast(self, t, slot: int, dtype):
        return _cast(t, dtype, self.scales, self.amaxes, self.slots[slot], self.current)


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
        w1_8, w1t_8, w1_inv = _cast_weight(w1)
        w2_8, w2t_8, w2_inv = _cast_weight(w2)
        x8, x_inv = scales.cast(x2, base + X, E4M3)
        z = _mm(x8, w1_8, x_inv, w1_inv, fast=True)
        g, g8, g_inv = _bias_gelu(z, b1, scales.scales, scales.amaxes, scales.slots[base + G],
                                  scales.current)
        y = _mm(g8, w2_8, g_inv, w2_inv, fast=True)
        ctx.save_for_backward(x2, z, g, b1, w1t_8, w1_inv, w2t_8, w2_inv)
        ctx.scales, ctx.base, ctx.shape, ctx.dtypes = scales, base, x.shape, (
            x.dtype, w1.dtype, w2.dtype)
        return y.view(x.shape[:-1] + (w2.shape[0],))

    @staticmethod
    def backward(ctx, dy):
        x2, z, g, b1, w1t_8, w1_inv, w2t_8, w2_inv = ctx.saved_tensors
        scales, base = ctx.scales, ctx.base
        x_dtype, w1_dtype, w2_dtype = ctx.dtypes
        dy2 = dy.reshape(-1, dy.shape[-1]).to(torch.bfloat16)
        dy8, dy_inv = scales.cast(dy2, base + DY, E5M2)
        dg = _mm(dy8, w2t_8, dy_inv, w2_inv, fast=False)
        dz, dz8, dz_inv, db1 = _bias_gelu_backward(dg, z, b1, scales.scales, scales.amaxes,
                                                   scales.slots[base + DZ], scales.current)
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
    "per-tensor scales, the casts fused into the GELU chain (fp8.py)",
    apply=lambda wl, _: fp8_ffn(wl.net), excludes=("compile",), precisions=("amp-bf16",),
    compare=None, tested_by="tests/benchmarks/bert/test_fp8.py")
