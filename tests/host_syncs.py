"""Host synchronisations counted on the CPU as they would happen on a GPU: reading a value
(``item``, ``bool``, ``int``, ``tolist``), ops whose output shape depends on the data
(``nonzero``, boolean-mask indexing, ``unique``, ``bincount``, ``masked_select``,
``repeat_interleave`` without ``output_size``) and host tensors copied to the device, each
counted by the innermost frame of the code under test that made it."""

import collections
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten._unique2.default,
           aten.unique_consecutive.default, aten.unique_dim.default, aten.bincount.default,
           aten.masked_select.default, aten.lift_fresh.default, aten.repeat_interleave.Tensor}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
            aten._index_put_impl_.default}


def _caller(package: str) -> str:
    """``function (file:line)`` of the innermost frame in ``package`` (e.g.
    ``benchmarks/maskrcnn/``)."""
    for frame in reversed(traceback.extract_stack()):
        if package in frame.filename and "tests" not in frame.filename:
            return f"{frame.name} ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
    return "elsewhere"


class SyncCounter(TorchDispatchMode):
    """Counts the syncing calls by their caller in ``package`` while active (``tolist``
    through a patch)."""

    def __init__(self, package: str):
        super().__init__()
        self.package = package
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
            self.calls[_caller(self.package)] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        self._tolist = torch.Tensor.tolist

        def tolist(tensor):
            self.calls[_caller(self.package)] += 1
            return self._tolist(tensor)
        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)
