"""Plain SGD (the reference's optimiser) for the DLRM, with low-precision weight copies.

Embedding lookups read a bf16/fp16 copy of the tables; the fp32 masters are
updated and the copy refreshed in the same call, touching only the rows the
step used (``sparse_sgd_``), so a step never re-casts a whole table. Dense
parameters (the MLPs) take one multi-tensor update. The learning rate is a
device tensor: no value is read back to the host.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def sparse_sgd_(master: torch.Tensor, copy: torch.Tensor | None, rows: torch.Tensor,
                grads: torch.Tensor, lr: torch.Tensor) -> None:
    """``master[rows] -= lr * grads`` (repeats accumulate), then ``copy[rows] = master[rows]``."""
    master.index_add_(0, rows, grads * -lr)
    if copy is not None:
        copy[rows] = master[rows].to(copy.dtype)


@torch.no_grad()
def dense_sgd_(params: list[torch.Tensor], grads: list[torch.Tensor], lr: torch.Tensor) -> None:
    torch._foreach_add_(params, torch._foreach_mul(grads, -lr))


@torch.no_grad()
def table_sgd_(master: torch.Tensor, copy: torch.Tensor | None, grad: torch.Tensor,
               lr: torch.Tensor) -> None:
    """Dense update of a whole (frequent) table and its low-precision copy."""
    master.add_(grad * -lr)
    if copy is not None:
        copy.copy_(master)
