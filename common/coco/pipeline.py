"""The input-pipeline skeleton SSD's and Mask R-CNN's COCO loaders share: per-sample random
generators, the epoch's global order and a rank's :class:`Loader`.

A sample's random choices come from a generator seeded by (seed, epoch, index), so they do
not depend on the worker process that loads it; an epoch's order is a permutation seeded by
(seed, epoch), the same on every rank. Each workload's loader subclasses :class:`Loader` with
its sampling (``batches``) and its collation; loading runs in ``DataLoader`` workers: for
training the same processes every epoch (``common.loaders.persistent``), for evaluation new
ones each pass (:func:`common.coco.data.batch_loader`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from common import loaders
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
    ``device``. ``epoch(e)`` is that epoch's pass, sized and iterable. Training batches come
    from loader processes that serve the whole run (started at the first epoch, stopped by
    ``close``) from one stream of keys that runs on into the next epoch, so the processes load
    its first batches while this one's last steps run. A batch is one process's work: a
    loader that started each epoch afresh made every epoch's first step wait for a whole
    batch's loading, most of the time of a stand-in fraction's few-step epochs."""

    def __init__(self, dataset, train: bool, collate: Callable, batch_size: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, num_workers: int = 0,
                 device: torch.device | str = "cpu"):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.dataset, self.train, self.collate = dataset, train, collate
        self.batch_size, self.rank, self.world_size, self.seed = batch_size, rank, world_size, seed
        self.num_workers, self.device = num_workers, torch.device(device)
        self._train = None   # the training batches' loaders.EpochStream

    def batches(self, epoch: int) -> list[list[int]]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.batches(0))

    def epoch(self, epoch: int) -> Epoch:
        return Epoch(self, epoch)

    def iterate(self, epoch: int):
        if not self.train:
            for batch in batch_loader(self.dataset, self.batches(epoch), self.collate,
                                      self.num_workers, self.device):
                yield to_device(batch, self.device)
            return
        if self._train is None:
            self._train = loaders.EpochStream(
                EpochBatches(self.dataset, self.collate),
                lambda e: [(e, batch) for batch in self.batches(e)], self.num_workers,
                pin=self.device.type == "cuda")
        for batch in self._train.epoch(epoch):
            yield to_device(batch, self.device)

    def close(self) -> None:
        """Stop the training loader processes (started again if iterated again)."""
        if self._train is not None:
            self._train.close()


class EpochBatches(loaders.Batches):
    """``dataset``'s samples a batch at a time, for ``loaders.persistent``: key ``(epoch,
    indices)`` -> ``collate`` of those samples with the dataset's ``epoch`` set (in the loader
    process that serves it)."""

    def __getitem__(self, key: tuple[int, list[int]]):
        self.dataset.epoch, indices = key
        return super().__getitem__(indices)
