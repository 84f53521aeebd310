"""The joint and the loss over the valid ``(t, u)`` pairs only (``packed-joint``), not the
reference's padded grid ``[B, T, U+1, V+1]``: rows utterance by utterance at offsets
``cumsum(T_b * (U_b + 1))`` like NVIDIA's ``batch_offset``, ``t`` major (:func:`packed_index`),
the add, ReLU and dropout in one autograd function that keeps only its output, and the loss
read from those rows (:func:`packed_transducer_loss`). The same logits and loss on the valid
pairs; the joint's dropout draws its masks over the packed rows.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from benchmarks.rnnt.loss import (
    NEG_INF,
    label_ids,
    lattice,
    reduce_losses,
    reference_log_probs,
    transducer_nll,
)
from benchmarks.rnnt.model import RNNT, stacked_lengths
from common.kernel_profile import region
from common.optimisations import Optimisation


def packed_index(enc_lens: torch.Tensor, pred_lens: torch.Tensor, total: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``(b, t, u)`` of every valid pair ``t < enc_lens[b]``, ``u < pred_lens[b]``
    (``pred_lens`` = label lengths + 1), utterance by utterance, ``t`` major. ``total``, the
    number of pairs, spares a device-to-host copy when the caller knows it."""
    sizes = enc_lens.long() * pred_lens.long()
    b = torch.repeat_interleave(torch.arange(len(sizes), device=sizes.device), sizes,
                                output_size=total)
    start = torch.cumsum(sizes, 0) - sizes
    local = torch.arange(len(b), device=b.device) - start[b]
    width = pred_lens.long()[b]
    return b, local // width, local % width


def row_sums(x: torch.Tensor, rows: torch.Tensor, n: int, segments: bool | None = None
             ) -> torch.Tensor:
    """``[n, H]``: row ``i`` is the sum of the rows ``j`` of ``x [N, H]`` with ``rows[j] == i``,
    in ``x``'s dtype, accumulated in fp32 or wider. ``segments`` (default: on CUDA) sorts
    ``rows`` and reduces each run, as ``nn.Embedding``'s backward does; otherwise
    ``index_add_``, whose CUDA atomic adds round to bf16 at every add (a bf16 sum of hundreds
    of rows stalls) while its CPU kernel accumulates in fp32 and that backward does not."""
    if x.is_cuda if segments is None else segments:
        return torch.ops.aten.embedding_dense_backward(x, rows, n, -1, False)
    return x.new_zeros(n, x.shape[1]).index_add_(0, rows, x)


def gather_add_relu_dropout(f: torch.Tensor, g: torch.Tensor, rows_f: torch.Tensor,
                            rows_g: torch.Tensor, p: float) -> torch.Tensor:
    """``dropout(relu(f[rows_f] + g[rows_g]), p)`` with the gather and the add as one
    ``embedding_bag`` (a sum of two rows of ``[f; g]``), so neither gathered ``[N, H]`` tensor
    is made; the reference of ``compiled_joint``'s."""
    pairs = torch.stack((rows_f, rows_g + len(f)), 1)
    out = F.embedding_bag(pairs, torch.cat((f, g)), mode="sum").relu_()
    return F.dropout(out, p, training=True) if p > 0 else out   # one fused kernel on the GPU


class _AddReluDropout(torch.autograd.Function):
    """``dropout(relu(f[rows_f] + g[rows_g]))`` by ``gather`` (a function of
    ``(f, g, rows_f, rows_g, p)``), saving only its output: the output is positive exactly
    where the gradient passes (scaled by ``1 / (1 - p)``); the backward sums the gradient's
    rows with :func:`row_sums`."""

    @staticmethod
    def forward(ctx, f: torch.Tensor, g: torch.Tensor, rows_f: torch.Tensor,
                rows_g: torch.Tensor, p: float, gather) -> torch.Tensor:
        out = gather(f, g, rows_f, rows_g, p)
        ctx.save_for_backward(out, rows_f, rows_g)
        ctx.scale = 1.0 / (1.0 - p)
        ctx.sizes = len(f), len(g)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out, rows_f, rows_g = ctx.saved_tensors
        grad = torch.ops.aten.threshold_backward(grad, out, 0)   # grad where out > 0, else 0
        grad_f, grad_g = (row_sums(grad, rows, n) for rows, n in zip((rows_f, rows_g),
                                                                    ctx.sizes))
        if ctx.scale != 1.0:
            grad_f, grad_g = grad_f.mul_(ctx.scale), grad_g.mul_(ctx.scale)
        return grad_f, grad_g, None, None, None, None


def add_relu_dropout(f: torch.Tensor, g: torch.Tensor, rows_f: torch.Tensor,
                     rows_g: torch.Tensor, p: float, training: bool,
                     gather=gather_add_relu_dropout) -> torch.Tensor:
    """``dropout(relu(f[rows_f] + g[rows_g]), p)``: ``f [Nf, H]``, ``g [Ng, H]`` -> ``[N, H]``,
    the forward by ``gather`` (:func:`gather_add_relu_dropout`'s contract)."""
    return _AddReluDropout.apply(f, g, rows_f, rows_g, p if training else 0.0, gather)


def joint_packed(model: RNNT, enc: torch.Tensor, pred: torch.Tensor, enc_lens: torch.Tensor,
                 label_lens: torch.Tensor, total: int | None = None,
                 gather=gather_add_relu_dropout) -> torch.Tensor:
    """``model``'s joint on the valid pairs only: ``[N, vocab_size+1]``, rows in
    :func:`packed_index` order (``N = sum(enc_lens * (label_lens + 1))``, or ``total``);
    ``gather``: the hidden layer's forward (:func:`add_relu_dropout`)."""
    b, t, u = packed_index(enc_lens, label_lens + 1, total)
    f = model.joint_enc(enc).flatten(0, 1)
    g = model.joint_pred(pred).flatten(0, 1)
    h = add_relu_dropout(f, g, b * enc.shape[1] + t, b * pred.shape[1] + u,
                         model.joint_dropout, model.training, gather)
    return model.joint_net(h)


def packed_transducer_loss(logits: torch.Tensor, enc_lens: torch.Tensor, labels: torch.Tensor,
                           label_lens: torch.Tensor, blank: int = -1, reduction: str = "mean",
                           log_probs=reference_log_probs, walk=lattice,
                           longest: tuple[int, int] | None = None) -> torch.Tensor:
    """:func:`benchmarks.rnnt.loss.transducer_loss` of packed logits ``[N, V]``, one row per
    valid ``(b, t, u)`` in :func:`packed_index` order; no ``[B, T, U+1, V]`` tensor is made.
    ``longest``, the largest ``enc_lens`` and ``label_lens`` when the caller has them on the
    host, spares reading them from the device."""
    blank %= logits.shape[-1]
    b, t, u = packed_index(enc_lens, label_lens + 1, len(logits))
    blank_row, label_row = log_probs(logits, *label_ids(labels, label_lens, b, u), blank)
    longest_t, longest_u = longest or (int(enc_lens.max()), int(label_lens.max()))
    shape = (len(enc_lens), longest_t, longest_u + 1)
    grid = torch.full(shape, NEG_INF, dtype=blank_row.dtype, device=logits.device)
    blank_lp = grid.index_put((b, t, u), blank_row)
    label_lp = grid.index_put((b, t, u), label_row)
    return reduce_losses(transducer_nll(blank_lp, label_lp, enc_lens, label_lens, walk),
                         reduction)


def packed_forward(self, feats: torch.Tensor, feat_lens: torch.Tensor, labels: torch.Tensor,
                   label_lens: torch.Tensor) -> torch.Tensor:
    """``workload.TransducerLoss.forward`` on the packed pairs; their count and the longest
    (T, U) read once, before the encoder's work is queued: the step's only wait."""
    m = self.model
    feat_host, label_host = torch.stack((feat_lens, label_lens)).long().tolist()
    enc_host = [stacked_lengths(n, m.encoder.stack_time_factor) for n in feat_host]
    total = sum(t * (u + 1) for t, u in zip(enc_host, label_host))
    with region("encoder"):
        enc, enc_lens = self.encode(feats, feat_lens)
    with region("prediction"):
        pred = self.predict(labels)
    with region("joint"):
        logits = joint_packed(m, enc, pred, enc_lens, label_lens, total, self.gather)
    with region("loss"):
        return packed_transducer_loss(logits, enc_lens, labels, label_lens, m.blank,
                                      log_probs=self.log_probs, walk=self.walk,
                                      longest=(max(enc_host), max(label_host)))


def apply(wl, _) -> None:
    wl.train_loss.gather = gather_add_relu_dropout
    wl.train_loss.forward = types.MethodType(packed_forward, wl.train_loss)


OPTIMISATION = Optimisation(
    "packed-joint", "the joint and the loss over the valid (t, u) pairs only, not the padded "
    "grid (benchmarks/rnnt/packed_joint.py)", apply=apply, compare=None,
    tested_by="tests/benchmarks/rnnt/test_workload.py (its joint dropout draws other masks)")
