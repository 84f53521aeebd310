"""Whole-step CUDA graphs: forward, backward, gradient all-reduce and optimizer in one replay.

``GraphedStep(step)`` runs ``step(*tensors)`` eagerly for a few warm-up calls
on a side stream (so lazily created state such as optimizer buffers and NCCL
communicators exists), captures the next call into one ``torch.cuda.CUDAGraph``
and from then on copies each new batch into the captured input tensors and
replays the graph. Without CUDA, for CPU tensors, or when disabled, it is a
plain eager call: the same ``step`` function is the reference for the graphed one.

A step's arguments may be tensors or any nesting of tuples, lists and dicts of
them (detection targets); other leaves (None, numbers) are passed as they are
and are part of the graph's key. Inputs whose shapes change from batch to batch
(BERT's unpadded token count, rounded to a bucket) get one graph per distinct
set of input shapes, up to ``max_graphs``: a new shape runs once eagerly, then
is captured; one more shape is an error, or with ``eager_beyond`` runs eagerly
(DLRM's exchange capacities: a rare one must not end a run). All graphs share one memory pool,
which is safe because steps never overlap and each step's output is consumed
(queued on the stream) before the next replay.

A capturable step keeps every shape static, never reads a value back to the
host (no ``.item()``, no data-dependent Python branching) and takes changing
scalars such as the learning rate from device tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from common.errors import UserError

# DDP needs 11 eager iterations before capture (see torch.cuda graph notes).
DEFAULT_WARMUP_STEPS = 11
_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream per GPU on which steps are warmed up and captured.

    DDP must be built on this same stream (``common.dist.data_parallel`` does
    so): its gradient hooks then run on the stream the captured backward uses.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def uncached_autocast() -> AbstractContextManager:
    """The current CUDA autocast state with its cache off, for a capture: the cache would
    free the weights' casts that a graph goes on reading at every replay."""
    return torch.autocast("cuda", torch.get_autocast_dtype("cuda"),
                          enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)


@contextmanager
def thread_local_captures() -> Iterator[None]:
    """Captures made inside in ``thread_local`` mode, for ``torch.cuda.make_graphed_callables``,
    which takes no mode and captures in the default ``global`` one: there another thread's
    CUDA call during the capture (a loader's pinned host allocation) voids it. The graphs'
    own captures here pass the mode themselves."""
    graph = torch.cuda.graph
    torch.cuda.graph = partial(graph, capture_error_mode="thread_local")
    try:
        yield
    finally:
        torch.cuda.graph = graph


class _Captured:
    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list, output):
        self.graph, self.inputs, self.output = graph, inputs, output


def _key(leaves: list, spec) -> tuple:
    return (spec, tuple(x.shape if isinstance(x, torch.Tensor) else x for x in leaves))


class GraphedStep:
    def __init__(self, step: Callable[..., torch.Tensor], enabled: bool = True,
                 warmup_steps: int = DEFAULT_WARMUP_STEPS, max_graphs: int = 1,
                 eager_beyond: bool = False):
        self.step, self.eager_beyond = step, eager_beyond
        self.enabled = bool(enabled) and torch.cuda.is_available()
        self.warmup_steps = warmup_steps
        self.max_graphs = max_graphs
        self.graphs: dict[tuple, _Captured] = {}
        self._seen: set[tuple] = set()
        self._calls = 0
        self._pool = None
        self._side_stream = (side_stream(torch.device("cuda", torch.cuda.current_device()))
                             if self.enabled else None)

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def __call__(self, *inputs):
        if not self.enabled:
            return self.step(*inputs)
        leaves, spec = tree_flatten(inputs)
        first = next((x for x in leaves if isinstance(x, torch.Tensor)), None)
        if first is None or first.device.type != "cuda":
            return self.step(*inputs)
        self._calls += 1
        if self._calls <= self.warmup_steps:
            return self._run_on_side_stream(inputs)
        key = _key(leaves, spec)
        captured = self.graphs.get(key)
        if captured is None:
            if len(self.graphs) >= self.max_graphs:
                if self.eager_beyond:
                    return self._run_on_side_stream(inputs)
                shapes = [tuple(x.shape) for x in leaves if isinstance(x, torch.Tensor)]
                raise UserError(f"the training step got input shapes {shapes} beyond its "
                                f"{self.max_graphs} CUDA graph(s): the workload's capture "
                                f"policy allows no more shapes; rerun with --no-cuda-graph")
            if self.graphs and key not in self._seen:  # a new shape runs eagerly once first
                self._seen.add(key)
                return self._run_on_side_stream(inputs)
            captured = self.graphs[key] = self._capture(leaves, spec)
        for static, new in zip(captured.inputs, leaves):
            if isinstance(static, torch.Tensor):
                static.copy_(new, non_blocking=True)
        captured.graph.replay()
        return captured.output

    def release(self) -> None:
        """Destroy the captured graphs (the step runs eagerly again, from its warm-up). Needed
        before the process group is destroyed: ``destroy_process_group`` waits forever while a
        graph that holds NCCL collectives (DDP's all-reduce) is alive (pytorch#115388)."""
        if self.graphs:
            torch.cuda.synchronize()
        for captured in self.graphs.values():
            captured.graph.reset()
        self.graphs.clear()
        self._seen.clear()
        self._calls = 0

    def _run_on_side_stream(self, inputs):
        stream = self._side_stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = self.step(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        return out

    def _capture(self, leaves: list, spec) -> _Captured:
        static = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        torch.cuda.synchronize()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: other threads' CUDA calls during the capture (a loader's pinned
            # host allocations, NCCL's watchdog) are not the step's and must not void it
            with torch.cuda.graph(graph, pool=self._pool, stream=self._side_stream,
                                  capture_error_mode="thread_local"):
                output = self.step(*tree_unflatten(static, spec))
        except RuntimeError as exc:
            first = next((line for line in str(exc).splitlines() if line.strip()), repr(exc))
            raise UserError(f"the training step could not be captured as a CUDA graph "
                            f"({first.strip()}); rerun with --no-cuda-graph") from exc
        torch.cuda.synchronize()
        return _Captured(graph, static, output)


def graphed_step(step: Callable[..., torch.Tensor], policy, requested: bool,
                 device: torch.device, precision: str, name: str) -> GraphedStep:
    """``step`` under the workload's capture policy (``common.workload.CapturePolicy``):
    eager where the policy says never or capture was not asked for, and a one-line error,
    before anything runs, for an amp-fp16 step whose loss scaling cannot be captured."""
    on = requested and device.type == "cuda" and policy.mode != "never"
    if on and precision == "amp-fp16" and not policy.fp16:
        raise UserError(f"{name}'s amp-fp16 loss scaling reads overflow flags on the host and "
                        f"cannot run inside a CUDA graph: add --no-cuda-graph or use amp-bf16")
    return GraphedStep(step, enabled=on, max_graphs=policy.max_graphs,
                       eager_beyond=policy.eager_beyond)
