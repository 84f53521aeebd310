"""common.loaders.shut_down: a DataLoader's persistent workers stop when asked, not at exit."""

import multiprocessing
import time

import pytest
import torch

from common import loaders
from common.errors import UserError
from common.loaders import Keys, SharedBuffers, Slot, shut_down


def _new_workers(before: set) -> list:
    return [p for p in multiprocessing.active_children() if p not in before]


def test_shut_down_stops_the_persistent_workers_and_a_later_pass_starts_new_ones():
    before = set(multiprocessing.active_children())
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=2,
                                         persistent_workers=True)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    workers = _new_workers(before)
    assert len(workers) == 2 and all(p.is_alive() for p in workers)   # kept between passes
    shut_down(loader)
    assert not any(p.is_alive() for p in workers)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    shut_down(loader)
    assert not any(p.is_alive() for p in _new_workers(before))


def test_shut_down_of_a_loader_without_workers_does_nothing():
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    shut_down(loader)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


class _Filled(torch.utils.data.Dataset):
    """Item k: a slot of ``buffers`` filled with k, as sent, and the slot."""

    def __init__(self, buffers):
        self.buffers = buffers

    def __getitem__(self, k):
        out, slot = self.buffers.take((k % 3 + 1, 5))
        out.fill_(k)
        return SharedBuffers.send(out, slot), slot


def test_slots_cross_by_number_are_reused_once_released_and_hold_each_items_values():
    buffers = SharedBuffers(workers=2, per_worker=3, numel=15, dtype=torch.int32)
    loader = torch.utils.data.DataLoader(_Filled(buffers), batch_size=None,
                                         sampler=Keys(list(range(40))), num_workers=2,
                                         prefetch_factor=1)
    slots = []
    for k, (sent, slot) in enumerate(loader):
        assert isinstance(sent, Slot) and sent.index == slot >= 0   # no tensor crossed
        out = buffers.receive(sent)
        assert out.shape == (k % 3 + 1, 5) and bool((out == k).all()), (k, out)
        assert out.data_ptr() == buffers.pool[slot].data_ptr()   # read where it was written
        slots.append(slot)
        buffers.release([sent])
    assert len(set(slots)) <= 6 < len(slots)   # 40 items from at most 2 x 3 slots
    assert not buffers.busy.any()


def test_shared_buffers_fall_back_to_a_private_tensor_when_none_is_free_or_fits():
    buffers = SharedBuffers(workers=1, per_worker=2, numel=15, dtype=torch.int32)
    loader = torch.utils.data.DataLoader(_Filled(buffers), batch_size=None,
                                         sampler=Keys(list(range(6))), num_workers=1)
    items = list(loader)   # none released: two slots, then private tensors
    assert [slot for _, slot in items] == [0, 1, -1, -1, -1, -1]
    for k, (sent, _) in enumerate(items[2:], 2):   # sent as tensors, with their values
        assert isinstance(sent, torch.Tensor) and bool((buffers.receive(sent) == k).all())
    buffers.drop_all()   # the next pass's worker takes both as free at its first take
    assert [slot for _, slot in loader] == [0, 1, -1, -1, -1, -1]
    big = SharedBuffers(workers=1, per_worker=2, numel=4)
    assert big.take((2, 5))[1] == -1   # in the main process, and larger than the slots


def test_shared_buffers_serve_the_main_process_when_it_fills_the_items_itself():
    """``workers`` 0: the main process takes from one worker's slots (the pipeline tool's
    one-thread stage, a loader without processes); otherwise it gets private tensors."""
    buffers = SharedBuffers(workers=0, per_worker=2, numel=15, dtype=torch.int32)
    (a, sa), (_, sb) = buffers.take((3, 5)), buffers.take((2, 5))
    assert (sa, sb) == (0, 1) and buffers.take((1, 5))[1] == -1   # both busy
    buffers.release([SharedBuffers.send(a, sa), torch.zeros(2)])   # a private tensor: no slot
    c, sc = buffers.take((3, 5))
    assert sc == 0 and c.data_ptr() == a.data_ptr()
    assert SharedBuffers(workers=1, per_worker=2, numel=15).take((3, 5))[1] == -1


def test_a_pool_larger_than_the_free_shared_memory_is_a_one_line_error(monkeypatch):
    class Full:
        f_bavail, f_frsize = 10, 4096
    monkeypatch.setattr(loaders.os, "statvfs", lambda path: Full)
    with pytest.raises(UserError, match=r"/dev/shm: 0.00 GiB free.*--shm-size"):
        SharedBuffers(workers=2, per_worker=3, numel=1 << 20)
    SharedBuffers(workers=1, per_worker=2, numel=1000)   # 2,000 bytes fit


def test_a_pool_that_cannot_be_page_locked_is_a_one_line_error(monkeypatch):
    class Cudart:
        @staticmethod
        def cudaHostRegister(ptr, size, flags):
            return 2   # cudaErrorMemoryAllocation
    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart)
    buffers = SharedBuffers(workers=1, per_worker=2, numel=1000)
    with pytest.raises(UserError, match=r"page-locking .* failed \(CUDA error 2\); free host"):
        buffers.pin()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_pinned_slots_are_released_once_the_copies_queued_before_have_run():
    """The pool page-locked after a loader process has started: the process still fills it,
    a copy from it runs asynchronously, and its slot is free only once that copy has run."""
    buffers = SharedBuffers(workers=1, per_worker=4, numel=1 << 22, dtype=torch.int32)
    loader = torch.utils.data.DataLoader(_Filled(buffers), batch_size=None,
                                         sampler=Keys(list(range(4))), num_workers=1,
                                         prefetch_factor=1, persistent_workers=True)
    iter(loader)
    buffers.pin()
    assert buffers.pool.is_pinned()
    stream = torch.cuda.Stream()
    try:
        for k, (sent, slot) in enumerate(loader):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(50_000_000)   # the copy queued behind ~tens of ms of work
                out = buffers.receive(sent).to("cuda", non_blocking=True)
            assert slot >= 0
            buffers.release([sent], stream)
            assert buffers.busy.view(-1)[slot] == 1   # the copy has not run yet
            stream.synchronize()
            buffers.release([], stream)
            assert buffers.busy.view(-1)[slot] == 0
            assert bool((out == k).all())
    finally:
        shut_down(loader)
        buffers.close()


class _Logged(torch.utils.data.Dataset):
    """Item ``key`` = ``(epoch, i)``: ``i`` and ``epoch``, each load leaving a byte in a file
    named for the key."""

    def __init__(self, folder):
        self.folder = folder

    def __len__(self):
        return 0

    def __getitem__(self, key):
        with open(self.folder / f"{key[0]}-{key[1]}", "ab") as f:
            f.write(b".")
        return torch.tensor(key)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_stream_runs_on_and_restarts_where_asked(tmp_path, workers):
    """Each epoch taken to its count (as the trainer takes it) goes on from the stream, its
    items loaded once and the next epoch's ahead; an unfinished pass or another epoch asked
    for restarts the stream there; closed, it starts again."""
    stream = loaders.EpochStream(_Logged(tmp_path), lambda e: [(e, i) for i in range(4)],
                                 workers, pin=False)

    def take(epoch, count=4):
        it = stream.epoch(epoch)
        return [tuple(next(it).tolist()) for _ in range(count)]

    assert take(0) == [(0, i) for i in range(4)]
    assert take(1) == [(1, i) for i in range(4)]
    assert take(2, count=1) == [(2, 0)]                 # left unfinished
    assert take(5) == [(5, i) for i in range(4)]        # restarts at the epoch asked for
    assert take(6) == [(6, i) for i in range(4)]
    stream.close()
    assert take(7) == [(7, i) for i in range(4)]        # new processes
    deadline = time.monotonic() + 20   # the epoch after the last one taken loads ahead
    while workers and not (tmp_path / "8-0").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    stream.close()
    loads = {f.name: f.stat().st_size for f in tmp_path.iterdir()}
    assert all(loads[f"{e}-{i}"] == 1 for e in (0, 1, 5, 6) for i in range(4)), loads
    assert ("8-0" in loads) == bool(workers)
