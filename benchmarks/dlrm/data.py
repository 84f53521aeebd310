"""Criteo Terabyte in the binary format of the MLPerf reference's ``--mlperf-bin-loader``.

The reference (facebookresearch/dlrm ``data_utils.numpy_to_binary`` and
``data_loader_terabyte.CriteoBinDataset``, used by mlcommons/training v1.1)
stores each click as 40 little-endian int32 values, 160 bytes, with no header::

    label (0/1) | 13 dense counts (negatives already clipped to 0) | 26 category ids

A data directory holds ``terabyte_processed_train.bin`` (days 0-22),
``terabyte_processed_test.bin`` (the evaluation half of day 23) and
``day_fea_count.npz`` whose ``counts`` array gives the 26 table sizes. The
reader applies the reference's transforms: ``log(dense + 1)`` and category
ids modulo ``max_ind_range`` (``_transform_features``); table sizes are
``min(count, max_ind_range)`` (``dlrm_s_pytorch.py``'s ``ln_emb``). So an id
beyond a table capped at ``max_ind_range`` is folded into it, as in the
reference; an id still outside its table after that (which would make the
reference's embedding lookup fail) stops the read naming the record.
Files are memory-mapped and each global batch is one contiguous slice, so
reading is large sequential I/O and nothing is loaded whole.
(NVIDIA's v1.1 split format, one file per feature, is not implemented.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common.errors import UserError

NUM_DENSE = 13
NUM_SPARSE = 26
RECORD_INTS = 1 + NUM_DENSE + NUM_SPARSE
RECORD_BYTES = 4 * RECORD_INTS
TRAIN_FILE = "terabyte_processed_train.bin"
STANDIN_KIND = "criteo-standin"   # the marker of benchmarks.dlrm.standin's folders
EVAL_FILE = "terabyte_processed_test.bin"
COUNTS_FILE = "day_fea_count.npz"
# Criteo Terabyte's 26 table sizes under the reference's 40M cap (its day_fea_count.npz;
# HugeCTR's v1.1 slot_size_array): 187.8M rows.
CRITEO_TB_SIZES = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546,
                   403346, 10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984,
                   585935, 12972, 108, 36]
ZIPF_EXPONENT = 1.1           # category popularity of synthetic batches, as the fixture's
_SCATTER = 2_147_483_647      # a prime above any table size: rank -> rank * p mod n permutes ids


def cap_sizes(sizes: list[int], max_ind_range: int) -> list[int]:
    """Table sizes as the reference caps them: ``min(size, max_ind_range)`` (no cap when <= 0)."""
    return [min(s, max_ind_range) for s in sizes] if max_ind_range > 0 else list(sizes)


def table_sizes(data_dir: Path, max_ind_range: int) -> list[int]:
    """The 26 embedding table sizes the reference derives from ``day_fea_count.npz``."""
    path = Path(data_dir) / COUNTS_FILE
    if not path.is_file():
        raise UserError(f"{path} is missing: prepare the data with "
                        f"`python -m benchmarks.dlrm.prepare_data` (see benchmarks/dlrm/README.md)")
    try:
        counts = np.load(path)["counts"]
    except Exception as exc:  # a corrupt or foreign npz
        raise UserError(f"{path}: cannot read the 'counts' array ({exc})") from None
    if counts.shape != (NUM_SPARSE,):
        raise UserError(f"{path}: 'counts' has {counts.size} entries, expected {NUM_SPARSE} "
                        f"(one per categorical feature): the file belongs to another dataset")
    sizes = cap_sizes([int(c) for c in counts], max_ind_range)
    if min(sizes) < 1:
        raise UserError(f"{path}: a table has size {min(sizes)}; every feature needs >= 1 id")
    return sizes


@dataclass
class Batch:
    """One global batch as the reference transforms it (CPU tensors)."""

    dense: torch.Tensor    # [B, 13] float32, log(x + 1)
    sparse: torch.Tensor   # [B, 26] int32 category ids (mod max_ind_range); int64 on the device
    labels: torch.Tensor   # [B] float32 in {0, 1}


class BinaryClickLog:
    """A memory-mapped ``.bin`` file of 160-byte records, read as validated global batches."""

    def __init__(self, path: Path, sizes: list[int], max_ind_range: int):
        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"{self.path} is missing: prepare the data with "
                            f"`python -m benchmarks.dlrm.prepare_data`")
        nbytes = self.path.stat().st_size
        if nbytes % RECORD_BYTES:
            raise UserError(f"{self.path}: truncated binary file: {nbytes} bytes is not a whole "
                            f"number of {RECORD_BYTES}-byte records (record "
                            f"{nbytes // RECORD_BYTES} is partial); re-run prepare_data")
        self.num_records = nbytes // RECORD_BYTES
        if self.num_records == 0:
            raise UserError(f"{self.path} holds no records")
        self.records = np.memmap(self.path, dtype="<i4", mode="r",
                                 shape=(self.num_records, RECORD_INTS))
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self._limits = self.sizes.astype(np.uint32)   # ids viewed unsigned: one comparison
        self.max_ind_range = max_ind_range

    def read(self, start: int, stop: int) -> Batch:
        """Records ``[start, stop)`` (one contiguous read), checked and transformed. The ids
        stay int32 (the file's type; half the bytes to check and copy to the device, where
        they are widened)."""
        raw = np.array(self.records[start:stop])   # the one sequential read
        labels, dense, sparse = raw[:, 0], raw[:, 1:1 + NUM_DENSE], raw[:, 1 + NUM_DENSE:]
        ids = np.ascontiguousarray(sparse)
        if self.max_ind_range > 0:   # the modulo where it changes an id (negatives wrap high)
            fold = ids.view(np.uint32) >= self.max_ind_range
            if fold.any():
                np.remainder(ids, self.max_ind_range, out=ids, where=fold)
        self._check(start, labels, dense, sparse, ids)
        return Batch(dense=torch.from_numpy(np.log1p(dense.astype(np.float32))),
                     sparse=torch.from_numpy(ids),
                     labels=torch.from_numpy(labels.astype(np.float32)))

    def _check(self, start: int, labels, dense, sparse, ids) -> None:
        def fail(row: int, what: str):
            raise UserError(f"{self.path}: record {start + row}: {what}; the file is corrupt or "
                            f"not in the reference's 40 x int32 layout")

        bad = np.flatnonzero((labels != 0) & (labels != 1))
        if bad.size:
            fail(int(bad[0]), f"label {labels[bad[0]]} is not 0 or 1")
        negative = dense < 0
        if negative.any():
            fail(int(np.nonzero(negative)[0][0]), "negative dense feature")
        outside = ids.view(np.uint32) >= self._limits   # negatives wrap high
        if outside.any():
            rows, cols = np.nonzero(outside)
            r, c = int(rows[0]), int(cols[0])
            fail(r, f"category id {int(sparse[r, c])} of feature {c} is beyond its table "
                    f"size {int(self.sizes[c])} (from {COUNTS_FILE})")


class BatchSchedule:
    """Global batches of one file: contiguous record ranges in a per-epoch order.

    ``shuffle`` permutes the order of whole batches each epoch, like the
    reference's ``--mlperf-bin-shuffle``. ``drop_last`` drops the final partial
    batch (training keeps shapes fixed); evaluation keeps it.
    """

    def __init__(self, log: BinaryClickLog, batch_size: int, drop_last: bool):
        self.log, self.batch_size = log, batch_size
        n = log.num_records
        self.num_batches = n // batch_size if drop_last else -(-n // batch_size)
        self.num_samples = min(n, self.num_batches * batch_size)

    def ranges(self, epoch: int, seed: int, shuffle: bool) -> list[tuple[int, int]]:
        order = np.arange(self.num_batches)
        if shuffle:
            order = np.random.default_rng([seed, epoch]).permutation(self.num_batches)
        b, n = self.batch_size, self.log.num_records
        return [(int(i) * b, min((int(i) + 1) * b, n)) for i in order]


def split_bounds(batch: int, world: int) -> list[int]:
    """Sample offsets of each rank's slice of a global batch (near-equal, rank order)."""
    base, extra = divmod(batch, world)
    bounds = [0]
    for r in range(world):
        bounds.append(bounds[-1] + base + (r < extra))
    return bounds


def power_law_ids(n: int, sizes: list[int], generator: torch.Generator) -> torch.Tensor:
    """[n, T] category ids with power-law frequencies over each table (Zipf-like, exponent 1.1).

    Popularity ranks are drawn by inverting the continuous CDF of ``x ** -1.1``
    on ``[1, size + 1)`` (no per-table arrays, so 40M-row tables cost nothing)
    and scattered over the ids by a fixed permutation, as real ids are not
    sorted by popularity.
    """
    if max(sizes) >= _SCATTER:
        raise ValueError(f"tables of {max(sizes)} rows are beyond the id scatter's {_SCATTER}")
    e = 1.0 - ZIPF_EXPONENT
    ids = torch.empty(n, len(sizes), dtype=torch.int64)
    for t, size in enumerate(sizes):
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        x = (1.0 - u * (1.0 - (size + 1.0) ** e)) ** (1.0 / e)
        ids[:, t] = (x.long().clamp_(1, size) - 1) * _SCATTER % size
    return ids


def synthetic_batch(n: int, sizes: list[int], generator: torch.Generator) -> Batch:
    """A global batch for throughput runs (not Criteo): power-law ids, ``log(1 + count)`` of
    log-normal counts, random labels."""
    counts = torch.exp(torch.randn(n, NUM_DENSE, generator=generator) + 1.0).floor()
    return Batch(dense=torch.log1p(counts), sparse=power_law_ids(n, sizes, generator),
                 labels=torch.randint(0, 2, (n,), generator=generator).float())
