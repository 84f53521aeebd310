"""Mask R-CNN's optimisations over the reference path, in their order of application; none
named, the workload trains as the MLPerf reference does. Each changes speed, not the result
(to rounding where its tolerance says so)."""

from __future__ import annotations

import torch

from benchmarks.maskrcnn import (
    aligned_outputs,
    before_sync,
    compiled,
    conv_relu,
    device_rle,
    frozen_bn,
    stem,
    topk,
)
from common.hparams import checked, positive
from common.optimisations import COMPILE, Optimisation, Registry, shared
from common.streams import SideStreams


def _triton_nms(wl, _value) -> None:
    from benchmarks.maskrcnn import nms_triton  # Triton: GPU machines only

    wl.detector.rpn.nms_keep = wl.detector.nms_keep = nms_triton.nms_keep


def _triton_roi_align(wl, _value) -> None:
    from benchmarks.maskrcnn import roi_align_triton  # Triton: GPU machines only

    for pooler in (wl.net.box_features.pooler, wl.net.mask_features.pooler):
        pooler.align = roi_align_triton.roi_align_levels


def _roi_multiple(head: int):
    def apply(wl, multiple: int) -> None:
        wl.detector.roi_multiples[head] = multiple
    return apply


REGISTRY = Registry(
    Optimisation("topk-chunks", "the RPN's pre-NMS top-K in two stages over N chunks "
                 "(NVIDIA's split top-K, 4; topk.py)", apply=topk.apply,
                 value_type=checked(int, positive), default=topk.SPLIT_TOPK_CHUNKS),
    Optimisation("channels-last", "images and networks in channels-last memory (cuDNN's NHWC "
                 "kernels without layout conversions)",
                 select=lambda wl, _: setattr(wl.impl, "memory_format", torch.channels_last)),
    Optimisation("fold-frozen-bn", "each backbone convolution and its frozen batch norm as one "
                 "convolution, in the autocast dtype (frozen_bn.py)",
                 apply=lambda wl, _: frozen_bn.fold(wl.net.backbone)),
    Optimisation("fused-conv-relu", "each convolution followed by a ReLU (backbone, RPN head, "
                 "mask head) as one cuDNN kernel, the adds and ReLU in its epilogue "
                 "(conv_relu.py)", apply=lambda wl, _: conv_relu.fuse(wl.net),
                 requires=("fold-frozen-bn",), cuda=True, rtol=1e-4),
    Optimisation("space-to-depth", "the stem's 7x7 stride-2 convolution as a 4x4 one over 2x2 "
                 "pixel blocks (stem.py)", requires=("fold-frozen-bn",),
                 apply=lambda wl, _: stem.over_blocks(wl.net.backbone,
                                                      "fused-conv-relu" in wl.opts)),
    Optimisation("aligned-outputs", "the RPN's, box predictor's and mask predictor's output "
                 "counts padded to multiples of 8, each head's as one GEMM "
                 "(aligned_outputs.py)", apply=lambda wl, _: aligned_outputs.align(wl.net),
                 rtol=5e-5),
    Optimisation("nms-triton", "NMS's greedy step as one Triton kernel without host syncs "
                 "(nms_triton.py)", apply=_triton_nms, cuda=True),
    Optimisation("roi-align-triton", "the box and mask heads' RoIAlign as a Triton kernel whose "
                 "backward adds into one fp32 table per level (roi_align_triton.py)",
                 apply=_triton_roi_align, cuda=True, rtol=1e-3),
    Optimisation("fused-sgd", "the SGD update as PyTorch's fused kernel (common/sgd.py)",
                 apply=lambda wl, _: setattr(wl.optimizer, "fused", True)),
    device_rle.OPTIMISATION,
    Optimisation("loss-streams", "the RPN, box and mask losses each on a CUDA stream of its own "
                 "beside the rest of the forward", cuda=True, apply=lambda wl, _: setattr(
                     wl.detector, "streams", SideStreams(wl.env.device, 3))),
    Optimisation("box-roi-multiple", "the box head on its RoI count rounded up to a multiple "
                 "of N (copies of the last RoI, dropped after)", apply=_roi_multiple(0),
                 value_type=checked(int, positive), default=512),
    Optimisation("mask-roi-multiple", "the mask head on its RoI count rounded up to a multiple "
                 "of N (padding RoIs, left out of the loss): few convolution shapes, so "
                 "cuDNN's plans are reused", apply=_roi_multiple(1),
                 value_type=checked(int, positive), default=128),
    # three steps' losses: 1.3e-7 apart on the CPU, 2.2e-5 on an H200 in strict fp32
    shared(COMPILE, apply=compiled.apply, rtol=1e-4, description="torch.compile the backbone "
           "+ FPN + RPN head, the box head and the mask head, each a region (=MODE; "
           "compiled.py)"),
    Optimisation("compile-losses", "also compile the RPN's targets, sampling and loss, the box "
                 "loss and the mask targets and loss (compiled.py)",
                 apply=compiled.apply_losses, requires=("compile",), compare=None,
                 # compiled, the anchors' and RoIs' random keys are drawn otherwise: compared
                 # with Inductor drawing them as eager does (fallback_random)
                 tested_by="tests/benchmarks/maskrcnn/test_compile.py"),
    Optimisation("compile-proposals", "also compile the RPN's proposal selection before and "
                 "after NMS (compiled.py)", apply=compiled.apply_proposals,
                 requires=("compile",), rtol=5e-5),
    Optimisation("backbone-graphs", "replay the compiled backbone region's forward and backward "
                 "as CUDA graphs, one per padded size (compiled.py)",
                 apply=compiled.apply_backbone_graphs, requires=("compile",), cuda=True),
    Optimisation("head-graphs", "replay the compiled box and mask heads as CUDA graphs in "
                 "training, one per RoI count and padded size (compiled.py)",
                 apply=compiled.apply_head_graphs,
                 requires=("box-roi-multiple", "mask-roi-multiple", "compile"), cuda=True),
    Optimisation("box-head-before-sync", "run the box head and its loss on a bound of the "
                 "sampled RoIs before the host reads the sampler's counts (before_sync.py)",
                 apply=before_sync.apply_box_head),
    Optimisation("backward-before-sync", "also queue the RPN's and box losses' backward before "
                 "the host waits for the sampler's counts (before_sync.py)",
                 apply=before_sync.apply_backward, requires=("box-head-before-sync",),
                 single_process=True),
)
