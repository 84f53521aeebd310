"""The CUDA stream a run's device work goes on."""

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
