"""DataLoaders whose worker processes serve every pass of a run, and stopping them at its end."""

from __future__ import annotations

import torch


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
        prefetch_factor=4 if workers else None, persistent_workers=workers > 0)
