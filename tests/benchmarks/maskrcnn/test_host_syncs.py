"""Host synchronisations of one training step, counted on the CPU as they would happen on a
GPU: reading a value (``item``, ``bool``, ``int``, ``tolist``), ops whose output shape depends
on the data (``nonzero``, boolean-mask indexing, ``unique``, ``bincount``, ``masked_select``,
``repeat_interleave`` without ``output_size``) and host tensors copied to the device. The
count must not grow with the batch (no per-image syncs); NMS's rounds are counted apart."""

import collections
import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.benchmarks.maskrcnn.test_workload import TINY, build

aten = torch.ops.aten
SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten._unique2.default,
           aten.unique_consecutive.default, aten.unique_dim.default, aten.bincount.default,
           aten.masked_select.default, aten.lift_fresh.default, aten.repeat_interleave.Tensor}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
            aten._index_put_impl_.default}
MOST_PER_STEP = 6       # the RPN's NMS input (3) and per-level cut (2), the RoI counts (1)


def _caller() -> str:
    """``function (file:line)`` of the innermost Mask R-CNN frame."""
    for frame in reversed(traceback.extract_stack()):
        if "benchmarks/maskrcnn/" in frame.filename and "tests" not in frame.filename:
            return f"{frame.name} ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
    return "elsewhere"


class SyncCounter(TorchDispatchMode):
    """Counts the syncing calls by caller while active (``tolist`` through a patch)."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        syncs = func in SYNCING
        if func is aten.repeat_interleave.Tensor:
            syncs = kwargs.get("output_size") is None
        elif func is aten.lift_fresh.default:
            syncs = args[0].dim() > 0       # a Python scalar goes to the device as a fill
        elif func in INDEXING:
            syncs = any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                        for i in args[1] if i is not None)
        if syncs:
            self.calls[_caller()] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        self._tolist = torch.Tensor.tolist

        def tolist(tensor):
            self.calls[_caller()] += 1
            return self._tolist(tensor)
        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


def step_syncs(batch_size: int) -> collections.Counter:
    """Syncs of the second training step (the first makes the cached constants)."""
    argv = list(TINY)
    argv[argv.index("--batch-size") + 1] = str(batch_size)
    wl = build(argv)
    batch = wl.synthetic_batch(batch_size)
    wl.train_step(*batch)
    with SyncCounter() as counter:
        wl.train_step(*batch)
    return counter.calls


@pytest.mark.parametrize("batch_size", [2, 4])
def test_a_training_step_syncs_a_few_times_whatever_the_batch(batch_size):
    calls = step_syncs(batch_size)
    rounds = sum(n for where, n in calls.items() if where.startswith("_greedy_keep"))
    others = {where: n for where, n in calls.items() if not where.startswith("_greedy_keep")}
    assert rounds >= 1
    assert sum(others.values()) <= MOST_PER_STEP, others
