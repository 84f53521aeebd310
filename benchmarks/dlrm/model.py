"""The DLRM of the MLPerf reference (facebookresearch/dlrm as used by mlcommons/training v1.1).

Bottom MLP on the 13 dense features (13-512-256-128, ReLU after every layer), one embedding row
per categorical feature, the dot interaction (the bottom output concatenated with the strictly
lower triangle of the pairwise dot products of the 27 vectors: 128 + 351 = 479 features), top
MLP (479-1024-1024-512-256-1, ReLU between layers) giving a click logit: the reference's
sigmoid and BCE are ``binary_cross_entropy_with_logits``, computed stably. Initialisation is the
reference's: weights N(0, sqrt(2 / (fan_in + fan_out))), biases N(0, sqrt(1 / fan_out)),
embedding rows U(-sqrt(1 / n), sqrt(1 / n)) for a table of n rows.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.dlrm.data import NUM_DENSE


def parse_mlp(spec: str) -> list[int]:
    """``"13-512-256-128"`` -> ``[13, 512, 256, 128]``."""
    return [int(x) for x in spec.split("-")]


class MLP(nn.Sequential):
    """Linear layers with ReLUs."""

    def __init__(self, widths: list[int], last_relu: bool):
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
            lin = nn.Linear(n_in, n_out)
            with torch.no_grad():
                lin.weight.normal_(0.0, math.sqrt(2.0 / (n_in + n_out)))
                lin.bias.normal_(0.0, math.sqrt(1.0 / n_out))
            layers.append(lin)
            if last_relu or i < len(widths) - 2:
                layers.append(nn.ReLU())
        super().__init__(*layers)


def interaction_width(dim: int, num_sparse: int) -> int:
    n = num_sparse + 1
    return dim + n * (n - 1) // 2


def lower_dots(z: torch.Tensor, n: int) -> torch.Tensor:
    """The strictly lower triangle of the pairwise dot products of the first ``n`` vectors of
    ``z`` [B, m, d], row by row: [B, n(n-1)/2]."""
    m = z.shape[1]
    li, lj = torch.tril_indices(n, n, offset=-1, device=z.device)
    # index_select on the flattened products: its backward is an index_add, not the
    # sort-based accumulation that two-tensor advanced indexing needs
    return torch.bmm(z, z.transpose(1, 2)).flatten(1).index_select(1, li * m + lj)


def dot_interaction(bottom: torch.Tensor, emb: torch.Tensor, pair_dots=lower_dots
                    ) -> torch.Tensor:
    """``bottom`` [B, d], ``emb`` [B, T, d] -> [B, d + (T+1)T/2]; ``pair_dots``:
    :func:`lower_dots`' contract."""
    z = torch.cat([bottom.unsqueeze(1), emb], dim=1)
    return torch.cat([bottom, pair_dots(z, z.shape[1])], dim=1)


class DenseArch(nn.Module):
    """Everything but the embeddings: bottom MLP, interaction, top MLP."""

    pair_dots = staticmethod(lower_dots)   # the interaction's products (dot_interaction)

    def __init__(self, dim: int, num_sparse: int, bottom: list[int], top: list[int]):
        super().__init__()
        if bottom[0] != NUM_DENSE or bottom[-1] != dim:
            raise ValueError(f"bottom MLP {bottom} must map {NUM_DENSE} dense features to the "
                             f"embedding dimension {dim}")
        if top[-1] != 1:
            raise ValueError(f"top MLP {top} must end with one output")
        self.bottom_mlp = MLP(bottom, last_relu=True)
        self.top_mlp = MLP([interaction_width(dim, num_sparse)] + top, last_relu=False)

    def forward(self, bottom_out: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.top_mlp(dot_interaction(bottom_out, emb, self.pair_dots)).squeeze(1)


INIT_CHUNK_ROWS = 1 << 20


def table_chunks(table: int, size: int, dim: int, seed: int, device):
    """Yields ``(start, rows)`` covering table ``table`` with the reference's uniform init, each
    chunk from its own seed, so that any process can materialise any subset of rows (replicated
    or sharded) and get the same values."""
    bound = math.sqrt(1.0 / size)
    for start in range(0, size, INIT_CHUNK_ROWS):
        g = torch.Generator(device=device)
        g.manual_seed(seed * 1_000_003 + table * 10_007 + start)
        n = min(INIT_CHUNK_ROWS, size - start)
        yield start, torch.empty(n, dim, device=device).uniform_(-bound, bound, generator=g)


class PlainEmbeddings(nn.Module):
    """One ``nn.EmbeddingBag`` per table (sum of one id per bag), the reference's layout."""

    def __init__(self, sizes: list[int], dim: int, seed: int, device, sparse: bool = True):
        super().__init__()
        self.tables = nn.ModuleList()
        for t, n in enumerate(sizes):
            bag = nn.EmbeddingBag(n, dim, mode="sum", sparse=sparse, device=device)
            with torch.no_grad():
                for start, rows in table_chunks(t, n, dim, seed, device):
                    bag.weight[start:start + rows.shape[0]] = rows
            self.tables.append(bag)

    def forward(self, sparse: torch.Tensor) -> torch.Tensor:
        """``sparse`` [B, T] ids -> [B, T, d]."""
        offsets = torch.arange(sparse.shape[0], device=sparse.device)
        return torch.stack([bag(sparse[:, t].contiguous(), offsets)
                            for t, bag in enumerate(self.tables)], dim=1)


def mllog_tensor_names(bottom: list[int], top: list[int]) -> list[str]:
    """``weights_initialization`` tensor names, as closed_dlrm.yaml (1.1.0) spells them, of the
    MLP widths ``bottom`` and ``top`` (without its input width): nine for the reference's."""
    return (["embeddings"] + [f"bottom_mlp_dense{i}" for i in range(1, len(bottom))]
            + [f"top_mlp_dense{i}" for i in range(1, len(top) + 1)])
