"""Precision modes: fp32, tf32, amp-bf16 and amp-fp16 (with dynamic loss scaling).

Two loss scalers: ``torch.amp.GradScaler`` (``Precision.grad_scaler``), whose ``step``
reads the overflow flag on the host, and ``DeviceLossScaler``
(``Precision.device_loss_scaler``), the same dynamic scaling with its state and
overflow flag kept on the device, so a step using it can be captured in a CUDA graph.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from common.norms import stacked_norms

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

    def device_loss_scaler(self, device: torch.device | str) -> DeviceLossScaler:
        """A host-sync free loss scaler that is a pass-through unless the mode is amp-fp16."""
        return DeviceLossScaler(device, enabled=self.needs_loss_scaling)


def grad_scaler_state(scaler: torch.amp.GradScaler, device: torch.device) -> list[torch.Tensor]:
    """A ``GradScaler``'s tensors (scale, growth tracker) for ``Workload.training_state``;
    none when it is disabled. They exist only after a first ``scale()``, so one is made."""
    if not scaler.is_enabled():
        return []
    scaler.scale(torch.zeros((), device=device))
    return [scaler._scale, scaler._growth_tracker]


class DeviceLossScaler:
    """Dynamic loss scaling as ``torch.amp.GradScaler`` does it, without host syncs.

    The scale and growth tracker are 0-dim tensors on ``device``.
    ``unscale`` returns the unscaled gradients and the overflow flag as a device tensor
    (1.0: some gradient was inf/nan, and every unscaled gradient is zero) for the
    optimizer to skip the step with; ``update`` then backs the scale off or grows it in
    place.
    """

    def __init__(self, device: torch.device | str, enabled: bool, init_scale: float = 2.**16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self.device = torch.device(device)
        self.enabled = enabled
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.loss_scale = torch.full((), init_scale, dtype=torch.float32, device=self.device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=self.device)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.loss_scale if self.enabled else loss

    def unscale(self, grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``grads`` divided by the scale, as new tensors, and the overflow flag.

        The flag is a 0-dim device tensor: 1.0 when some gradient holds inf/nan (every
        returned gradient is then zero), else 0.0. ``grads`` are left as they are, so a
        compiled update fuses the division into the optimizer's reads instead of writing
        each gradient back.
        """
        if not self.enabled:
            return list(grads), torch.zeros((), device=self.device)
        inverse = self.loss_scale.reciprocal()
        finite = []
        for dtype in dict.fromkeys(g.dtype for g in grads):
            largest = stacked_norms([g for g in grads if g.dtype == dtype], float("inf"))
            # unscaled and rounded as the division below rounds: inf where a gradient holds
            # inf/nan, or where dividing overflows (the scale falls below 1 after back-offs)
            finite.append((largest * inverse).to(dtype).isfinite().all())
        overflow = ~torch.stack(finite).all()
        unscaled = torch._foreach_mul(grads, inverse)
        # Zeroed, the gradients of a skipped step cannot turn the optimizer's math into nan.
        for g in unscaled:
            g.masked_fill_(overflow, 0.0)
        return unscaled, overflow.float()

    def update(self, found_inf: torch.Tensor) -> None:
        if self.enabled:
            torch._amp_update_scale_(self.loss_scale, self.growth_tracker, found_inf,
                                     self.growth_factor, self.backoff_factor,
                                     self.growth_interval)

