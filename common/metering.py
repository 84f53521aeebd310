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
