"""The transducer loss's log-softmax as two compiled kernels (``compiled-loss``).

``fused-loss`` (``fused_loss._FusedLogProbs``, the reference for this one) keeps the fp32 work
in chunks of rows but still runs several elementwise passes over each (docs/performance.md,
RNN-T). Here ``torch.compile`` turns the forward's row log-sum-exp into one reduction that
reads the logits once, and the whole backward, the blank's and the label's columns included
(compared against a column index, no scatter), into one elementwise kernel that reads the
logits and writes the gradient in their dtype: no fp32 ``[N, V]`` tensor, no chunks. Both are
compiled for any number of rows (:func:`rows_dynamic`).
"""

from __future__ import annotations

import torch

from benchmarks.rnnt.loss import log_probs_at
from common.optimisations import Optimisation


def rows_dynamic(*tensors: torch.Tensor) -> None:
    """Mark the first dimension (rows) of ``tensors`` symbolic for ``torch.compile`` and leave
    the others constants: compiled once for any number of rows. ``dynamic=True`` would make
    the widths symbolic too, and every element's row a 64-bit division."""
    for t in tensors:
        torch._dynamo.maybe_mark_dynamic(t, 0)


@torch.compile
def _row_logsumexp(logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    x = logits.to(dtype)
    m = x.amax(-1, keepdim=True)
    m = torch.where(m.isinf(), 0.0, m)
    return (x - m).exp().sum(-1).log() + m[:, 0]


@torch.compile
def _log_softmax_grad(logits: torch.Tensor, norm: torch.Tensor, g_blank: torch.Tensor,
                      g_label: torch.Tensor, ids: torch.Tensor, blank: int) -> torch.Tensor:
    g = (logits.to(norm.dtype) - norm[:, None]).exp() * -(g_blank + g_label)[:, None]
    column = torch.arange(logits.shape[1], device=logits.device)
    g = g + torch.where(column == blank, g_blank[:, None], 0.0)
    g = g + torch.where(column == ids[:, None], g_label[:, None], 0.0)
    return g.to(logits.dtype)


class CompiledLogProbs(torch.autograd.Function):
    """``fused_loss._FusedLogProbs``'s contract: ``(logits [N, V], ids [N], has_label [N], blank)``
    -> ``(blank_lp [N], label_lp [N])``, the log-softmax at the blank's and at ``ids``'
    columns (fp32 or wider; -inf where ``has_label`` is false)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor, has_label: torch.Tensor,
                blank: int):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        rows_dynamic(logits)
        norm = _row_logsumexp(logits, dtype)
        ctx.save_for_backward(logits, norm, ids, has_label)
        ctx.blank = blank
        return log_probs_at(logits, norm, ids, has_label, blank)

    @staticmethod
    def backward(ctx, g_blank: torch.Tensor, g_label: torch.Tensor):
        logits, norm, ids, has_label = ctx.saved_tensors
        g_label = torch.where(has_label, g_label, 0.0)   # the -inf rows are constants
        rows_dynamic(logits, norm, g_blank, g_label, ids)
        return _log_softmax_grad(logits, norm, g_blank, g_label, ids, ctx.blank), None, None, None


def apply(wl, _) -> None:
    wl.train_loss.log_probs = CompiledLogProbs.apply


OPTIMISATION = Optimisation(
    "compiled-loss", "the loss's log-softmax as two compiled kernels: no fp32 copy of the "
    "logits (benchmarks/rnnt/compiled_loss.py)", apply=apply, rtol=1e-6)
