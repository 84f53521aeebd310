"""Top-K of score rows with a fixed tie rule, in one pass or in NVIDIA's two stages (MLPerf
Training 1.1, NVIDIA ``benchmarks/maskrcnn/implementations/pytorch``:
``maskrcnn_benchmark/modeling/rpn/inference.py`` ``split_topk``, 4 chunks, and
``layers/nhwc/split_topk.py``).

NVIDIA selects the RPN's pre-NMS candidates of every image with ``split_topk``: each score row
is cut into chunks, the top K of each chunk are found, then the top K of those candidates.
That finds the same K elements as one ``torch.topk``; NVIDIA used it to speed up long rows on
its 2021 software, while on an H100 with torch 2.11 one pass measured faster (2026-11-24).

``torch.topk`` leaves the order of equal scores open, so both functions here rank by a
composite key: the score, then the lower index first. The key packs the score's
order-preserving 32-bit pattern above ``L - index`` into one int64, so every key is unique
and each stage's ``torch.topk`` has exactly one answer: the two-stage result equals the
one-pass result, ties included, and equals ``torch.topk`` wherever the scores are distinct.
Scores are float32, float16 or bfloat16 (compared as float32, which holds them exactly);
``-0.0`` ranks as ``0.0``; NaN is not supported. Optimisation ``topk-chunks=N``: the RPN's
pre-NMS top-K in two stages over N chunks.
"""

from __future__ import annotations

import functools

import torch

SPLIT_TOPK_CHUNKS = 4                   # NVIDIA's num_chunks for the RPN's pre-NMS top-K
_INDEX_BITS = 32
_INDEX_MASK = (1 << _INDEX_BITS) - 1
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _keys(scores: torch.Tensor) -> torch.Tensor:
    """Unique int64 keys [N, L] ordered as the scores [N, L], equal scores by lower index."""
    if scores.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"top-K scores must be float32, float16 or bfloat16, not {scores.dtype}")
    length = scores.shape[-1]
    if length > _INDEX_MASK:
        raise ValueError(f"top-K rows of {length} scores exceed {_INDEX_MASK}")
    bits = (scores.float() + 0.0).view(torch.int32)         # + 0.0 turns -0.0 into 0.0
    # IEEE floats order as sign-magnitude integers: flip the magnitude of negative ones
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
    rank = length - torch.arange(length, device=scores.device)     # 1..L, lower index higher
    return (ordered << _INDEX_BITS) | rank


def _from_keys(scores: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    indices = scores.shape[-1] - (keys & _INDEX_MASK)
    return scores.gather(-1, indices), indices


def _check(scores: torch.Tensor, k: int) -> None:
    if scores.dim() != 2:
        raise ValueError(f"top-K expects scores [N, L], got shape {tuple(scores.shape)}")
    if not 0 <= k <= scores.shape[1]:
        raise ValueError(f"top-K of {k} from rows of {scores.shape[1]}")


def ordered_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain path: values and indices [N, k] of the k largest of each row of ``scores``
    [N, L], largest first, equal scores by lower index first (one ``torch.topk``)."""
    _check(scores, k)
    return _from_keys(scores, _keys(scores).topk(k, dim=1).values)


def split_topk(scores: torch.Tensor, k: int,
               num_chunks: int = SPLIT_TOPK_CHUNKS) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ordered_topk` in two stages: each row is cut into ``num_chunks`` chunks of
    ``ceil(L / num_chunks)`` (the last one padded with keys below every score), the top
    ``min(k, chunk)`` of each chunk are taken, then the top ``k`` of those candidates. Every
    element of the overall top ``k`` is among its chunk's top ``k``, so the result is the
    same; ``k`` may exceed a chunk's length."""
    _check(scores, k)
    if num_chunks < 1:
        raise ValueError(f"split top-K needs at least one chunk, got {num_chunks}")
    rows, length = scores.shape
    chunk = -(-length // num_chunks) if length else 0
    keys = _keys(scores)
    padding = num_chunks * chunk - length
    if padding:
        keys = torch.cat((keys, keys.new_full((rows, padding), torch.iinfo(torch.int64).min)),
                         dim=1)
    candidates = keys.view(rows, num_chunks, chunk).topk(min(k, chunk), dim=2).values
    return _from_keys(scores, candidates.reshape(rows, -1).topk(k, dim=1).values)


def apply(wl, chunks: int) -> None:
    wl.detector.rpn.topk = functools.partial(split_topk, num_chunks=chunks)
