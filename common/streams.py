"""The CUDA streams a run's device work goes on: the run's own, and side streams beside it."""

from __future__ import annotations

import contextlib

import torch


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
    wait for every call's. Off CUDA the calls run in place.

    Each call's arguments are held until :meth:`join`. A tensor's memory may otherwise be
    written by the current stream while a side stream still reads it: the caching
    allocator's (``record_stream`` would cover that), and also a CUDA graph's output, whose
    memory Inductor's CUDA graph trees give to the graphs they record after it once no Python
    object refers to it, so that their replays write there (``record_stream`` does not
    cover that: a replay allocates nothing)."""

    def __init__(self, device: torch.device, count: int):
        self.streams = ([torch.cuda.Stream(device) for _ in range(count)]
                        if device.type == "cuda" else [])
        self._held = []

    def run(self, index: int, fn, *args):
        """``fn(*args)`` on stream ``index``, its arguments held until :meth:`join`."""
        if not self.streams:
            return fn(*args)
        stream = self.streams[index]
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        self._held.append(args)
        with torch.cuda.stream(stream):
            return fn(*args)

    def join(self) -> None:
        for stream in self.streams:
            torch.cuda.current_stream(stream.device).wait_stream(stream)
        self._held.clear()   # what reuses their memory now runs after the side streams
