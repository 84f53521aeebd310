"""Python's cyclic garbage collector in a training process: its pauses, and a switch that
puts what setup built out of its reach.

A full collection walks every object the collector tracks. Once Inductor is imported that
is some 400,000 objects, and one full collection took 158-184 ms on the 2-core
development machine. In a data-parallel step every rank waits in the gradient all-reduce
for the slowest one, so a pause on any rank stalls all of them, and with N ranks the
stalls come about N times as often.

``freeze`` (``--gc-freeze``) collects once, then moves every object still alive into the
collector's permanent generation (``gc.freeze``). Later collections skip those objects,
and they are never freed as cyclic garbage: the model, the compiled code, the loaders,
everything setup made. The plain path leaves the collector as Python sets it.
"""

from __future__ import annotations

import gc
import time


def freeze() -> int:
    """Collect, then freeze every object still alive; how many are frozen now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class PauseMeter:
    """The collector's pauses while the ``with`` block runs (any thread's): collections of
    each generation, their total and their longest time."""

    def __init__(self):
        self.counts = [0, 0, 0]
        self.seconds = self.longest = 0.0
        self._began: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            took, self._began = time.perf_counter() - self._began, None
            self.counts[info["generation"]] += 1
            self.seconds += took
            self.longest = max(self.longest, took)

    def __enter__(self) -> PauseMeter:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        return {"collections": sum(self.counts), "full": self.counts[2],
                "ms": self.seconds * 1e3, "longest_ms": self.longest * 1e3}
