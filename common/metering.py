"""Throughput and device-memory metering."""

from __future__ import annotations

import time

import torch


class Throughput:
    """Counts samples over wall time; ``sync`` waits for the device before reading the clock."""

    def __init__(self, device: torch.device | None = None):
        self.device = device
        self.samples = 0
        self.seconds = 0.0
        self._t0: float | None = None

    def _sync(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def stop(self, samples: int) -> float:
        """Close the interval opened by ``start``, ``samples`` processed; returns its seconds."""
        if self._t0 is None:
            raise RuntimeError("Throughput.stop() without start()")
        self._sync()
        dt = time.perf_counter() - self._t0
        self._t0 = None
        self.samples += samples
        self.seconds += dt
        return dt

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak bytes allocated on a CUDA device since the last reset (0 on the CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return 0


ALLOCATOR_CALLS = {"num_device_alloc": "cudaMalloc", "num_device_free": "cudaFree",
                   "num_alloc_retries": "retries"}


class AllocatorCalls:
    """How often the CUDA caching allocator went to the driver between ``__init__`` and
    ``stop``: its ``cudaMalloc`` and ``cudaFree`` calls and its retries (an allocation that
    failed, freed the cache and synchronised the device). Each may take milliseconds, and
    on several GPUs every rank waits for it. Two reads of the allocator's statistics, so it
    costs the steps nothing; all zeros on the CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self._start = self._read()

    def _read(self) -> dict[str, int]:
        if self.device.type != "cuda":
            return dict.fromkeys(ALLOCATOR_CALLS.values(), 0)
        stats = torch.cuda.memory_stats(self.device)
        return {name: int(stats.get(key, 0)) for key, name in ALLOCATOR_CALLS.items()}

    def stop(self) -> dict[str, int]:
        """The calls of each kind since ``__init__``."""
        end = self._read()
        return {name: end[name] - self._start[name] for name in end}
