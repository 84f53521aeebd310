"""Flash attention over packed variable-length sequences as an autograd function: ATen's
``_flash_attention_forward``/``_backward`` with cumulative sequence offsets, whose shapes are
static, so that it runs inside CUDA graphs (SDPA's nested-tensor path has no such form)."""

from __future__ import annotations

import torch


class FlashVarlen(torch.autograd.Function):
    """``q, k, v`` [tokens, heads, dim] (bf16/fp16 on CUDA); sequence ``i`` is rows
    ``offsets[i]:offsets[i + 1]`` (int32); dropout ``dropout_p`` on the probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, offsets, max_len: int, dropout_p: float):
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, offsets, offsets, max_len, max_len, dropout_p, False, False)
        ctx.save_for_backward(q, k, v, out, lse, offsets, rng, unused)
        ctx.max_len, ctx.dropout_p = max_len, dropout_p
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, offsets, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad.contiguous(), q, k, v, out, lse, offsets, offsets, ctx.max_len, ctx.max_len,
            ctx.dropout_p, False, rng, unused)
        return dq, dk, dv, None, None, None
