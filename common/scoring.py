"""Evaluation scoring in a separate process while training goes on.

A workload whose ``scorer`` is set splits evaluation in two: ``eval_outputs()``
(forward passes, gathered on rank 0) runs in the training processes, and the
scorer (COCO evaluation takes minutes on the real dataset) runs in one spawned
process on rank 0's host. The driver polls at its loss read-backs; every rank
learns the same results at the same step, so all stop together.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable

from common import dist
from common.workload import EvalPoint


class BackgroundScorer:
    def __init__(self, scorer: Callable, env: dist.DistEnv):
        self.scorer, self.env = scorer, env
        self.pending: deque[EvalPoint] = deque()      # submitted, result not yet taken (all ranks)
        self._results: deque = deque()                # rank 0: AsyncResults in submission order
        # spawn, not fork: the training process holds CUDA, NCCL and loader threads
        self._pool = multiprocessing.get_context("spawn").Pool(1) if env.is_main else None

    def submit(self, point: EvalPoint, outputs) -> None:
        self.pending.append(point)
        if self._pool is not None:
            self._results.append(self._pool.apply_async(self.scorer, (outputs,)))

    def poll(self, block: bool = False) -> list[tuple[EvalPoint, dict]]:
        """The results that have arrived, in evaluation order (the same list on every rank);
        ``block``: wait for the oldest one first. A failed scoring raises on every rank."""
        if not self.pending:
            return []
        arrived = []
        if self.env.is_main:
            while self._results and ((block and not arrived) or self._results[0].ready()):
                try:
                    arrived.append(self._results.popleft().get())
                except Exception as exc:  # reported on every rank, not only here
                    arrived.append(f"{type(exc).__name__}: {exc}")
                    break
        arrived = dist.broadcast_object(arrived)
        out = []
        for metrics in arrived:
            point = self.pending.popleft()
            if isinstance(metrics, str):
                raise RuntimeError(f"background scoring of the evaluation at epoch_num "
                                   f"{point.epoch_num} failed: {metrics}")
            out.append((point, metrics))
        return out

    def close(self) -> None:
        """Stop any scoring still running (the run has ended)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
