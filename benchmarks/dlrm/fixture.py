"""Tiny click logs in the reference's binary format, drawn from a planted model (not Criteo).

    python -m benchmarks.dlrm.fixture OUTDIR [--train N] [--eval N] [--seed S] [--max-table N]

Each of the 26 features draws its ids from a power law (Zipf exponent 1.1 over
a random permutation of the table, as real category frequencies are skewed);
the 13 dense features are log-normal counts. A click has probability
``sigmoid(logit)`` where the planted logit sums a per-id effect of every
feature, dot products of per-id vectors of a few feature pairs (what DLRM's
dot interaction models) and a linear term in ``log(1 + dense)``. The files
are ``terabyte_processed_{train,test}.bin`` and ``day_fea_count.npz``, as
``benchmarks.dlrm.data`` reads them. ``FIXTURE_COMPLETE`` records the
parameters and the planted model's own AUC on the evaluation set (the best
any model can expect); a folder holding the same fixture is reused (``common.fixture_cache``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.dlrm.auc import roc_auc
from benchmarks.dlrm.data import (
    COUNTS_FILE,
    CRITEO_TB_SIZES,
    EVAL_FILE,
    NUM_DENSE,
    NUM_SPARSE,
    TRAIN_FILE,
    ZIPF_EXPONENT,
)
from common.fixture_cache import MARKER, cached_fixture, fixture_command

PAIRS = [(0, 9), (2, 19), (3, 21), (10, 22)]   # feature pairs with a planted interaction
LATENT = 4


def fixture_sizes(max_table: int) -> list[int]:
    """The reference's table sizes, scaled down by the fixture's ``--max-table`` cap."""
    return [min(n, max_table) for n in CRITEO_TB_SIZES]


class PlantedModel:
    def __init__(self, sizes: list[int], rng: np.random.Generator):
        self.sizes = sizes
        self.perm = [rng.permutation(n) for n in sizes]
        zipf = [np.arange(1, n + 1, dtype=np.float64) ** -ZIPF_EXPONENT for n in sizes]
        self.cdf = [np.cumsum(z) / z.sum() for z in zipf]
        self.effect = [rng.normal(0, 0.4, n) for n in sizes]
        self.vec = [rng.normal(0, 0.6, (n, LATENT)) for n in sizes]
        self.dense_mu = rng.uniform(0.5, 3.0, NUM_DENSE)
        self.dense_w = rng.normal(0, 0.8, NUM_DENSE)
        self.bias = -1.0

    def sample(self, n: int, rng: np.random.Generator):
        ids = np.empty((n, NUM_SPARSE), dtype=np.int64)
        for t in range(NUM_SPARSE):
            rank = np.minimum(np.searchsorted(self.cdf[t], rng.random(n)), self.sizes[t] - 1)
            ids[:, t] = self.perm[t][rank]
        dense = np.floor(np.exp(rng.normal(self.dense_mu, 1.0, (n, NUM_DENSE)))).astype(np.int64)
        logit = self.bias + (np.log1p(dense) - self.dense_mu) @ self.dense_w
        logit += sum(self.effect[t][ids[:, t]] for t in range(NUM_SPARSE))
        for a, b in PAIRS:
            logit += (self.vec[a][ids[:, a]] * self.vec[b][ids[:, b]]).sum(1)
        prob = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(n) < prob).astype(np.int64)
        return labels, dense, ids, prob


def _records(labels, dense, ids) -> np.ndarray:
    return np.concatenate([labels[:, None], dense, ids], axis=1).astype("<i4")


def write_fixture(root, train: int = 400_000, eval: int = 40_000, seed: int = 0,
                  max_table: int = 5000) -> Path:
    """Write the fixture under ``root`` (reused when the same one is already there)."""
    params = dict(train=train, eval=eval, seed=seed, max_table=max_table, version=1)

    def write(tmp: Path) -> dict:
        import torch

        rng = np.random.default_rng(seed)
        sizes = fixture_sizes(max_table)
        model = PlantedModel(sizes, rng)
        with open(tmp / TRAIN_FILE, "wb") as f:
            for start in range(0, train, 100_000):
                labels, dense, ids, _ = model.sample(min(100_000, train - start), rng)
                _records(labels, dense, ids).tofile(f)
        labels, dense, ids, prob = model.sample(eval, rng)
        _records(labels, dense, ids).tofile(tmp / EVAL_FILE)
        np.savez(tmp / COUNTS_FILE, counts=np.asarray(sizes, dtype=np.int64))
        oracle = roc_auc(torch.from_numpy(prob), torch.from_numpy(labels))
        return {"oracle_auc": round(oracle, 4)}
    return cached_fixture(root, params, write)


@fixture_command
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path)
    p.add_argument("--train", type=int, default=400_000, help="training clicks")
    p.add_argument("--eval", type=int, default=40_000, help="evaluation clicks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-table", type=int, default=5000, help="cap on each table's size")
    a = p.parse_args(argv)
    root = write_fixture(a.outdir, a.train, a.eval, a.seed, a.max_table)
    print(f"dlrm fixture at {root}: {json.loads((root / MARKER).read_text())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
