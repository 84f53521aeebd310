"""The metering helpers: the CUDA allocator's driver calls counted between two reads."""

import torch

from common import metering


def test_allocator_calls_are_the_difference_of_two_reads(monkeypatch):
    reads = iter([
        {"num_device_alloc": 40, "num_device_free": 3, "num_alloc_retries": 0, "other": 7},
        {"num_device_alloc": 43, "num_device_free": 5, "num_alloc_retries": 1, "other": 9},
    ])
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: next(reads))
    calls = metering.AllocatorCalls(torch.device("cuda", 0))
    assert calls.stop() == {"cudaMalloc": 3, "cudaFree": 2, "retries": 1}


def test_allocator_calls_on_the_cpu_are_none(monkeypatch):
    def no_cuda(device):
        raise AssertionError("read the CUDA allocator for a CPU device")
    monkeypatch.setattr(torch.cuda, "memory_stats", no_cuda)
    calls = metering.AllocatorCalls(torch.device("cpu"))
    assert calls.stop() == {"cudaMalloc": 0, "cudaFree": 0, "retries": 0}
