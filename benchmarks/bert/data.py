"""The MLPerf BERT packed HDF5 format: a sharded reader that streams one shard at a time.

Each ``*.hdf5`` shard holds, for N sequences of length S with up to P masked
positions (the reference: S=512, P=76):

    input_ids [N, S]  input_mask [N, S]  segment_ids [N, S]
    masked_lm_positions [N, P]  masked_lm_ids [N, P]  next_sentence_labels [N]

Masked positions are padded with 0 (position 0 is always ``[CLS]``, never masked). Keys and
shapes are checked up front from the HDF5 headers (fast on multi-GB shards), the values shard
by shard as they are loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from common.errors import UserError

SEQ_KEYS = ("input_ids", "input_mask", "segment_ids")
PRED_KEYS = ("masked_lm_positions", "masked_lm_ids")
LABEL_KEY = "next_sentence_labels"
KEYS = SEQ_KEYS + PRED_KEYS + (LABEL_KEY,)
# The order of the tensors in a batch (the model's and train_step's argument order).
BATCH_KEYS = ("input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
              LABEL_KEY)


@dataclass(frozen=True)
class Shards:
    files: tuple[Path, ...]
    sizes: tuple[int, ...]
    seq_len: int
    max_pred: int

    @property
    def samples(self) -> int:
        return sum(self.sizes)

    @classmethod
    def scan(cls, folder: Path, seq_len: int, max_pred: int) -> Shards:
        """Every ``*.hdf5`` in ``folder``, checked against the expected lengths."""
        folder = Path(folder)
        if not folder.is_dir():
            raise UserError(f"{folder}: no such folder of BERT HDF5 shards "
                            "(run benchmarks.bert.prepare_data, see benchmarks/bert/README.md)")
        files = tuple(sorted(folder.glob("*.hdf5")))
        if not files:
            raise UserError(f"{folder}: no *.hdf5 shards (empty shard list); "
                            "run benchmarks.bert.prepare_data to write them")
        sizes = tuple(_check_shard(f, seq_len, max_pred) for f in files)
        if not sum(sizes):
            # The training stream would loop forever without a batch, evaluation would score 0.
            raise UserError(f"{folder}: its {len(files)} *.hdf5 shard(s) hold 0 sequences; "
                            "re-create them with benchmarks.bert.prepare_data or point "
                            "--train-dir/--eval-dir at the right folder")
        return cls(files, sizes, seq_len, max_pred)


def _check_shard(path: Path, seq_len: int, max_pred: int) -> int:
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in KEYS if k not in f]
            if missing:
                raise UserError(f"{path}: missing HDF5 key(s) {', '.join(missing)}; a BERT shard "
                                f"needs {', '.join(KEYS)}")
            n = f[LABEL_KEY].shape[0]
            want = {**{k: (n, seq_len) for k in SEQ_KEYS}, **{k: (n, max_pred) for k in PRED_KEYS},
                    LABEL_KEY: (n,)}
            for k, shape in want.items():
                if f[k].shape != shape:
                    hint = (" (sequence length differs from --max-seq-length/bert config)"
                            if k in SEQ_KEYS else
                            " (differs from --max-predictions)" if k in PRED_KEYS else "")
                    raise UserError(f"{path}: {k} has shape {f[k].shape}, expected {shape}{hint}")
            return n
    except OSError as exc:
        raise UserError(f"{path}: not a readable HDF5 file ({exc})") from exc


def read_shard(path: Path, vocab_size: int) -> dict[str, np.ndarray]:
    """All arrays of one shard as int64, their values checked."""
    with h5py.File(path, "r") as f:
        arrays = {k: f[k][...].astype(np.int64) for k in KEYS}
    _check_values(path, arrays, vocab_size)
    return arrays


def _check_values(path: Path, arrays: dict[str, np.ndarray], vocab_size: int) -> None:
    """Refuse values that would fail deep inside the model (an index error naming no file, on
    the GPU a device-side assert) or be silently ignored (NSP label -100); a few vectorised
    passes over the shard just read, so the cost is paid once per shard, never per batch."""
    seq_len = arrays["input_ids"].shape[1]
    redo = "re-create the shard with benchmarks.bert.prepare_data"
    vocab = (f"outside the vocabulary of {vocab_size}: prepare the data with the vocab.txt "
             "of the bert config")
    for key, end, what in (("input_ids", vocab_size, vocab),
                           ("masked_lm_ids", vocab_size, vocab),
                           ("masked_lm_positions", seq_len,
                            f"outside the sequence length {seq_len}; {redo}"),
                           (LABEL_KEY, 2, f"not 0 (IsNext) or 1 (NotNext); {redo}")):
        a = arrays[key]
        if a.size and (a.min() < 0 or a.max() >= end):
            first = np.flatnonzero((a < 0) | (a >= end))[0]
            row = np.unravel_index(first, a.shape)[0]
            raise UserError(f"{path}: sequence {row}: {key} {a.flat[first]} is {what}")


def _to_device(arrays: dict[str, np.ndarray], rows, device,
               extra=lambda mask: ()) -> tuple[torch.Tensor, ...]:
    """The batch's tensors on ``device``, then ``extra(host input_mask)``'s arrays."""
    host = [arrays[k][rows] for k in BATCH_KEYS]
    host += extra(arrays["input_mask"][rows])
    return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device, non_blocking=True)
                 for a in host)


def train_stream(shards: Shards, vocab_size: int, global_batch: int, rank: int, world: int,
                 seed: int, device, extra=lambda mask: ()) -> Iterator[tuple[torch.Tensor, ...]]:
    """Endless global batches (shards and rows reshuffled every pass), one shard in memory at a
    time, a shard's left-over rows starting the next batch; yields this rank's slice, with
    ``extra(host input_mask)`` appended (unpad's packing)."""
    local = global_batch // world
    rng = np.random.default_rng(seed)
    carry = None
    while True:
        for i in rng.permutation(len(shards.files)):
            arrays = read_shard(shards.files[i], vocab_size)
            order = rng.permutation(len(arrays[LABEL_KEY]))
            arrays = {k: v[order] for k, v in arrays.items()}
            if carry is not None:
                arrays = {k: np.concatenate([carry[k], v]) for k, v in arrays.items()}
            n = len(arrays[LABEL_KEY])
            full = n // global_batch * global_batch
            for start in range(0, full, global_batch):
                lo = start + rank * local
                yield _to_device(arrays, slice(lo, lo + local), device, extra)
            carry = {k: v[full:] for k, v in arrays.items()}


def eval_batches(shards: Shards, vocab_size: int, batch: int, rank: int, world: int,
                 device, limit: int | None = None) -> Iterator[tuple[torch.Tensor, ...]]:
    """This rank's share (every world-th row) of the first ``limit`` evaluation samples."""
    seen = 0
    for path in shards.files:
        arrays = read_shard(path, vocab_size)
        n = len(arrays[LABEL_KEY])
        if limit is not None:
            n = min(n, limit - seen)
        rows = np.arange(seen, seen + n)
        mine = np.nonzero(rows % world == rank)[0]
        for start in range(0, len(mine), batch):
            yield _to_device(arrays, mine[start:start + batch], device)
        seen += n
        if limit is not None and seen >= limit:
            return


def synthetic_length(seq_len: int, max_pred: int, fill: float) -> int:
    """Real tokens per sequence of a synthetic batch with ``fill`` (room for the predictions)."""
    return min(seq_len, max(max_pred + 1, round(fill * seq_len)))


def synthetic_batch(batch: int, seq_len: int, max_pred: int, vocab_size: int, fill: float,
                    device) -> tuple[torch.Tensor, ...]:
    """A device-resident random batch for throughput runs (never for training): every sequence
    has ``synthetic_length`` real tokens, then padding, ``max_pred`` of them masked."""
    g = torch.Generator().manual_seed(0)
    real = synthetic_length(seq_len, max_pred, fill)
    max_pred = min(max_pred, real - 1)
    ids = torch.randint(5, vocab_size, (batch, seq_len), generator=g)
    mask = (torch.arange(seq_len) < real).long().expand(batch, -1).contiguous()
    ids = ids * mask
    segments = ((torch.arange(seq_len) >= real // 2) & mask.bool()).long()
    positions = torch.stack([torch.randperm(real - 1, generator=g)[:max_pred].sort().values + 1
                             for _ in range(batch)])
    labels = ids.gather(1, positions)
    nsp = torch.randint(0, 2, (batch,), generator=g)
    return tuple(t.to(device) for t in (ids, segments, mask, positions, labels, nsp))
