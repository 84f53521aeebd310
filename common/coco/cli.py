"""The flags the COCO workloads (SSD, Mask R-CNN) share, and reading the ImageNet backbone
checkpoint they both start from."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from common.coco.evaluation import BACKENDS
from common.errors import UserError, one_line
from common.hparams import checked, non_negative


def add_args(p: argparse.ArgumentParser, backbone: str) -> None:
    """``--workers``, ``--scoring`` and ``--backbone-checkpoint`` (weights of torchvision's
    ``backbone``, e.g. ``resnet34``)."""
    p.add_argument("--workers", type=checked(int, non_negative),
                   default=4, help="loader processes per rank")
    p.add_argument("--scoring", default="pycocotools", choices=BACKENDS,
                   help="COCO evaluator (faster-coco-eval: the same statistics, faster)")
    p.add_argument("--backbone-checkpoint", type=Path,
                   help=f"ImageNet weights in torchvision's {backbone} state-dict format "
                        "(default: random initialisation)")


def load_backbone(path: Path, backbone: str,
                  load: Callable[[Mapping[str, torch.Tensor]], None]) -> None:
    """``load(state dict)`` of the checkpoint at ``path``; anything that is not torchvision's
    ``backbone`` state dict, or that ``load`` refuses, is one :class:`UserError` naming the
    file and how to save the expected one."""
    save = (f"save one with torch.save(torchvision.models.{backbone}(weights='IMAGENET1K_V1')"
            ".state_dict(), PATH)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UserError(f"{path}: not a torch state dict ({type(exc).__name__}: "
                        f"{one_line(exc)[:200]}); {save}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise UserError(f"{path}: not a state dict of tensors; {save}")
    try:
        load(state)
    except Exception as exc:
        raise UserError(f"{path}: not a torchvision {backbone} state dict "
                        f"({type(exc).__name__}: {one_line(exc)[:300]}); {save}") from None
