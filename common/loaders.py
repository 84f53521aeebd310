"""DataLoaders whose worker processes serve every pass of a run, stopping them at its end,
and a shared-memory pool those processes fill and the main process reads in place."""

from __future__ import annotations

import collections
import functools
import itertools
import math
import os
import signal
import sys
from typing import NamedTuple

import torch

from common.errors import UserError

SHM = "/dev/shm"   # where torch's shared-memory segments live

PREFETCH = 4   # items each loader process of ``persistent`` may have queued


def quiet_on_stop(worker_id: int | None = None) -> None:
    """A loader process's ``worker_init_fn``: SIGINT is ignored (a Ctrl-C reaches the whole
    process group; the trainer stops its loader processes) and SIGTERM (a scheduler's reaches
    the whole group too) ends the process at once with status 0. Under torch's own handler
    it would die of the signal, and the trainer would report a failed loader process ("killed
    by signal: Terminated") instead of its stop. A connection the trainer drops (a stop or its
    end cutting short the handshake that passes a tensor's file descriptor) is no news either:
    multiprocessing's fd server would print its traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    sys.excepthook = functools.partial(_quiet_on_hangup, sys.excepthook)


def _quiet_on_hangup(hook, kind, value, tb) -> None:
    if not issubclass(kind, ConnectionError):
        hook(kind, value, tb)


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


def page_lock(host: torch.Tensor, what: str, fix: str) -> None:
    """Page-lock ``host``'s memory (``cudaHostRegister``: asynchronous copies, and reads by the
    GPU itself); a one-line error naming ``what`` and the ``fix`` where CUDA refuses."""
    rc = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.nbytes, 0)
    if rc != 0:
        raise UserError(f"page-locking {what} ({host.nbytes / 2**30:.1f} GiB) failed (CUDA "
                        f"error {rc}); {fix}")


def unlock(host: torch.Tensor) -> None:
    """Undo :func:`page_lock` (once the GPU's last use of the memory has run)."""
    torch.cuda.cudart().cudaHostUnregister(host.data_ptr())


class EpochStream:
    """A run's items ``dataset[key]`` epoch by epoch (``keys_of(epoch)`` the keys of one), from
    loader processes that serve the whole run (:func:`persistent`: started at the first epoch,
    stopped by ``close``, started again if read again) in one stream of keys that runs on into
    the next epoch, so the processes load its first items while this one's last steps run.

    ``epoch(e)`` yields e's items. A trainer takes an epoch's count of items and asks for no
    more: the next epoch then goes on from the stream. Another epoch asked for, or a pass left
    unfinished, restarts the stream there, after the processes finish what they had queued."""

    def __init__(self, dataset, keys_of, workers: int, pin: bool, as_is: bool = False,
                 prefetch: int = PREFETCH):
        self.dataset, self.keys_of = dataset, keys_of
        self.workers, self.pin, self.as_is, self.prefetch = workers, pin, as_is, prefetch
        self._keys, self._loader = Keys(), None
        self._stream = self._next = None

    def epoch(self, epoch: int):
        if self._loader is None:
            self._loader = persistent(self.dataset, self._keys, self.workers, self.pin,
                                      self.as_is, self.prefetch)
        if epoch != self._next or self._stream is None:
            self._keys.keys = self._keys_from(epoch)
            self._stream = iter(self._loader)
        self._next = None
        count = len(self.keys_of(epoch))
        for i in range(count):
            if i == count - 1:   # the epoch's last item handed out: the stream runs on
                self._next = epoch + 1
            yield next(self._stream)

    def _keys_from(self, epoch: int):
        for e in itertools.count(epoch):
            yield from self.keys_of(e)

    def close(self) -> None:
        """Stop the loader processes."""
        if self._loader is not None:
            shut_down(self._loader)
            self._stream = self._next = None


class Batches(torch.utils.data.Dataset):
    """``dataset``'s items a batch at a time, for :class:`EpochStream`: key, a list of the
    dataset's keys (indices, or whatever it takes) -> ``collate`` of those items (in the
    loader process that serves it)."""

    def __init__(self, dataset, collate):
        self.dataset, self.collate = dataset, collate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, keys: list):
        return self.collate([self.dataset[k] for k in keys])


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


def persistent(dataset, keys: Keys, workers: int, pin: bool, as_is: bool = False,
               prefetch: int = PREFETCH) -> torch.utils.data.DataLoader:
    """The DataLoader of ``dataset[key]`` for each key of ``keys`` (items already batched;
    pinned when ``pin``), its worker processes kept from one pass to the next, each with up
    to ``prefetch`` items queued (every queued item is held in host memory). With ``as_is``
    the items cross unchanged (numpy arrays stay arrays, pickled with the item, instead of
    tensors that each cross through shared memory)."""
    return torch.utils.data.DataLoader(
        dataset, batch_size=None, sampler=keys, num_workers=workers, pin_memory=pin,
        prefetch_factor=prefetch if workers else None, persistent_workers=workers > 0,
        collate_fn=_as_is if as_is else None, worker_init_fn=quiet_on_stop)


def _as_is(item):
    return item


class Slot(NamedTuple):
    """An item's tensor left in a ``SharedBuffers`` pool: its slot and shape."""
    index: int
    shape: tuple


class SharedBuffers:
    """One shared-memory pool of slots, made in the main process before its loader processes
    start, that the loader processes fill and the main process reads where they are.

    An item's tensor crosses to the main process as its slot number (``send`` gives a
    ``Slot``; ``receive`` turns it back into a view of the pool): no file descriptor, no new
    mapping and no copy per item. Sent as a tensor instead, torch would pass a file
    descriptor for each one (a connection to the loader process and back), map it anew, and
    with ``pin_memory`` copy it into pinned memory: about 500 MB a batch of 1,632 unresized
    ImageNet crops. With ``pin``, the pool itself is page-locked for the GPU's copies
    (``cudaHostRegister``), once, after the loader processes have started.

    Each worker owns ``per_worker`` slots of ``numel`` elements; ``take`` hands one out and
    marks it busy in a table the main process shares; the main process ``release``s the
    items it has copied out (on a GPU once the copies, queued on ``stream``,
    have run). Before a new iterator drops what the workers had queued, the main process
    calls ``drop_all``: each worker then takes its slots as free again at its next
    ``take``. No slot free, or a larger item: a private tensor, sent as such. With
    ``workers`` 0 the main process fills the items itself from one worker's slots.
    """

    def __init__(self, workers: int, per_worker: int, numel: int, dtype=torch.uint8):
        self.busy = torch.zeros(max(workers, 1), per_worker, dtype=torch.uint8).share_memory_()
        self.generation = torch.zeros(1, dtype=torch.int64).share_memory_()
        nbytes = self.busy.numel() * numel * dtype.itemsize
        _check_room(nbytes)
        storage = torch.UntypedStorage._new_shared(nbytes)
        self.pool = torch.empty(0, dtype=dtype).set_(storage).view(self.busy.numel(), numel)
        self.numel, self.in_main = numel, workers == 0
        self._generation, self._pending, self._pinned = 0, collections.deque(), False

    def take(self, shape) -> tuple[torch.Tensor, int]:
        """An uninitialised tensor of ``shape`` and its slot (-1: a private tensor)."""
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0 if self.in_main else None
        numel = math.prod(shape)
        if worker is None or numel > self.numel:
            return torch.empty(shape, dtype=self.pool.dtype), -1
        busy = self.busy[worker]
        if self._generation != int(self.generation):
            self._generation = int(self.generation)
            busy.zero_()
        free = torch.nonzero(busy == 0)
        if not len(free):
            return torch.empty(shape, dtype=self.pool.dtype), -1
        slot = int(free[0])
        busy[slot] = 1
        index = worker * busy.numel() + slot
        return self.pool[index, :numel].view(shape), index

    @staticmethod
    def send(tensor: torch.Tensor, slot: int):
        """What an item carries for ``tensor`` from ``take``: its ``Slot``, or the private
        tensor itself."""
        return Slot(slot, tuple(tensor.shape)) if slot >= 0 else tensor

    def receive(self, sent) -> torch.Tensor:
        """The tensor that ``send`` sent, a view of the pool where it was left there."""
        if not isinstance(sent, Slot):
            return sent
        return self.pool[sent.index, :math.prod(sent.shape)].view(sent.shape)

    def pin(self) -> None:
        """Page-lock the pool for asynchronous copies to the GPU (once). Called after the
        loader processes have started: they share the pool's pages, not this mapping."""
        if not self._pinned:
            page_lock(self.pool, f"the loader processes' pool in {SHM}",
                      "free host memory or lower --workers or the batch size")
            self._pinned = True

    def release(self, sent, stream: torch.cuda.Stream | None = None) -> None:
        """Give back the slots of the ``sent`` items (``send``'s results; private tensors hold
        none): now, or once the work queued on ``stream`` so far has run."""
        slots = [s.index for s in sent if isinstance(s, Slot)]
        if stream is None:
            self._free(slots)
        else:
            event = torch.cuda.Event()
            event.record(stream)
            self._pending.append((event, slots))
        while self._pending and self._pending[0][0].query():
            self._free(self._pending.popleft()[1])

    def drop_all(self) -> None:
        """Forget every slot in use: the items the workers had queued will not be read."""
        while self._pending:
            self._pending.popleft()[0].synchronize()
        self.generation += 1

    def close(self) -> None:
        """Un-page-lock the pool (after the last copy from it has run)."""
        self.drop_all()
        if self._pinned:
            unlock(self.pool)
            self._pinned = False

    def _free(self, slots) -> None:
        for slot in slots:
            self.busy.view(-1)[slot] = 0


def _check_room(nbytes: int) -> None:
    """A pool larger than the free space of ``SHM`` would end its processes with SIGBUS
    when written: say so first (a container's default /dev/shm is 64 MiB)."""
    if os.path.isdir(SHM):
        st = os.statvfs(SHM)
        free = st.f_bavail * st.f_frsize
        if nbytes > free:
            raise UserError(f"{SHM}: {free / 2**30:.2f} GiB free, the loader processes' pool "
                            f"needs {nbytes / 2**30:.2f} GiB; give the container more shared "
                            "memory (docker run --shm-size) or lower --workers or the batch size")
