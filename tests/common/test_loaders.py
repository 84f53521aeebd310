"""common.loaders.shut_down: a DataLoader's persistent workers stop when asked, not at exit."""

import multiprocessing

import torch

from common.loaders import shut_down


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
