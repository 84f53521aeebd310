"""The transducer (RNN-T) loss: the negative log-likelihood of the labels summed over all
alignments (Graves 2012), reduced as the MLPerf 1.1 reference reduces it.

The reference (``rnnt/loss.py``) calls warp-transducer's ``RNNTLoss(blank=vocab_size)`` with
its default reduction ``'mean'``: the sum of the per-utterance losses divided by the batch size
(the binding's docstring says "divided by the target lengths"; its code does not).

The reference path here is pure PyTorch, vectorised over the batch: only the blank's and the
next label's log-probabilities enter the lattice, so those two per cell are taken from the
logits' rows by ``log_probs`` (:func:`reference_log_probs`: one log-sum-exp over the
vocabulary in fp32) and the lattice runs on them in log space, one anti-diagonal ``t + u`` per
step (no cancellation, ``T + U`` steps, two kernels each: :func:`lattice`, or ``walk``). Its
backward pass uses the beta variables, the same recursion on each utterance's reversed
lattice, run with the forward one as a single lattice of twice the batch; autograd keeps no
per-step graph. An utterance without labels has one alignment, its blanks along ``t``.
"""

from __future__ import annotations

import torch

REDUCTIONS = ("mean", "sum", "none")
NEG_INF = float("-inf")


def lattice(wt: torch.Tensor, wu: torch.Tensor, init: torch.Tensor) -> torch.Tensor:
    """``V [B, T, U1]`` with ``V[:, 0, 0] = init`` and ``V[t, u] = logaddexp(V[t-1, u] +
    wt[t, u], V[t, u-1] + wu[t, u])`` (missing neighbours are -inf), computed diagonal by
    diagonal: cell ``(t, u)`` lives at ``[t + u, u]`` of the skewed grids, two kernels a
    diagonal (one add of both moves' weights, one ``logaddexp``)."""
    B, T, U1 = wt.shape
    D = T + U1 - 1
    u = torch.arange(U1, device=wt.device)
    t = torch.arange(D, device=wt.device)[:, None] - u
    outside = (t < 0) | (t >= T)
    t = t.clamp(0, T - 1)
    skew = torch.stack((wu[:, t, u], wt[:, t, u]), 2).masked_fill(outside[:, None], NEG_INF)
    # diagonal d at out[:, d, 1:] after a -inf column, so out[:, d, u:u + 2] holds the two
    # neighbours (t, u - 1) and (t - 1, u) of diagonal d + 1's cell u: one overlapping view
    out = wt.new_full((B, D, U1 + 1), NEG_INF)
    out[:, 0, 1] = init
    pairs = out.as_strided((B, D, 2, U1), (out.stride(0), out.stride(1), 1, 1))
    moves = wt.new_empty(B, 2, U1)
    from_u, from_t = moves.unbind(1)
    for prev, w, diag in zip(pairs.unbind(1), skew.unbind(1)[1:], out[:, 1:, 1:].unbind(1)):
        torch.add(prev, w, out=moves)
        torch.logaddexp(from_t, from_u, out=diag)
    return out[:, torch.arange(T, device=wt.device)[:, None] + u, u + 1]


def _valid(enc_lens: torch.Tensor, label_lens: torch.Tensor, T: int, U1: int) -> torch.Tensor:
    """``[B, T, U1]``: the lattice's cells ``t < enc_lens[b]``, ``u <= label_lens[b]``."""
    t = torch.arange(T, device=enc_lens.device)[:, None]
    u = torch.arange(U1, device=enc_lens.device)
    return (t < enc_lens[:, None, None]) & (u <= label_lens[:, None, None])


def _last(x: torch.Tensor, enc_lens: torch.Tensor, label_lens: torch.Tensor) -> torch.Tensor:
    """``x[b, enc_lens[b] - 1, label_lens[b]]`` for each ``b``."""
    return x[torch.arange(len(x), device=x.device), enc_lens - 1, label_lens]


def _flip(x: torch.Tensor, enc_lens: torch.Tensor, label_lens: torch.Tensor) -> torch.Tensor:
    """Each utterance's lattice reversed, ``(t, u) -> (T_b - 1 - t, U_b - u)``, -inf outside
    it: its own inverse on the utterance's cells."""
    B, T, U1 = x.shape
    rows = torch.arange(B, device=x.device)[:, None, None]
    t = enc_lens[:, None, None] - 1 - torch.arange(T, device=x.device)[:, None]
    u = label_lens[:, None, None] - torch.arange(U1, device=x.device)
    return x[rows, t.clamp(min=0), u.clamp(min=0)].masked_fill((t < 0) | (u < 0), NEG_INF)


def _alpha_beta(blank: torch.Tensor, label: torch.Tensor, enc_lens: torch.Tensor,
                label_lens: torch.Tensor, walk=lattice) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward variables ``alpha[t, u]`` (log-probability of reaching ``(t, u)``) and backward
    ones ``beta[t, u]`` (of finishing from ``(t, u)``, its own transition included; -inf
    outside each utterance). Beta is the forward recursion on the reversed lattice, so both
    run as one lattice over twice the batch."""
    B = len(blank)
    wt = torch.cat((torch.full_like(blank[:, :1], NEG_INF), blank[:, :-1]), 1)
    wu = torch.cat((torch.full_like(label[:, :, :1], NEG_INF), label[:, :, :-1]), 2)
    both = walk(torch.cat((wt, _flip(blank, enc_lens, label_lens))),
                torch.cat((wu, _flip(label, enc_lens, label_lens))),
                torch.cat((blank.new_zeros(B), _last(blank, enc_lens, label_lens))))
    return both[:B], _flip(both[B:], enc_lens, label_lens)


class _TransducerNLL(torch.autograd.Function):
    """``(blank [B, T, U+1], label [B, T, U+1], enc_lens, label_lens, walk)`` -> ``nll [B]``:
    ``blank[t, u]`` is the log-probability of the blank at cell ``(t, u)``, ``label[t, u]``
    that of label ``u + 1`` (-inf for ``u >= label_lens``)."""

    @staticmethod
    def forward(ctx, blank: torch.Tensor, label: torch.Tensor, enc_lens: torch.Tensor,
                label_lens: torch.Tensor, walk) -> torch.Tensor:
        alpha, beta = _alpha_beta(blank, label, enc_lens, label_lens, walk)
        log_z = _last(alpha, enc_lens, label_lens) + _last(blank, enc_lens, label_lens)
        ctx.save_for_backward(blank, label, enc_lens, label_lens, alpha, beta, log_z)
        return -log_z

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        blank, label, enc_lens, label_lens, alpha, beta, log_z = ctx.saved_tensors
        B, T, U1 = blank.shape
        # beta one step on, with 0 just past each utterance's final blank
        after = torch.full((B, T + 1, U1 + 1), NEG_INF, dtype=beta.dtype, device=beta.device)
        after[:, :T, :U1] = beta
        after[torch.arange(B, device=beta.device), enc_lens, label_lens] = 0.0
        alpha = alpha.masked_fill(~_valid(enc_lens, label_lens, T, U1), NEG_INF)
        scale = -grad[:, None, None]
        base = alpha - log_z[:, None, None]
        grad_blank = scale * torch.exp(base + blank + after[:, 1:, :U1])
        grad_label = scale * torch.exp(base + label + after[:, :T, 1:])
        return grad_blank, grad_label, None, None, None


def reduce_losses(nll: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return nll.sum() / len(nll)
    if reduction == "sum":
        return nll.sum()
    if reduction == "none":
        return nll
    raise ValueError(f"reduction {reduction!r} is not one of {REDUCTIONS}")


def transducer_nll(blank: torch.Tensor, label: torch.Tensor, enc_lens: torch.Tensor,
                   label_lens: torch.Tensor, walk=lattice) -> torch.Tensor:
    """Per-utterance loss ``[B]`` from the lattice's log-probabilities ``blank`` and ``label``
    ``[B, T, U+1]`` (``label[b, t, u]`` = label ``u + 1``'s, -inf from ``label_lens[b]`` on),
    the recursion run by ``walk`` (:func:`lattice`'s contract)."""
    return _TransducerNLL.apply(blank, label, enc_lens.long(), label_lens.long(), walk)


def label_ids(labels: torch.Tensor, label_lens: torch.Tensor, b: torch.Tensor,
              u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, has_label)`` of the lattice cells ``(b, u)`` (broadcast): the id of utterance
    ``b``'s label ``u + 1`` where it has one (``u < label_lens[b]``), else 0."""
    has_label = u < label_lens[b]
    if labels.shape[1] == 0:   # a batch whose utterances have no labels
        return torch.zeros_like(has_label, dtype=torch.long), has_label
    ids = labels[b, u.clamp(max=labels.shape[1] - 1)]
    return torch.where(has_label, ids, 0).long(), has_label


def log_probs_at(logits: torch.Tensor, norm: torch.Tensor, ids: torch.Tensor,
                 has_label: torch.Tensor, blank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-softmax [N] at the blank's and at ``ids``' columns of logits [N, V] whose row
    log-sum-exp is ``norm`` [N] (its dtype); -inf where ``has_label`` is false."""
    blank_lp = logits[:, blank].to(norm.dtype) - norm
    label_lp = logits.gather(1, ids[:, None])[:, 0].to(norm.dtype) - norm
    return blank_lp, label_lp.masked_fill_(~has_label, NEG_INF)


def reference_log_probs(logits: torch.Tensor, ids: torch.Tensor, has_label: torch.Tensor,
                        blank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_probs``' contract: ``(logits [N, V], ids [N], has_label [N], blank)`` ->
    ``(blank_lp [N], label_lp [N])``, the log-softmax at the blank's and at ``ids``' columns
    (-inf where ``has_label`` is false), through an fp32 (or wider) copy of the logits."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return log_probs_at(logits, torch.logsumexp(logits, -1), ids, has_label, blank)


def transducer_loss(logits: torch.Tensor, enc_lens: torch.Tensor, labels: torch.Tensor,
                    label_lens: torch.Tensor, blank: int = -1, reduction: str = "mean",
                    log_probs=reference_log_probs, walk=lattice) -> torch.Tensor:
    """The loss of padded logits ``[B, T, U+1, V]`` (before log-softmax), labels ``[B, U]``
    (any ids past ``label_lens``), ``blank`` an index into ``V`` (-1: the last). ``reduction``
    ``mean`` (the reference's: sum over utterances / B), ``sum`` or ``none`` (``[B]``);
    ``log_probs`` (:func:`reference_log_probs`' contract) reads the grid's rows, ``walk``
    runs the recursion."""
    blank %= logits.shape[-1]
    B, T, U1, V = logits.shape
    b = torch.arange(B, device=logits.device)[:, None, None]
    u = torch.arange(U1, device=logits.device)
    ids, has_label = (x.expand(B, T, U1).reshape(-1)
                      for x in label_ids(labels[:, :U1 - 1], label_lens, b, u))
    blank_lp, label_lp = (x.view(B, T, U1) for x in log_probs(logits.reshape(-1, V), ids,
                                                              has_label, blank))
    return reduce_losses(transducer_nll(blank_lp, label_lp, enc_lens, label_lens, walk),
                         reduction)
