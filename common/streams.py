"""The CUDA streams a run's device work goes on: the run's own, and side streams beside it."""

from __future__ import annotations

import contextlib

import torch
from torch.utils._pytree import tree_leaves


@contextlib.contextmanager
def work_stream(device: torch.device):
    """Runs the block's CUDA work on a stream of its own instead of the legacy default stream
    (nothing changes off CUDA). The legacy default stream waits for, and is waited on by,
    every blocking stream a library creates; nvJPEG's hardware decoder creates such streams,
    so a training step on the default stream and a decode in another thread would take
    turns on the GPU instead of overlapping."""
    if device.type != "cuda":
        yield
        return
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        torch.cuda.current_stream(device).wait_stream(stream)


class SideStreams:
    """Calls that run on CUDA streams of their own beside the current stream, joined before
    what depends on them (e.g. a model's losses, joined before backward). Each call's stream
    first waits for the current stream's work so far; :meth:`join` makes the current stream
    wait for every call's. Off CUDA the calls run in place."""

    def __init__(self, device: torch.device, count: int):
        self.streams = ([torch.cuda.Stream(device) for _ in range(count)]
                        if device.type == "cuda" else [])

    def run(self, index: int, fn, *args):
        """``fn(*args)`` on stream ``index``; the tensors in ``args`` are marked as used there,
        so the allocator does not hand out their memory before that stream is done."""
        if not self.streams:
            return fn(*args)
        stream = self.streams[index]
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        for leaf in tree_leaves(args):
            if isinstance(leaf, torch.Tensor) and leaf.is_cuda:
                leaf.record_stream(stream)
        with torch.cuda.stream(stream):
            return fn(*args)

    def join(self) -> None:
        for stream in self.streams:
            torch.cuda.current_stream(stream.device).wait_stream(stream)
