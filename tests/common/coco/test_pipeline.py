"""The shared COCO input-pipeline skeleton (common/coco/pipeline.py): per-sample generators, the
epoch's order, and a Loader that runs a subclass's sampling and collation in worker processes."""

import os
import time
from typing import NamedTuple

import pytest
import torch

from common.coco import pipeline


def test_a_samples_generator_depends_on_seed_epoch_and_index_only():
    def draw(*key):
        return torch.rand(4, generator=pipeline.sample_generator(*key))
    assert torch.equal(draw(3, 1, 7), draw(3, 1, 7))
    others = [draw(4, 1, 7), draw(3, 2, 7), draw(3, 1, 8)]
    assert not any(torch.equal(draw(3, 1, 7), o) for o in others)


def test_an_epochs_order_is_a_permutation_per_seed_and_epoch():
    order = pipeline.epoch_order(50, 5, 1)
    assert sorted(order) == list(range(50)) and all(type(i) is int for i in order)
    assert pipeline.epoch_order(50, 5, 1) == order
    assert pipeline.epoch_order(50, 5, 2) != order and pipeline.epoch_order(50, 6, 1) != order


class Pair(NamedTuple):
    index: torch.Tensor
    epoch: torch.Tensor


class Numbers(torch.utils.data.Dataset):
    """Sample i of epoch e: (i, e), so a batch shows which epoch the worker saw."""

    def __init__(self, n: int):
        self.n, self.epoch = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, self.epoch


def collate(samples) -> Pair:
    return Pair(*(torch.tensor(v) for v in zip(*samples)))


class Halves(pipeline.Loader):
    """Rank r's batches: the r-th half of the epoch's order, in pairs."""

    def batches(self, epoch):
        order = pipeline.epoch_order(len(self.dataset), self.seed, epoch)
        mine = order[self.rank::self.world_size]
        return [mine[i:i + self.batch_size] for i in range(0, len(mine), self.batch_size)]


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_collates_the_subclasss_batches_for_the_epoch(workers):
    loader = Halves(Numbers(8), True, collate, 2, rank=1, world_size=2, seed=3,
                    num_workers=workers)
    assert len(loader) == 2 and len(loader.epoch(5)) == 2
    batches = list(loader.epoch(5))
    assert all(type(b) is Pair for b in batches)
    assert [b.index.tolist() for b in batches] == loader.batches(5)
    assert all(b.epoch.tolist() == [5, 5] for b in batches)
    batches = list(loader.epoch(6))   # the same loader processes: the epoch travels with a batch
    assert [b.index.tolist() for b in batches] == loader.batches(6)
    assert all(b.epoch.tolist() == [6, 6] for b in batches)
    loader.close()


class Processes(Numbers):
    """Sample i: the process that loaded it."""

    def __getitem__(self, i):
        return i, os.getpid()


def test_training_loader_processes_serve_every_epoch():
    """Started anew each epoch, they cost their start and first batches every epoch: most of
    an epoch of a stand-in fraction's few steps."""
    loader = Halves(Processes(16), True, collate, 2, seed=3, num_workers=2)
    seen = [set(torch.cat([b.epoch for b in loader.epoch(e)]).tolist()) for e in range(3)]
    loader.close()
    assert len(set().union(*seen)) == 2 and os.getpid() not in seen[0], seen


def test_an_evaluation_loader_leaves_the_datasets_epoch_alone():
    data = Numbers(4)
    loader = Halves(data, False, lambda s: tuple(torch.tensor(v) for v in zip(*s)), 2)
    (index, epoch), (index2, _) = loader.epoch(9)
    assert data.epoch == 0 and epoch.tolist() == [0, 0]
    assert type(index) is torch.Tensor and sorted(index.tolist() + index2.tolist()) == [0, 1, 2, 3]


def test_a_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match="rank 2 outside world size 2"):
        Halves(Numbers(4), True, collate, 2, rank=2, world_size=2)


class Marked(Numbers):
    """Sample i leaves a file named for its epoch and index when loaded."""

    def __init__(self, n: int, folder):
        super().__init__(n)
        self.folder = folder

    def __getitem__(self, i):
        (self.folder / f"{self.epoch}-{i}").touch()
        return i, self.epoch


def test_training_loader_processes_load_the_next_epoch_ahead(tmp_path):
    """While an epoch's last steps run, the next epoch's first batches load; with new keys
    only when the next pass began, its first steps waited for a whole batch's loading."""
    loader = Halves(Marked(16, tmp_path), True, collate, 2, seed=3, num_workers=2)
    first = list(loader.epoch(0))
    deadline = time.monotonic() + 20
    while not list(tmp_path.glob("1-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    ahead = len(list(tmp_path.glob("1-*")))
    second = list(loader.epoch(1))
    loader.close()
    assert ahead > 0
    assert [b.index.tolist() for b in first] == loader.batches(0)
    assert [b.index.tolist() for b in second] == loader.batches(1)
    assert all(b.epoch.tolist() == [1, 1] for b in second)


def test_a_pass_left_unfinished_restarts_at_the_epoch_asked_for():
    loader = Halves(Numbers(16), True, collate, 2, seed=3, num_workers=2)
    next(iter(loader.epoch(0)))
    batches = list(loader.epoch(4))
    loader.close()
    assert [b.index.tolist() for b in batches] == loader.batches(4)
    assert all(b.epoch.tolist() == [4, 4] for b in batches)


class Counted(Numbers):
    """Sample i of epoch e adds a byte to a file named for both each time it is loaded."""

    def __init__(self, n: int, folder):
        super().__init__(n)
        self.folder = folder

    def __getitem__(self, i):
        with open(self.folder / f"{self.epoch}-{i}", "ab") as f:
            f.write(b".")
        return i, self.epoch


def test_an_epoch_taken_to_its_count_runs_on_into_the_next(tmp_path):
    """The trainer takes an epoch's ``len`` batches and drops its iterator without asking for
    one more (``common.training._Stream``): the next epoch goes on with the batches loaded
    ahead. Restarting the key stream there waited for every batch in flight and loaded them
    again: about 10 s a step on SSD's dry run, whose stand-in epochs are 2.3 steps."""
    loader = Halves(Counted(16, tmp_path), True, collate, 2, seed=3, num_workers=2)
    for e in range(3):
        it = iter(loader.epoch(e))
        batches = [next(it) for _ in range(len(loader.epoch(e)))]
        assert [b.index.tolist() for b in batches] == loader.batches(e)
        del it
    loader.close()
    loads = {f.name: f.stat().st_size for f in tmp_path.iterdir()}
    assert all(loads[f"{e}-{i}"] == 1 for e in range(3) for i in range(16)), loads
