"""Criteo Terabyte ``day_0`` ... ``day_23`` TSV files -> the reference's binary format.

    python -m benchmarks.dlrm.prepare_data RAW_DIR OUT_DIR [--days 24] [--max-ind-range 40000000]

Each raw line is ``label<TAB>13 integer counts<TAB>26 hexadecimal category
hashes`` (empty fields allowed). As in the reference's preprocessing
(facebookresearch/dlrm ``data_utils``): empty fields become 0, negative
counts are clipped to 0, each hash is parsed as hex and taken modulo
``max_ind_range``, and every feature's distinct values are renumbered 0..n-1
(here in ascending order of value); ``n`` per feature goes to
``day_fea_count.npz``. Days 0..days-2 become ``terabyte_processed_train.bin``;
the first half of the last day becomes ``terabyte_processed_test.bin`` (the
evaluation set). Two passes over the text, chunked: nothing is held whole but
the per-feature value dictionaries.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from benchmarks.dlrm.data import (
    COUNTS_FILE,
    EVAL_FILE,
    NUM_DENSE,
    NUM_SPARSE,
    RECORD_INTS,
    TRAIN_FILE,
)
from common.cli import OneLineParser, one_line_errors
from common.errors import UserError

CHUNK_LINES = 1 << 20


def parse_lines(lines: list[str], path: Path, first_line: int, max_ind_range: int):
    """(labels, dense, hashed categories) of TSV lines; a bad line is a UserError."""
    n = len(lines)
    labels = np.empty(n, np.int64)
    dense = np.empty((n, NUM_DENSE), np.int64)
    cats = np.empty((n, NUM_SPARSE), np.int64)
    for i, line in enumerate(lines):
        f = line.rstrip("\n").split("\t")
        if len(f) != RECORD_INTS:
            raise UserError(f"{path}: line {first_line + i + 1} has {len(f)} fields, expected "
                            f"{RECORD_INTS} (label, {NUM_DENSE} counts, {NUM_SPARSE} categories)")
        try:
            labels[i] = int(f[0])
            dense[i] = [int(x) if x else 0 for x in f[1:1 + NUM_DENSE]]
            cats[i] = [int(x, 16) % max_ind_range if x else 0 for x in f[1 + NUM_DENSE:]]
        except ValueError as exc:
            raise UserError(f"{path}: line {first_line + i + 1}: {exc}") from None
    return labels, np.maximum(dense, 0), cats


def chunks(path: Path, max_ind_range: int, limit: int | None = None):
    """Parsed chunks of a day file, up to ``limit`` lines."""
    with open(path) as f:
        done = 0
        while limit is None or done < limit:
            want = CHUNK_LINES if limit is None else min(CHUNK_LINES, limit - done)
            lines = [line for _, line in zip(range(want), f)]
            if not lines:
                return
            yield parse_lines(lines, path, done, max_ind_range)
            done += len(lines)


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))


def prepare(raw: Path, out: Path, days: int, max_ind_range: int) -> None:
    files = [raw / f"day_{d}" for d in range(days)]
    for p in files:
        if not p.is_file():
            raise UserError(f"{p} is missing: download the Criteo Terabyte day files")
    eval_lines = count_lines(files[-1]) // 2 + count_lines(files[-1]) % 2
    plan = [(p, None) for p in files[:-1]] + [(files[-1], eval_lines)]
    values = [np.zeros(0, np.int64) for _ in range(NUM_SPARSE)]
    for p, limit in plan:                                   # pass 1: distinct values
        for _, _, cats in chunks(p, max_ind_range, limit):
            for t in range(NUM_SPARSE):
                values[t] = np.union1d(values[t], cats[:, t])
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / COUNTS_FILE, counts=np.array([v.size for v in values], np.int64))
    with open(out / TRAIN_FILE, "wb") as train, open(out / EVAL_FILE, "wb") as test:
        for p, limit in plan:                               # pass 2: renumber and write
            dst = test if limit is not None else train
            for labels, dense, cats in chunks(p, max_ind_range, limit):
                ids = np.stack([np.searchsorted(values[t], cats[:, t])
                                for t in range(NUM_SPARSE)], 1)
                np.concatenate([labels[:, None], dense, ids], 1).astype("<i4").tofile(dst)
            print(f"{p}: written", flush=True)


@one_line_errors
def main(argv=None) -> int:
    p = OneLineParser(prog="python -m benchmarks.dlrm.prepare_data",
                      description=__doc__.splitlines()[0])
    p.add_argument("raw_dir", type=Path, help="folder with day_0 ... day_23")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--days", type=int, default=24, help="day files; the last one is evaluation")
    p.add_argument("--max-ind-range", type=int, default=40_000_000)
    a = p.parse_args(argv)
    if a.days < 2:
        p.error("--days must be at least 2 (training days plus the evaluation day)")
    prepare(a.raw_dir, a.out_dir, a.days, a.max_ind_range)
    return 0


if __name__ == "__main__":
    sys.exit(main())
