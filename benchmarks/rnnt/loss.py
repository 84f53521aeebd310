"""The transducer (RNN-T) loss: the negative log-likelihood of the labels summed over all
alignments (Graves 2012), reduced as the MLPerf 1.1 reference reduces it.

The reference (``rnnt/loss.py``) calls warp-transducer's ``RNNTLoss(blank=vocab_size)`` with
its default reduction ``'mean'``: the sum of the per-utterance losses divided by the batch size
(the binding's docstring says "divided by the target lengths"; its code does not).

The reference path here is pure PyTorch, vectorised over the batch: only the blank's and the
next label's log-probabilities enter the lattice, so those two ``[B, T, U+1]`` grids are
gathered from the logits (through one log-sum-exp over the vocabulary) and the lattice runs on
them in log space, one anti-diagonal ``t + u`` per step (no cancellation, ``T + U`` steps, two
kernels each). Its backward pass uses the beta variables, the same recursion on each
utterance's reversed lattice, run with the forward one as a single lattice of twice the batch;
autograd keeps no per-step graph; ``lattice_impl="triton"`` runs that recursion as one GPU
kernel (:mod:`benchmarks.rnnt.lattice_triton`). It takes padded logits
``[B, T, U+1, V]`` or packed ones ``[N, V]`` (:func:`benchmarks.rnnt.model.packed_index`
order). ``impl="torchaudio"`` calls ``torchaudio.functional.rnnt_loss`` instead (padded only;
for the GPU, where torchaudio imports). ``impl="fused"`` (packed only) fuses the log-softmax
into the loss, as NVIDIA's MLPerf RNN-T does: the two log-probabilities per row come from a
row log-sum-exp taken in chunks of rows, and the backward pass writes the softmax gradient
chunk by chunk in the logits' dtype, so no fp32 ``[N, V]`` tensor is ever held.
``impl="compiled"`` (packed only) computes the same through ``torch.compile``: one reduction
and one elementwise kernel (:mod:`benchmarks.rnnt.compiled_loss`).
"""

from __future__ import annotations

import torch

from benchmarks.rnnt.model import packed_index

IMPLS = ("reference", "torchaudio")
LATTICES = ("torch", "triton")
PACKED_IMPLS = ("reference", "fused", "compiled")
CHUNK_ELEMENTS = 2**26   # fp32 elements per chunk of the fused path: 256 MiB, 64k rows of 1024
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


def _walker(impl: str):
    """The lattice recursion of ``impl``: :func:`lattice` (``torch``) or its one-kernel GPU
    counterpart (``triton``, :mod:`benchmarks.rnnt.lattice_triton`)."""
    if impl == "torch":
        return lattice
    if impl == "triton":
        from benchmarks.rnnt.lattice_triton import lattice as fused

        return fused
    raise ValueError(f"lattice {impl!r} is not one of {LATTICES}")


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


def _reduce(nll: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return nll.sum() / len(nll)
    if reduction == "sum":
        return nll.sum()
    if reduction == "none":
        return nll
    raise ValueError(f"reduction {reduction!r} is not one of {REDUCTIONS}")


def transducer_nll(blank: torch.Tensor, label: torch.Tensor, enc_lens: torch.Tensor,
                   label_lens: torch.Tensor, lattice_impl: str = "torch") -> torch.Tensor:
    """Per-utterance loss ``[B]`` from the lattice's log-probabilities ``blank`` and ``label``
    ``[B, T, U+1]`` (``label[b, t, u]`` = label ``u + 1``'s, -inf from ``label_lens[b]`` on),
    the recursion run by ``lattice_impl`` (one of ``LATTICES``)."""
    return _TransducerNLL.apply(blank, label, enc_lens.long(), label_lens.long(),
                                _walker(lattice_impl))


def _torchaudio_loss(logits: torch.Tensor, enc_lens: torch.Tensor, labels: torch.Tensor,
                     label_lens: torch.Tensor, blank: int) -> torch.Tensor:
    # imported here: torchaudio cannot load on the CPU machines
    import torchaudio.functional

    # torchaudio wants the grid exactly as large as the longest utterance, in fp32 or fp16
    T, U = int(enc_lens.max()), int(label_lens.max())
    logits = logits[:, :T, :U + 1]
    logits = logits.float() if logits.dtype == torch.bfloat16 else logits.contiguous()
    return torchaudio.functional.rnnt_loss(
        logits, labels[:, :U].int().contiguous(), enc_lens.int(), label_lens.int(),
        blank=blank, reduction="none")


def transducer_loss(logits: torch.Tensor, enc_lens: torch.Tensor, labels: torch.Tensor,
                    label_lens: torch.Tensor, blank: int = -1, reduction: str = "mean",
                    impl: str = "reference", lattice_impl: str = "torch") -> torch.Tensor:
    """The loss of padded logits ``[B, T, U+1, V]`` (before log-softmax), labels ``[B, U]``
    (any ids past ``label_lens``), ``blank`` an index into ``V`` (-1: the last). ``reduction``
    ``mean`` (the reference's: sum over utterances / B), ``sum`` or ``none`` (``[B]``);
    ``lattice_impl`` runs the recursion of every impl but torchaudio's."""
    blank %= logits.shape[-1]
    if impl == "torchaudio":
        return _reduce(_torchaudio_loss(logits, enc_lens, labels, label_lens, blank), reduction)
    if impl != "reference":
        raise ValueError(f"impl {impl!r} is not one of {IMPLS}")
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    B, T, U1, _ = logits.shape
    norm = torch.logsumexp(logits, -1)
    blank_lp = logits[..., blank] - norm
    ids = labels[:, None, :U1 - 1, None].long().expand(B, T, U1 - 1, 1)
    label_lp = logits[:, :, :U1 - 1].gather(-1, ids)[..., 0] - norm[:, :, :U1 - 1]
    label_lp = torch.cat((label_lp, torch.full_like(blank_lp[:, :, :1], NEG_INF)), 2)
    u = torch.arange(U1, device=logits.device)
    label_lp = label_lp.masked_fill(u >= label_lens[:, None, None], NEG_INF)
    return _reduce(transducer_nll(blank_lp, label_lp, enc_lens, label_lens, lattice_impl),
                   reduction)


def _chunk_norm(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row log-sum-exp of one chunk of logits as ``torch.logsumexp(x.to(dtype), -1)`` computes
    it, without that copy: the max taken in ``x``'s dtype, ``x`` cast inside the subtraction."""
    m = x.amax(-1, keepdim=True).to(dtype)
    m.masked_fill_(m.isinf(), 0.0)
    return (x - m).exp_().sum(-1).log_().add_(m[:, 0])


def log_probs_at(logits: torch.Tensor, norm: torch.Tensor, ids: torch.Tensor,
                 has_label: torch.Tensor, blank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-softmax [N] at the blank's and at ``ids``' columns of logits [N, V] whose row
    log-sum-exp is ``norm`` [N] (its dtype); -inf where ``has_label`` is false."""
    blank_lp = logits[:, blank].to(norm.dtype) - norm
    label_lp = logits.gather(1, ids[:, None])[:, 0].to(norm.dtype) - norm
    return blank_lp, label_lp.masked_fill_(~has_label, NEG_INF)


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


def packed_transducer_loss(logits: torch.Tensor, enc_lens: torch.Tensor, labels: torch.Tensor,
                           label_lens: torch.Tensor, blank: int = -1, reduction: str = "mean",
                           impl: str = "reference", chunk_rows: int | None = None,
                           longest: tuple[int, int] | None = None,
                           lattice_impl: str = "torch") -> torch.Tensor:
    """The same loss from packed logits ``[N, V]``, one row per valid ``(b, t, u)`` in
    :func:`benchmarks.rnnt.model.packed_index` order; no ``[B, T, U+1, V]`` tensor is made.
    ``impl="fused"`` takes ``chunk_rows`` rows at a time (default: ``CHUNK_ELEMENTS // V``).
    ``longest``, the largest ``enc_lens`` and ``label_lens`` when the caller has them on the
    host, spares reading them from the device. ``lattice_impl``: as :func:`transducer_loss`'s."""
    if impl not in PACKED_IMPLS:
        raise ValueError(f"impl {impl!r} is not one of {PACKED_IMPLS}")
    blank %= logits.shape[-1]
    b, t, u = packed_index(enc_lens, label_lens + 1, len(logits))
    has_label = u < label_lens[b]
    ids = torch.where(has_label, labels[b, u.clamp(max=labels.shape[1] - 1)], 0).long()
    if impl == "fused":
        chunk_rows = chunk_rows or max(1, CHUNK_ELEMENTS // logits.shape[-1])
        blank_row, label_row = _FusedLogProbs.apply(logits, ids, has_label, blank, chunk_rows)
    elif impl == "compiled":
        from benchmarks.rnnt.compiled_loss import CompiledLogProbs

        blank_row, label_row = CompiledLogProbs.apply(logits, ids, has_label, blank)
    else:
        logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        norm = torch.logsumexp(logits, -1)
        blank_row = logits[:, blank] - norm
        label_row = (logits.gather(1, ids[:, None])[:, 0] - norm).masked_fill(~has_label,
                                                                              NEG_INF)
    longest_t, longest_u = longest or (int(enc_lens.max()), int(label_lens.max()))
    shape = (len(enc_lens), longest_t, longest_u + 1)
    grid = torch.full(shape, NEG_INF, dtype=blank_row.dtype, device=logits.device)
    blank_lp = grid.index_put((b, t, u), blank_row)
    label_lp = grid.index_put((b, t, u), label_row)
    return _reduce(transducer_nll(blank_lp, label_lp, enc_lens, label_lens, lattice_impl),
                   reduction)
