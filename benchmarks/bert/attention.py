"""The attention optimisations ``sdpa`` and ``unpad``, each a class swap on the plain model.

Unpadded attention runs flash attention on CUDA through ATen's ``_flash_attention_forward`` /
``_backward``, whose static shapes run inside CUDA graphs, and one SDPA call per sequence
elsewhere. Training batches are packed on the host as they are read (``bucketed_packing``),
evaluation batches exactly (``Packing.from_mask``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.bert.model import BertForPreTraining, SelfAttention, swap_class
from common.errors import UserError
from common.hparams import checked, positive
from common.optimisations import Optimisation


class SdpaSelfAttention(SelfAttention):
    def attend(self, q, k, v, mask, p: float):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :].bool(),
                                              dropout_p=p)


SDPA = Optimisation(
    "sdpa", "attention on the padded batch as one scaled_dot_product_attention call "
    "(attention.py)", apply=lambda wl, _: swap_class(wl.net, SelfAttention, SdpaSelfAttention),
    rtol=1e-6)


@dataclass
class Packing:
    """Where the tokens of a padded ``[batch, seq]`` batch live in the packed token matrix.

    ``index`` [tokens]: the flat positions (``b * seq + s``) packed; ``offsets`` (int32):
    sequence ``i`` is rows ``offsets[i]:offsets[i + 1]``, the batch's sequences first, then
    any filler sequences of padding positions (no output reads them: zero gradient).
    """

    index: torch.Tensor
    offsets: torch.Tensor
    max_len: int

    @classmethod
    def from_mask(cls, mask: torch.Tensor) -> Packing:
        """The exact packing of ``mask`` (real tokens first in every row, as BERT pads)."""
        lengths = mask.sum(1)
        offsets = F.pad(lengths.cumsum(0), (1, 0)).int()
        return cls(mask.flatten().nonzero().squeeze(1), offsets, mask.shape[1])


def bucketed_packing(mask: np.ndarray, micro: int, bucket: int) -> tuple[np.ndarray, ...]:
    """``index`` [micro, tokens] (int64) and ``offsets`` [micro, 2 * rows + 1] (int32):
    static-shape packings of the ``micro`` micro-batches of ``mask`` [batch, seq] (host), each
    of ``rows`` sequences.

    The token count is the largest micro-batch's rounded up to a multiple of ``bucket`` (at
    most all positions), so one CUDA graph serves every batch of a bucket. Each micro-batch's
    gap to it (up to ``rows * seq`` positions in a smaller micro-batch) is covered by ``rows``
    filler sequences of padding positions (some empty): every packed row is in a sequence, so
    attention writes every row of its output.
    """
    b, s = mask.shape
    parts = mask.reshape(micro, b // micro, s).astype(bool)
    cap = min(-(-int(parts.sum((1, 2)).max()) // bucket) * bucket, b // micro * s)
    fillers = b // micro
    index, offsets = [], []
    for part in parts:
        flat = part.reshape(-1)
        real, pad = np.flatnonzero(flat), np.flatnonzero(~flat)
        tail = cap - len(real)
        index.append(np.concatenate([real, pad[:tail]]))
        filler = np.clip(tail - s * np.arange(fillers), 0, s)
        offsets.append(np.cumsum(np.concatenate([[0], part.sum(1), filler])))
    return np.stack(index).astype(np.int64), np.stack(offsets).astype(np.int32)


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


class UnpaddedSelfAttention(SelfAttention):
    """Self-attention of the packed tokens ``x`` [tokens, hidden] within each sequence of
    ``packing`` (what the encoder passes as its mask)."""

    def forward(self, x, packing: Packing):
        t, h = x.shape
        q, k, v = (y.view(t, self.heads, self.head_dim) for y in self.project(x))
        p = self.dropout_p if self.training else 0.0
        if x.is_cuda:
            return self.flash(q, k, v, packing, p).reshape(t, h)
        bounds = packing.offsets.tolist()
        pieces = [F.scaled_dot_product_attention(*(y[a:b].transpose(0, 1) for y in (q, k, v)),
                                                 dropout_p=p).transpose(0, 1)
                  for a, b in zip(bounds, bounds[1:]) if b > a]
        return torch.cat(pieces).reshape(t, h)

    def flash(self, q, k, v, packing: Packing, p: float):
        """Attention within each packed sequence of ``q, k, v`` [tokens, heads, dim] on CUDA."""
        return FlashVarlen.apply(q, k, v, packing.offsets, packing.max_len, p)


class UnpaddedBertForPreTraining(BertForPreTraining):
    def forward(self, input_ids, segment_ids, input_mask, masked_lm_positions,
                pack_index=None, pack_offsets=None):
        """``pack_index``/``pack_offsets``: a ``bucketed_packing`` of the batch (static
        shapes); without them the exact packing of ``input_mask``."""
        b, s = input_ids.shape
        x = self.bert.embeddings(input_ids, segment_ids)
        packing = (Packing(pack_index, pack_offsets, s) if pack_index is not None
                   else Packing.from_mask(input_mask))
        x = self.bert.encoder(x.view(b * s, -1)[packing.index], packing)
        starts = packing.offsets[:b].long()
        return self.heads(x[starts[:, None] + masked_lm_positions], x[starts])


def unpad(model: BertForPreTraining) -> None:
    """``model`` (built plain) on the packed tokens."""
    swap_class(model, SelfAttention, UnpaddedSelfAttention)
    swap_class(model, BertForPreTraining, UnpaddedBertForPreTraining)


def _select(wl, bucket: int) -> None:
    if wl.env.device.type == "cuda" and wl.precision.name != "amp-bf16":
        raise UserError(f"optimisation unpad runs flash attention, which has no "
                        f"{wl.precision.name} kernel: use --precision amp-bf16")
    wl.impl.packing = partial(bucketed_packing, micro=wl.hp.grad_accum, bucket=bucket)
    wl.impl.bucket = bucket


UNPAD = Optimisation(
    "unpad", "padding removed: every layer on the packed tokens, flash attention over the "
    "packed sequences; =BUCKET: each batch's token count rounded up to a multiple of BUCKET, "
    "one CUDA graph a bucket (attention.py)", select=_select, apply=lambda wl, _: unpad(wl.net),
    value_type=checked(int, positive), default=512, excludes=("sdpa",),
    rtol=3e-3)   # dropout masks drawn over the packed shapes
