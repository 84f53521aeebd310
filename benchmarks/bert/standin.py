"""BERT's pre-training shards at their real shapes, for dry runs (``DRY_RUN``) of the BERT
configs: the reference's HDF5 format and BERT-large, not a learnable dataset and not Wikipedia.

    python -m benchmarks.bert.standin OUTDIR [--shards 64] [--shard-size 4096] [--fill 0.6]

``training/`` holds ``--shards`` shards of ``--shard-size`` sequences of 512 tokens (the
reference chops its 500 files into 2048 shards; the schedule counts samples, so a dry run
needs only enough of them to stream its steps), ``eval/`` the reference's 10,000 evaluation
sequences, with ``bert_config.json`` (BERT-large, uncased vocabulary) and ``phase1.pt``, random
weights in the reference checkpoint's layout for ``INIT_CHECKPOINT``. Lengths: a full 512 for
a share of the sequences, the rest uniform over 16-511 tokens, the share set so that the mean
fill is ``--fill`` (0.6: the throughput tools' figure for the reference data; Krell et al.
2021 put padding above half of the reference's Wikipedia data at 512, so try 0.5 too); 15% of each
sequence's tokens masked, at most 76, as the reference's ``create_pretraining_data`` does;
random token ids; next-sentence labels at random.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import h5py
import numpy as np
import torch

from benchmarks.bert.data import KEYS
from benchmarks.bert.model import BertConfig, BertForPreTraining
from benchmarks.bert.workload import EVAL_SAMPLES
from common.cli import OneLineParser
from common.fixture_cache import FRACTION, cached_fixture, fixture_command, in_processes
from common.hparams import checked, positive

KIND = "bert-standin"
BERT_LARGE = BertConfig()
SEQ, MAX_PRED, MASKED = 512, 76, 0.15
SHORT = (16, SEQ - 1)
CLS, SEP, FIRST_WORD = 101, 102, 999   # the uncased vocabulary's [CLS], [SEP], first word


def lengths(n: int, fill: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` sequence lengths whose mean is ``fill`` x 512: full ones and uniform short ones
    (below a fill of about 0.52, only short ones, over a narrower range)."""
    short_mean = sum(SHORT) / 2 / SEQ
    full = max(0.0, (fill - short_mean) / (1 - short_mean))
    top = SHORT[1] if full else max(SHORT[0], round(2 * fill * SEQ) - SHORT[0])
    return np.where(rng.random(n) < full, SEQ, rng.integers(SHORT[0], top + 1, n))


def _write_shard(job) -> None:
    path, n, fill, vocab_size, seed = job
    rng = np.random.default_rng(seed)
    real = lengths(n, fill, rng)
    cols = np.arange(SEQ)
    mask = (cols < real[:, None]).astype(np.int8)
    ids = rng.integers(FIRST_WORD, vocab_size, (n, SEQ), dtype=np.int32) * mask
    split = real // 2
    ids[:, 0], ids[np.arange(n), split], ids[np.arange(n), real - 1] = CLS, SEP, SEP
    segments = ((cols > split[:, None]) & mask.astype(bool)).astype(np.int8)
    positions, labels = np.zeros((n, MAX_PRED), np.int32), np.zeros((n, MAX_PRED), np.int32)
    for r, length in enumerate(real):
        k = min(MAX_PRED, max(1, round(length * MASKED)))
        chosen = np.sort(rng.choice(np.arange(1, length - 1), k, replace=False))
        positions[r, :k], labels[r, :k] = chosen, ids[r, chosen]
    nsp = rng.integers(0, 2, n, dtype=np.int8)
    with h5py.File(path, "w") as f:
        for key, a in zip(KEYS, (ids, mask, segments, positions, labels, nsp)):
            f.create_dataset(key, data=a)


def write_standin(root, shards: int = 64, shard_size: int = 4096, fill: float = 0.6,
                  workers: int = 1, seed: int = 0, config: BertConfig = BERT_LARGE) -> Path:
    """Write the stand-in under ``root`` (reused when the same one is already there);
    ``config``: the network of ``bert_config.json`` and ``phase1.pt`` (BERT-large)."""
    params = dict(kind=KIND, shards=shards, shard_size=shard_size, fill=fill, seed=seed,
                  config=dataclasses.asdict(config), version=1)

    def write(tmp: Path) -> None:
        (tmp / "bert_config.json").write_text(json.dumps(
            {**dataclasses.asdict(config), "hidden_act": "gelu"}, indent=2) + "\n")
        torch.manual_seed(seed)
        torch.save({"model": BertForPreTraining(config).state_dict()}, tmp / "phase1.pt")
        vocab = config.vocab_size
        jobs = [(str(tmp / "eval" / "eval_00000.hdf5"), EVAL_SAMPLES, fill, vocab, [seed, 0])]
        jobs += [(str(tmp / "training" / f"part_{i:05d}_of_{shards:05d}.hdf5"), shard_size,
                  fill, vocab, [seed, i + 1]) for i in range(shards)]
        for split in ("training", "eval"):
            (tmp / split).mkdir()
        in_processes(_write_shard, jobs, workers, 1)
    return cached_fixture(root, params, write)


@fixture_command
def main(argv=None) -> int:
    p = OneLineParser(prog="python -m benchmarks.bert.standin",
                      description="Write BERT's pre-training shards at their real shapes "
                                  "(not Wikipedia).")
    p.add_argument("root", type=Path, metavar="OUTDIR")
    count = checked(int, positive)
    p.add_argument("--shards", type=count, default=64, help="training shards")
    p.add_argument("--shard-size", type=count, default=4096, help="sequences a shard")
    p.add_argument("--fill", type=FRACTION, default=0.6, help="mean share of real tokens")
    p.add_argument("--workers", type=count, default=os.cpu_count(), help="writer processes")
    p.add_argument("--seed", type=int, default=0)
    write_standin(**vars(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
