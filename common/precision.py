"""Precision modes: fp32, tf32, amp-bf16 and amp-fp16 (with dynamic loss scaling)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

PRECISIONS = ("fp32", "tf32", "amp-bf16", "amp-fp16")


@dataclass(frozen=True)
class Precision:
    name: str
    device_type: str

    def __post_init__(self):
        if self.name not in PRECISIONS:
            from common.errors import UserError
            raise UserError(f"unknown precision {self.name!r}: "
                            f"choose one of {', '.join(PRECISIONS)}")

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(self.name)

    @property
    def needs_loss_scaling(self) -> bool:
        return self.name == "amp-fp16"

    def apply_backend_flags(self) -> None:
        """TF32 matmuls/convolutions only in tf32 mode; strict fp32 otherwise."""
        tf32 = self.name == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32

    def autocast(self):
        dtype = self.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A loss scaler that is a pass-through unless the mode is amp-fp16."""
        return torch.amp.GradScaler(self.device_type, enabled=self.needs_loss_scaling)
