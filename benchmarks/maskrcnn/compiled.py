"""The detector's regions through ``torch.compile``, and replayed as CUDA graphs.

``compile``: the networks in three regions with shapes of their own (backbone + FPN + RPN
head; box head; mask head); proposal selection, matching and sampling stay eager, as their
sizes depend on the data. The heads' RoI counts and map sizes are marked dynamic from the
first call, so one graph of each serves the whole run; the backbone is compiled for each
padded image size (static kernels: with sizes only known symbolically, Inductor's layout
checks still specialise it to each width), so ``--size-buckets`` keeps its graphs few.

``compile-losses`` also compiles the three losses (the RPN's targets, anchor sampling and
loss; the box head's loss; the mask targets and loss), each a region whose ground-truth, RoI
and positive counts are marked dynamic, compiled anew for each padded size as the backbone
is: in eager mode they are some hundred small kernels a step, each launched from the host,
forward and backward. ``compile-proposals`` compiles the RPN's proposal selection before and
after NMS in the same way (:meth:`benchmarks.maskrcnn.rpn.RPN.compile_selection`).

``backbone-graphs`` replays the compiled backbone region's forward and backward as CUDA
graphs (Inductor's CUDA graph trees), one per padded size: its kernels were launched from the
host every step, and the step was host-bound. ``head-graphs`` does the same for the box and
mask heads in training, one graph per RoI count and padded size (hence the RoI multiples);
evaluation runs the heads compiled, not graphed: its RoI counts (proposals, detections) vary
with every batch, and each new count and size recorded a graph (a dry run's evaluation of 500
images took 45.7 s with graphed heads, 32.7 s without). A step of the graph trees begins at
the detector's forward, not wherever they would guess it from their regions' order: with
``backward-before-sync`` a backward runs between forwards, after which they would free the
backbone's outputs before the mask head.
"""

from __future__ import annotations

import functools

import torch

from common.workload import maybe_compile

RECOMPILE_LIMIT = 64    # compiled backbone graphs: padded sizes x grad modes
GRAPHS = {"triton.cudagraphs": True}


def apply(wl, mode: str) -> None:
    det = wl.detector
    # a graph per padded size and grad mode, more than the default 8
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               RECOMPILE_LIMIT)
    det._backbone = maybe_compile(det._levels_and_rpn, mode, dynamic=False)
    det._heads = tuple(maybe_compile(head, mode) for head in (det._box_head, det._mask_head))


def apply_losses(wl, _value) -> None:
    det = wl.detector
    det._losses = tuple(maybe_compile(fn, wl.opts["compile"], dynamic=False)  # but the counts
                        for fn in det._losses)


def apply_proposals(wl, _value) -> None:
    wl.detector.rpn.compile_selection(wl.opts["compile"])


def _marking_steps(forward, *args):
    torch.compiler.cudagraph_mark_step_begin()
    return forward(*args)


def apply_backbone_graphs(wl, _value) -> None:
    det = wl.detector
    det._backbone = maybe_compile(det._levels_and_rpn, wl.opts["compile"], dynamic=False,
                                  **GRAPHS)
    det.forward = functools.partial(_marking_steps, det.forward)


def apply_head_graphs(wl, _value) -> None:
    det = wl.detector
    det._training_heads = tuple(maybe_compile(head, wl.opts["compile"], **GRAPHS)
                                for head in (det._box_head, det._mask_head))
    if "backbone-graphs" not in wl.opts:
        det.forward = functools.partial(_marking_steps, det.forward)
