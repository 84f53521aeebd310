"""Model-FLOPs utilisation (MFU) of the throughput tools: the model's training FLOPs per sample
times samples/s over the bf16 matmul peak measured on the same GPU (``common.bench.probe``),
whatever precision a variant runs in.

FLOPs per sample are the workload's formula (``Workload.flops_per_sample``) where it has one.
Where the work depends on the data (detection's proposals and RoIs, RNN-T's utterance and
label lengths), torch's FlopCounterMode counts them on one eager training step of the plain
workload (no optimisation: some pad or reshape the work) on the tool's batch. Every variant of
a tool, a library baseline of the same network too, does that work and shares the figure. On
the CPU no bf16 matmul peak means anything: MFU is n/a there.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch.utils.flop_counter import FlopCounterMode

from common.bench.probe import peak_tflops

aten = torch.ops.aten
FORMULA, COUNTED = "formula", "counted at this batch"


def rnn_flops(passes: int, input_shape, weights) -> int:
    """A fused RNN kernel's FLOPs: 2 per weight of each matrix and time step of each sequence
    (``input_shape`` less its features); ``passes`` 1 forward, 2 backward (input and weight
    gradients)."""
    steps = math.prod(input_shape[:-1])
    return passes * 2 * steps * sum(math.prod(w) for w in weights if len(w) == 2)


# FlopCounterMode has no formula for the fused LSTM kernels behind nn.LSTM (oneDNN on the CPU,
# cuDNN on the GPU): without these, RNN-T's LSTMs would count nothing
RNN_FLOPS = {
    aten.mkldnn_rnn_layer: lambda x, w_ih, w_hh, *_, **__: rnn_flops(1, x, (w_ih, w_hh)),
    aten.mkldnn_rnn_layer_backward: lambda x, w_ih, w_hh, *_, **__: rnn_flops(2, x, (w_ih, w_hh)),
    aten._cudnn_rnn: lambda x, weights, *_, **__: rnn_flops(1, x, weights),
    aten._cudnn_rnn_backward: lambda x, weights, *_, **__: rnn_flops(2, x, weights),
}


def count_flops(fn: Callable, batch, samples: int) -> float:
    """FLOPs per sample of one eager call ``fn(*batch)`` on a batch of ``samples``
    (``torch.compile``-d code runs eagerly here, so the count sees every op and the counting
    mode never reaches Dynamo's first compilation)."""
    with (torch.compiler.set_stance("force_eager"),
          FlopCounterMode(display=False, custom_mapping=RNN_FLOPS) as counter):
        fn(*batch)
    return counter.get_total_flops() / samples


@dataclass(frozen=True)
class MFU:
    """A tool's FLOPs per sample, where they come from (``FORMULA`` or ``COUNTED``), the bf16
    peak in TFLOP/s per GPU (None on the CPU) and the GPUs a rate is spread over."""
    flops_per_sample: float
    flops_from: str
    peak_tflops: float | None
    gpus: int = 1

    @classmethod
    def measure(cls, plain: Callable[[], tuple], device: torch.device, gpus: int = 1) -> MFU:
        """``device``'s bf16 peak, then the FLOPs per sample of the ``(workload, batch)`` that
        ``plain()`` builds without optimisations: its formula, else counted on one training
        step on that batch. Both are freed, with their device memory, before this returns."""
        peak = peak_tflops("amp-bf16", device) if device.type == "cuda" else None
        wl, batch = plain()
        if wl.flops_per_sample is None:
            flops, source = count_flops(wl.train_step, batch, batch[0].shape[0]), COUNTED
        else:
            flops, source = wl.flops_per_sample, FORMULA
        del wl, batch
        gc.collect()    # workloads sit in reference cycles
        torch.cuda.empty_cache()
        return cls(flops, source, peak, gpus)

    def counted(self, step: Callable, batch) -> MFU:
        """This MFU with the FLOPs per sample counted on one call of ``step`` on ``batch``:
        for a variant that does other work (another network, evaluation)."""
        return replace(self, flops_per_sample=count_flops(step, batch, batch[0].shape[0]),
                       flops_from=COUNTED)

    def __call__(self, samples_per_second: float) -> float | None:
        if self.peak_tflops is None:
            return None
        return (self.flops_per_sample * samples_per_second
                / (self.gpus * self.peak_tflops * 1e12))

    def row(self, samples_per_second: float) -> dict:
        """The fields of a variant's row in a tool's JSON."""
        return {"mfu": self(samples_per_second), "flops_per_sample": self.flops_per_sample,
                "flops_from": self.flops_from, "bf16_peak_tflops": self.peak_tflops}

    def text(self, samples_per_second: float) -> str:
        mfu = self(samples_per_second)
        return "MFU n/a on CPU" if mfu is None else f"MFU {100 * mfu:4.1f}%"

    def __str__(self) -> str:
        peak = ("no bf16 peak on the CPU: MFU n/a" if self.peak_tflops is None else
                f"over the measured bf16 matmul peak, {self.peak_tflops:.0f} TFLOP/s per GPU")
        return (f"MFU: {self.flops_per_sample / 1e9:.2f} GFLOP per sample ({self.flops_from}), "
                f"{peak}")
