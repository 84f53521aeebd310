"""The input-pipeline skeleton SSD's and Mask R-CNN's COCO loaders share: per-sample random
generators, the epoch's global order and a rank's :class:`Loader`.

A sample's random choices come from a generator seeded by (seed, epoch, index), so they do
not depend on the worker process that loads it; an epoch's order is a permutation seeded by
(seed, epoch), the same on every rank. Each workload's loader subclasses :class:`Loader` with
its sampling (``batches``) and its collation; loading runs in ``DataLoader`` workers
(:func:`common.coco.data.batch_loader`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from common.coco.data import Epoch, batch_loader


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The generator of one sample's random choices in one epoch."""
    mixed = ((seed * 1_000_003 + epoch) * 1_000_003 + index) % (1 << 63)
    return torch.Generator().manual_seed(mixed)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The global sample order of a training epoch (the same on every rank)."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def to_device(batch, device: torch.device):
    """A collated batch (a tuple or named tuple of tensors) with its tensors on ``device``."""
    make = getattr(type(batch), "_make", tuple)
    return make(t.to(device, non_blocking=True) for t in batch)


class Loader:
    """One rank's batches of ``dataset``: the index lists of ``batches(epoch)`` (the subclass's
    sampling), loaded and collated by ``collate`` in ``num_workers`` processes, moved to
    ``device``. ``epoch(e)`` is that epoch's pass, sized and iterable; before a training pass
    the dataset's ``epoch`` is set (workers are created per pass and copy it)."""

    def __init__(self, dataset, train: bool, collate: Callable, batch_size: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, num_workers: int = 0,
                 device: torch.device | str = "cpu"):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.dataset, self.train, self.collate = dataset, train, collate
        self.batch_size, self.rank, self.world_size, self.seed = batch_size, rank, world_size, seed
        self.num_workers, self.device = num_workers, torch.device(device)

    def batches(self, epoch: int) -> list[list[int]]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.batches(0))

    def epoch(self, epoch: int) -> Epoch:
        return Epoch(self, epoch)

    def iterate(self, epoch: int):
        if self.train:
            self.dataset.epoch = epoch
        for batch in batch_loader(self.dataset, self.batches(epoch), self.collate,
                                  self.num_workers, self.device):
            yield to_device(batch, self.device)
