"""Evaluation scoring in a separate process while training goes on.

A workload whose ``scorer`` is set splits evaluation in two: ``eval_outputs()``
(forward passes, gathered on rank 0) runs in the training processes, and the
scorer (COCO evaluation takes minutes on the real dataset) runs in one spawned
process on rank 0's host. The driver polls at its loss read-backs; every rank
learns the same results at the same step, so all stop together.

The scorer process reads its tasks from one queue and writes results to another; the
trainer never takes a lock that process holds, so a signal that kills it (a scheduler's
SIGTERM reaches the whole process group) cannot leave the trainer waiting on it. (A
``multiprocessing.Pool`` worker waits for tasks holding a lock its pool's ``terminate``
takes: killed there, it blocked the trainer's shutdown for good.) The outputs cross as
pickled bytes: tensors put on a queue as such would have their memory shared through a
server thread in the trainer that a killed scorer process leaves failing.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import signal
from collections import deque
from collections.abc import Callable

from common import dist
from common.workload import EvalPoint

POLL_S = 1.0   # how often a blocking wait checks that the scorer process still lives


def _serve(scorer: Callable, tasks, results) -> None:
    """The scorer process: score each task's outputs in turn; a failure is sent as text.
    SIGINT is ignored (a Ctrl-C reaches the whole process group; the trainer stops this
    process), SIGTERM ends it quietly."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while (outputs := tasks.get()) is not None:
        try:
            results.put(scorer(pickle.loads(outputs)))
        except Exception as exc:  # reported on every rank by the trainer
            results.put(f"{type(exc).__name__}: {exc}")


class BackgroundScorer:
    def __init__(self, scorer: Callable, env: dist.DistEnv):
        self.env = env
        self.pending: deque[EvalPoint] = deque()   # submitted, result not yet taken (all ranks)
        self._proc = None
        if env.is_main:
            # spawn, not fork: the training process holds CUDA, NCCL and loader threads
            ctx = multiprocessing.get_context("spawn")
            self._tasks, self._results = ctx.Queue(), ctx.Queue()
            self._proc = ctx.Process(target=_serve, args=(scorer, self._tasks, self._results),
                                     name="background-scorer", daemon=True)
            self._proc.start()

    def submit(self, point: EvalPoint, outputs) -> None:
        self.pending.append(point)
        if self._proc is not None:
            # a feeder thread sends them: training goes on
            self._tasks.put(pickle.dumps(outputs, protocol=pickle.HIGHEST_PROTOCOL))

    def _next(self, block: bool):
        """Rank 0: the oldest result not yet taken, None if none has arrived (``block``:
        wait for it). A dead scorer process is a failed scoring."""
        while True:
            try:
                return self._results.get(timeout=POLL_S) if block else self._results.get_nowait()
            except queue.Empty:
                if not self._proc.is_alive():
                    return (f"the scorer process ended (exit code {self._proc.exitcode}) "
                            f"before it sent this result")
                if not block:
                    return None

    def poll(self, block: bool = False) -> list[tuple[EvalPoint, dict]]:
        """The results that have arrived, in evaluation order (the same list on every rank);
        ``block``: wait for the oldest one first. A failed scoring raises on every rank."""
        if not self.pending:
            return []
        arrived = []
        if self.env.is_main:
            while len(arrived) < len(self.pending):
                metrics = self._next(block and not arrived)
                if metrics is None:
                    break
                arrived.append(metrics)
                if isinstance(metrics, str):
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
        """Stop any scoring still running (the run has ended); its results are dropped."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
            # the feeder thread may still hold outputs the process never read: drop them
            self._tasks.cancel_join_thread()
            for q in (self._tasks, self._results):
                q.close()
            self._proc = None
