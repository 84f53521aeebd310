"""Plain SGD (the reference's optimiser) for the DLRM as fused updates (``fused-sgd``).

The MLPs take one multi-tensor update, embedding rows an ``index_add`` where the step touched
them. Hybrid lookups may read a bf16 copy (``HybridEmbedding.keep_low_precision``): the fp32
masters and the copy's rows are updated in the same call, so a step never re-casts a whole
table. The learning rate is a device tensor: nothing is read back to the host.
"""

from __future__ import annotations

import torch

from common import dist


@torch.no_grad()
def sparse_sgd_(master: torch.Tensor, copy: torch.Tensor | None, rows: torch.Tensor,
                grads: torch.Tensor, lr: torch.Tensor) -> None:
    """``master[rows] -= lr * grads`` (repeats accumulate), then ``copy[rows] = master[rows]``;
    ``grads`` ([n, d] or [B, T, d]) in any float dtype, added in fp32."""
    master.index_add_(0, rows, grads.reshape(-1, grads.shape[-1]).float() * -lr)
    if copy is not None:
        copy[rows] = master[rows].to(copy.dtype)


@torch.no_grad()
def dense_sgd_(params: list[torch.Tensor], grads: list[torch.Tensor], lr: torch.Tensor) -> None:
    torch._foreach_add_(params, torch._foreach_mul(grads, -lr))


@torch.no_grad()
def table_sgd_(master: torch.Tensor, copy: torch.Tensor | None, grad: torch.Tensor,
               lr: torch.Tensor) -> None:
    """Dense update of a whole (frequent) table and its low-precision copy; ``grad`` fp32 or
    bf16 (``bf16-frequent-grads``), added in fp32 by one kernel."""
    master.addcmul_(grad, -lr)
    if copy is not None:
        copy.copy_(master)


def bags_update(params: list[torch.Tensor], bags: list[torch.Tensor], lr: torch.Tensor,
                sparse=sparse_sgd_) -> None:
    """One step of the MLPs ``params`` and the ``nn.EmbeddingBag`` weights ``bags`` (their
    sparse gradients: one row a lookup), the rows by ``sparse`` (``sparse_sgd_``'s contract)."""
    dense_sgd_(params, [p.grad for p in params], lr)
    for w in bags:
        sparse(w, None, w.grad._indices()[0], w.grad._values(), lr)
    for p in params + bags:
        p.grad = None


def hybrid_update(params: list[torch.Tensor], emb, lr: torch.Tensor, distributed: bool,
                  sparse=sparse_sgd_, frequent_dtype: torch.dtype = torch.float32,
                  table=table_sgd_) -> None:
    """One step of the MLPs ``params`` and the ``HybridEmbedding`` ``emb``, its rare rows by
    ``sparse`` (``sparse_sgd_``'s contract), its frequent table by ``table`` (``table_sgd_``'s).
    On several ranks the MLPs' gradients are summed by one coalesced all-reduce while the frequent
    table's gradient is computed, and that one, as ``frequent_dtype``, by a second while the
    rare rows and then the MLPs update."""
    grads = [p.grad for p in params]
    if distributed:
        mlp_work = dist.all_reduce_sum_coalesced_async(grads)
    freq = emb.frequent_grad()
    if distributed:
        freq = freq.to(frequent_dtype)
        freq_work = dist.all_reduce_sum_async(freq)
    rows, rare = emb.rare_grad()   # in flight while this rank's rare rows update
    sparse(emb.rare_weight, emb.rare_lp, rows, rare, lr)
    if distributed:
        mlp_work.wait()
    dense_sgd_(params, grads, lr)
    if distributed:
        freq_work.wait()
    table(emb.freq_weight, emb.freq_lp, freq, lr)
    for p in params:
        p.grad = None
