"""The ``triton-attention`` optimisation: ``unpad``'s flash attention as Triton kernels
(``attention_kernels.py``) whose tiles use Hopper's tensor-core instructions, the attention
dropout drawn inside them (16 bits of a hash of each entry's index and the step's seed, one
hash for two entries; the seed from ``seeds.py``'s one draw a forward pass) and redrawn by the
backward; ATen's flash attention is the reference.
The query, key and value gradients are written side by side in one [tokens, 3, heads, dim]
buffer, the layout of ``fused-qkv``'s projection output."""

from __future__ import annotations

import math

import torch

from benchmarks.bert.attention import Packing, UnpaddedSelfAttention
from benchmarks.bert.model import mix_in
from benchmarks.bert.seeds import draw, number, seed_of
from common.optimisations import Optimisation

# (rows, keys, warps, stages) of a program's tile: forward, key/value and query gradients
FORWARD = 64, 64, 4, 3
DKDV = 32, 64, 4, 3
DQ = 64, 64, 4, 3


def _kernels():
    from benchmarks.bert import attention_kernels as k
    return k


class TritonFlashVarlen(torch.autograd.Function):
    """``q, k, v`` [tokens, heads, dim] (the last dimension contiguous, on CUDA); sequence
    ``i`` is rows ``offsets[i]:offsets[i + 1]`` (int32), none longer than ``max_len``;
    dropout ``dropout_p`` on the probabilities; ``seed``: the dropout's (an int64 [1] on the
    device; drawn here if None)."""

    @staticmethod
    def forward(ctx, q, k, v, offsets, max_len: int, dropout_p: float, seed=None):
        kern = _kernels()
        t, heads, d = q.shape
        if any(x.stride(-1) != 1 or x.stride(1) != d for x in (q, k, v)):
            raise ValueError("triton-attention needs each token's heads side by side")
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty(heads, t, dtype=torch.float32, device=q.device)
        if seed is None:
            seed = draw(1, q.device) if dropout_p > 0 else lse
        args = _common(t, max_len, dropout_p, d)
        bm, bn, warps, stages = FORWARD
        if t:
            kern.attention_forward_kernel[(-(-max_len // bm), offsets.numel() - 1, heads)](
                q, k, v, o, lse, offsets, seed, q.stride(0), k.stride(0), v.stride(0),
                o.stride(0), t, *args[:4], D=d, BM=bm, BN=bn, DROPOUT=dropout_p > 0,
                num_warps=warps, num_stages=stages)
        ctx.save_for_backward(q, k, v, o, lse, offsets, seed)
        ctx.max_len, ctx.dropout_p = max_len, dropout_p
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, offsets, seed = ctx.saved_tensors
        kern = _kernels()
        t, heads, d = q.shape
        do = do if do.stride(-1) == 1 and do.stride(1) == d else do.contiguous()
        delta = torch.empty_like(lse)
        grads = torch.empty(t, 3, heads, d, dtype=q.dtype, device=q.device)
        dq, dk, dv = grads.unbind(1)
        if t:
            args = _common(t, ctx.max_len, ctx.dropout_p, d)
            dropout = ctx.dropout_p > 0
            sequences = offsets.numel() - 1
            bm, bn, warps, stages = DQ   # first: it writes delta
            kern.attention_dq_kernel[(-(-ctx.max_len // bm), sequences, heads)](
                q, k, v, o, do, dq, lse, delta, offsets, seed, q.stride(0), k.stride(0),
                v.stride(0), o.stride(0), do.stride(0), dq.stride(0), t, *args, D=d, BM=bm,
                BN=bn, DROPOUT=dropout, num_warps=warps, num_stages=stages)
            bm, bn, warps, stages = DKDV
            kern.attention_dkdv_kernel[(-(-ctx.max_len // bn), sequences, heads)](
                q, k, v, do, dk, dv, lse, delta, offsets, seed, q.stride(0), k.stride(0),
                v.stride(0), do.stride(0), dk.stride(0), dv.stride(0), t, *args, D=d, BM=bm,
                BN=bn, DROPOUT=dropout, num_warps=warps, num_stages=stages)
        return dq, dk, dv, None, None, None, None


def _common(t: int, max_len: int, p: float, d: int) -> tuple:
    """The longest sequence, the dropout threshold, 1 / keep probability, the base-2 softmax
    scale, the softmax scale."""
    scale = 1.0 / math.sqrt(d)
    return (max_len, round(p * 65536), 1.0 / (1.0 - p) if p < 1 else 0.0,
            scale * math.log2(math.e), scale)


class TritonAttention:
    """Mixed into an unpadded self-attention: ``flash`` as :class:`TritonFlashVarlen`."""

    def flash(self, q, k, v, packing: Packing, p: float):
        return TritonFlashVarlen.apply(q, k, v, packing.offsets, packing.max_len, p,
                                       seed_of(self))


def triton_attention(net: torch.nn.Module) -> None:
    """Every unpadded self-attention of ``net`` with :class:`TritonAttention`, its seed from
    ``net``'s one draw a forward pass."""
    mix_in(net, UnpaddedSelfAttention, TritonAttention)
    number(net, TritonAttention)


TRITON_ATTENTION = Optimisation(
    "triton-attention", "unpad's flash attention as Triton kernels using Hopper's tensor-core "
    "instructions, the dropout drawn and redrawn inside them, the three input gradients "
    "written side by side (attention_triton.py)",
    apply=lambda wl, _: triton_attention(wl.net),
    requires=("unpad",), cuda=True, compare=None,
    tested_by="tests/benchmarks/bert/test_attention_triton.py")
