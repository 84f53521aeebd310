"""Criteo Terabyte at its real table sizes, for dry runs (``DRY_RUN``) of the DLRM configs:
the reference's binary format, not a learnable dataset and not Criteo.

    python -m benchmarks.dlrm.standin OUTDIR [--fraction 0.01] [--seed 0]

``terabyte_processed_{train,test}.bin`` with ``--fraction`` of Criteo Terabyte's
4,195,197,692 training and 89,137,319 evaluation clicks, and ``day_fea_count.npz`` with its
26 table sizes under the reference's 40M cap (187.8M rows). Category ids follow the power
law of the throughput tools' synthetic batches (``data.power_law_ids``: Zipf exponent 1.1,
scattered over each table), dense features are log-normal counts, and one click in 30 is
positive, at random: AUC stays near 0.5. At the default 1%, 6.7 GB of training records.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks.dlrm.data import (
    COUNTS_FILE,
    CRITEO_TB_SIZES,
    EVAL_FILE,
    NUM_DENSE,
    STANDIN_KIND,
    TRAIN_FILE,
    power_law_ids,
)
from benchmarks.dlrm.workload import CRITEO_EVAL_SAMPLES, CRITEO_TRAIN_SAMPLES
from common.fixture_cache import cached_fixture, fixture_command, standin_parser

CHUNK = 1_000_000
POSITIVE_RATE = 1 / 30


def _write_records(path: Path, n: int, generator: torch.Generator) -> None:
    with open(path, "wb") as f:
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            labels = (torch.rand(m, generator=generator) < POSITIVE_RATE).int()
            dense = torch.exp(torch.randn(m, NUM_DENSE, generator=generator) + 1.0).floor()
            ids = power_law_ids(m, CRITEO_TB_SIZES, generator)
            records = torch.cat([labels[:, None], dense.int(), ids.int()], dim=1)
            records.numpy().astype("<i4").tofile(f)


def write_standin(root, fraction: float = 0.01, seed: int = 0) -> Path:
    """Write the stand-in under ``root`` (reused when the same one is already there)."""
    train, eval = (max(1, round(n * fraction))
                   for n in (CRITEO_TRAIN_SAMPLES, CRITEO_EVAL_SAMPLES))
    params = dict(kind=STANDIN_KIND, train=train, eval=eval, seed=seed, version=1)

    def write(tmp: Path) -> None:
        generator = torch.Generator().manual_seed(seed)
        _write_records(tmp / TRAIN_FILE, train, generator)
        _write_records(tmp / EVAL_FILE, eval, generator)
        np.savez(tmp / COUNTS_FILE, counts=np.asarray(CRITEO_TB_SIZES, dtype=np.int64))
    return cached_fixture(root, params, write)


@fixture_command
def main(argv=None) -> int:
    p = standin_parser("python -m benchmarks.dlrm.standin",
                       "Write Criteo Terabyte at its real table sizes (not Criteo).",
                       0.01, "Criteo Terabyte's training and evaluation clicks", workers=False)
    write_standin(**vars(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
