"""Exact ROC AUC (as ``sklearn.metrics.roc_auc_score``, which the reference calls).

Mann-Whitney form: the AUC is the probability that a random positive scores
above a random negative, ties counting one half. Ranks of tied scores are
averaged; sums are kept in int64 as doubled ranks, so the result is exact up
to the final division.
"""

from __future__ import annotations

import torch


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    scores, labels = scores.flatten(), labels.flatten().bool()
    pos = int(labels.sum())
    neg = labels.numel() - pos
    if pos == 0 or neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    order = torch.argsort(scores)
    _, inverse, counts = torch.unique_consecutive(scores[order], return_inverse=True,
                                                  return_counts=True)
    ends = torch.cumsum(counts, 0)
    twice_rank = (2 * ends - counts + 1)[inverse]        # 2 x average 1-based rank
    twice_sum = int(twice_rank[labels[order]].sum())
    return (twice_sum - pos * (pos + 1)) / (2 * pos * neg)
