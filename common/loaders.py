"""DataLoaders whose worker processes serve every pass of a run, stopping them at its end,
and shared-memory buffers that those processes reuse."""

from __future__ import annotations

import math

import torch

PREFETCH = 4   # items each loader process of ``persistent`` may have queued


def shut_down(loader: torch.utils.data.DataLoader) -> None:
    """Stop ``loader``'s persistent worker processes now, while the interpreter runs.

    With persistent workers and pinned memory, torch 2.11 registers one exit handler per
    worker that waits up to 5 s for the worker to stop before killing it. A worker still
    idle at exit is never told to stop, so each costs those 5 s: 12 loader processes
    for training and 12 for evaluation would hold the process about 2 minutes after
    ``run_stop``. Stopped here, the workers have exited before those handlers run. The
    loader starts new workers if it is iterated again.
    """
    iterator = loader._iterator   # the persistent workers' iterator (torch keeps no public one)
    if iterator is not None:
        loader._iterator = None
        iterator._shutdown_workers()


class Keys(torch.utils.data.Sampler):
    """A sampler of item keys (e.g. ``(epoch, indices)``), set before each pass (a list, or
    an iterator that runs on into the passes that follow); it is read in the main process, so
    persistent workers serve whatever the keys of the next pass are."""

    def __init__(self, keys: list | None = None):
        self.keys = keys or []

    def __iter__(self):
        return iter(self.keys)

    def __len__(self):
        return len(self.keys)


def persistent(dataset, keys: Keys, workers: int, pin: bool) -> torch.utils.data.DataLoader:
    """The DataLoader of ``dataset[key]`` for each key of ``keys`` (items already batched;
    pinned when ``pin``), its worker processes kept from one pass to the next."""
    return torch.utils.data.DataLoader(
        dataset, batch_size=None, sampler=keys, num_workers=workers, pin_memory=pin,
        prefetch_factor=PREFETCH if workers else None, persistent_workers=workers > 0)


class SharedBuffers:
    """Buffers in shared memory that each loader process fills again once the main process has
    given them back, instead of a new buffer per item.

    A tensor a worker returns crosses to the main process through shared memory: torch copies
    a private tensor there when it is sent, and a new buffer also takes a page fault per 4 KiB
    page where it is first written. For a slice of 109 ImageNet crops (16 MiB) that is about 9
    ms of a loader process's ~100 ms (the development machine, docs/performance.md). Here each
    worker keeps up to ``per_worker`` buffers of ``numel`` elements; ``take`` hands one out
    and marks it busy in a table that the main process shares, and the main process calls
    ``give_back`` when it has copied the item out. Before a new iterator drops what the
    workers had queued, the main process calls ``drop_all``: each worker then frees all its
    buffers at its next ``take``, when none it has taken since holds an item of the new pass.
    No buffer free, or a larger item: a new private tensor, as before. With ``workers`` 0 the
    main process fills the items itself and takes from one worker's buffers.
    """

    def __init__(self, workers: int, per_worker: int, numel: int, dtype=torch.uint8):
        self.busy = torch.zeros(max(workers, 1), per_worker, dtype=torch.uint8).share_memory_()
        self.generation = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.numel, self.dtype, self.in_main = numel, dtype, workers == 0
        self._own, self._generation = [], 0   # this worker's buffers and generation

    def __getstate__(self):
        return {**self.__dict__, "_own": [], "_generation": 0}

    def take(self, shape) -> tuple[torch.Tensor, int]:
        """An uninitialised tensor of ``shape`` and its slot for ``give_back`` (-1: private)."""
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0 if self.in_main else None
        numel = math.prod(shape)
        if worker is None or numel > self.numel:
            return torch.empty(shape, dtype=self.dtype), -1
        busy = self.busy[worker]
        if self._generation != int(self.generation):
            self._generation = int(self.generation)
            busy.zero_()
        slot = next((b for b in range(len(self._own)) if not busy[b]), len(self._own))
        if slot == len(busy):
            return torch.empty(shape, dtype=self.dtype), -1
        if slot == len(self._own):
            nbytes = self.numel * self.dtype.itemsize
            storage = torch.UntypedStorage._new_shared(nbytes)
            self._own.append(torch.empty(0, dtype=self.dtype).set_(storage).view(-1))
        busy[slot] = 1
        return self._own[slot][:numel].view(shape), worker * busy.numel() + slot

    def give_back(self, slot: int) -> None:
        if slot >= 0:
            self.busy.view(-1)[slot] = 0

    def drop_all(self) -> None:
        self.generation += 1
