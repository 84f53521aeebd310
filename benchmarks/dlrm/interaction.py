"""The interaction's pairwise products with a backward of one batched product
(``interaction-backward``), in place of :func:`benchmarks.dlrm.model.lower_dots`' autograd.

The products are ``D = Z Z^T`` of the [B, m, d] vectors, of which the lower triangle is kept.
Autograd differentiates ``bmm(Z, Z^T)`` through both factors: ``G Z`` and ``(Z^T G)^T``, two
batched products and the sum of two [B, m, d] results, where the first is written transposed
(in the config's profile on one H200 at 27,648 samples: Inductor's ``add_transpose`` kernel,
0.22 ms of a 2.6 ms step, beside the second product). As ``D`` is symmetric in ``Z``, the
gradient is ``(G + G^T) Z``; ``G`` is zero outside the kept lower triangle, so ``G + G^T`` is
the output's gradient written at each pair's two places: one [B, m, m] scatter and one product.
Every entry of ``G + G^T`` is one gradient value (the diagonal is not kept), so the product sums
the same terms as autograd's two, rounded once instead of twice.
"""

from __future__ import annotations

import torch

from benchmarks.dlrm.model import DenseArch


def _places(n: int, m: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat places of the kept pairs (i > j) among the first ``n`` of ``m`` vectors, and
    their mirrors (j, i)."""
    li, lj = torch.tril_indices(n, n, offset=-1, device=device)
    return li * m + lj, lj * m + li


class _LowerDots(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, lower, upper):
        ctx.save_for_backward(z, lower, upper)
        return torch.bmm(z, z.transpose(1, 2)).flatten(1).index_select(1, lower)

    @staticmethod
    def backward(ctx, grad):
        z, lower, upper = ctx.saved_tensors
        b, m, _ = z.shape
        grad = grad.to(z.dtype)
        both = grad.new_zeros(b, m * m).index_copy_(1, lower, grad).index_copy_(1, upper, grad)
        return torch.bmm(both.view(b, m, m), z), None, None


def lower_dots(z: torch.Tensor, n: int) -> torch.Tensor:
    """:func:`benchmarks.dlrm.model.lower_dots` with the one-product backward. Under autocast
    the vectors are cast as ``torch.bmm`` would cast them, and so is their gradient back."""
    device = z.device.type
    if torch.is_autocast_enabled(device):
        z = z.to(torch.get_autocast_dtype(device))
    with torch.autocast(device, enabled=False):
        return _LowerDots.apply(z, *_places(n, z.shape[1], z.device))


def apply(dense: DenseArch) -> None:
    """``dense``'s interaction (plain or ``aligned-dense``) with the one-product backward."""
    dense.pair_dots = lower_dots
