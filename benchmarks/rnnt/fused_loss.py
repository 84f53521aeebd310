"""The transducer loss's log-softmax fused into it (``fused-loss``), as NVIDIA's MLPerf RNN-T
does: :func:`benchmarks.rnnt.loss.reference_log_probs` goes through an fp32 copy of the whole
``[N, V]`` logits (and its fp32 gradient); here the two log-probabilities per row come from a
row log-sum-exp taken in chunks of rows, and the backward pass writes the softmax gradient
chunk by chunk in the logits' dtype, with the reference's arithmetic (the same rounding).
"""

from __future__ import annotations

import torch

from benchmarks.rnnt.loss import log_probs_at
from common.optimisations import Optimisation

CHUNK_ELEMENTS = 2**26   # fp32 elements per chunk: 256 MiB, 64k rows of 1024


def _chunk_norm(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row log-sum-exp of one chunk of logits as ``torch.logsumexp(x.to(dtype), -1)`` computes
    it, without that copy: the max taken in ``x``'s dtype, ``x`` cast inside the subtraction."""
    m = x.amax(-1, keepdim=True).to(dtype)
    m.masked_fill_(m.isinf(), 0.0)
    return (x - m).exp_().sum(-1).log_().add_(m[:, 0])



class _FusedLogProbs(torch.autograd.Function):
    """``(logits [N, V], ids [N], has_label [N], blank, chunk_rows)`` -> ``(blank_lp [N],
    label_lp [N])``, the log-softmax at the blank's and at ``ids``' columns (fp32 or wider;
    -inf where ``has_label`` is false), ``chunk_rows`` rows of the vocabulary at a time, with
    the reference path's arithmetic (the same rounding), in place where it can be."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor, has_label: torch.Tensor,
                blank: int, chunk_rows: int):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        norm = torch.cat([_chunk_norm(x, dtype) for x in logits.split(chunk_rows)])
        ctx.save_for_backward(logits, norm, ids, has_label)
        ctx.blank, ctx.chunk_rows = blank, chunk_rows
        return log_probs_at(logits, norm, ids, has_label, blank)

    @staticmethod
    def backward(ctx, g_blank: torch.Tensor, g_label: torch.Tensor):
        """``-softmax * (g_blank + g_label)``, plus ``g_blank`` at the blank's column and
        ``g_label`` at the label's: one fp32 chunk, written once into the logits' dtype."""
        logits, norm, ids, has_label = ctx.saved_tensors
        g_label = torch.where(has_label, g_label, 0.0)   # the -inf rows are constants
        scale = -(g_blank + g_label)[:, None]
        grad = torch.empty_like(logits)
        for s in range(0, len(logits), ctx.chunk_rows):
            e = s + ctx.chunk_rows
            g = (logits[s:e] - norm[s:e, None]).exp_().mul_(scale[s:e])
            g[:, ctx.blank] += g_blank[s:e]
            grad[s:e] = g.scatter_add_(1, ids[s:e, None], g_label[s:e, None])
        return grad, None, None, None, None


def fused_log_probs(logits: torch.Tensor, ids: torch.Tensor, has_label: torch.Tensor,
                    blank: int, chunk_rows: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference_log_probs``' contract, ``chunk_rows`` rows at a time (default:
    ``CHUNK_ELEMENTS // V``)."""
    chunk_rows = chunk_rows or max(1, CHUNK_ELEMENTS // logits.shape[-1])
    return _FusedLogProbs.apply(logits, ids, has_label, blank, chunk_rows)


def apply(wl, _) -> None:
    wl.train_loss.log_probs = fused_log_probs


OPTIMISATION = Optimisation(
    "fused-loss", "the loss's log-softmax fused into it, in chunks of rows: no fp32 copy of "
    "the logits (benchmarks/rnnt/fused_loss.py)", apply=apply, excludes=("compiled-loss",),
    rtol=1e-6)
