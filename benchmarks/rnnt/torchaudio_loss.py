"""The padded grid's loss by ``torchaudio.functional.rnnt_loss`` (``torchaudio-loss``), the
library a user would call, in place of :func:`benchmarks.rnnt.loss.transducer_loss`.
torchaudio's CUDA kernel (``ComputeBetasCosts``) writes an utterance's cost from its beta
variables, which it walks over the cells ``t <= T - 2``, ``u <= U - 1`` only: an utterance
without labels (``U = 0``) or of one encoder step has no such cell, and its cost is left
unwritten (1.4e17 against the reference on the GPU), its gradient read from unwritten betas.
Each of those has a single alignment; their loss is the reference path's here.
"""

from __future__ import annotations

import torch

from benchmarks.rnnt.loss import reduce_losses, transducer_loss
from common.optimisations import Optimisation


def _rnnt_loss(logits: torch.Tensor, enc_lens: torch.Tensor, labels: torch.Tensor,
               label_lens: torch.Tensor, blank: int) -> torch.Tensor:
    # imported here: torchaudio cannot load on the CPU machines
    import torchaudio.functional

    # torchaudio wants the grid exactly as large as the longest utterance, in fp32 or fp16
    T, U = int(enc_lens.max()), int(label_lens.max())
    logits = logits[:, :T, :U + 1]
    logits = logits.float() if logits.dtype == torch.bfloat16 else logits.contiguous()
    return torchaudio.functional.rnnt_loss(
        logits, labels[:, :U].int().contiguous(), enc_lens.int(), label_lens.int(),
        blank=blank, reduction="none")


def torchaudio_loss(logits: torch.Tensor, enc_lens: torch.Tensor, labels: torch.Tensor,
                    label_lens: torch.Tensor, blank: int = -1, reduction: str = "mean"
                    ) -> torch.Tensor:
    """:func:`benchmarks.rnnt.loss.transducer_loss`'s contract."""
    blank %= logits.shape[-1]
    single = (label_lens == 0) | (enc_lens == 1)   # one alignment: no cost from torchaudio
    if not bool(single.any()):
        return reduce_losses(_rnnt_loss(logits, enc_lens, labels, label_lens, blank),
                             reduction)
    nll = torch.zeros(len(logits), device=logits.device,
                      dtype=torch.promote_types(logits.dtype, torch.float32))
    nll = nll.index_put((single,), transducer_loss(
        logits[single], enc_lens[single], labels[single], label_lens[single], blank, "none"))
    if not bool(single.all()):
        rest = ~single
        nll = nll.index_put((rest,), _rnnt_loss(logits[rest], enc_lens[rest], labels[rest],
                                                label_lens[rest], blank).to(nll.dtype))
    return reduce_losses(nll, reduction)


def apply(wl, _) -> None:
    wl.train_loss.loss = torchaudio_loss


OPTIMISATION = Optimisation(
    "torchaudio-loss", "the padded grid's loss by torchaudio.functional.rnnt_loss "
    "(benchmarks/rnnt/torchaudio_loss.py)", apply=apply, cuda=True,
    excludes=("packed-joint", "fused-loss", "compiled-loss", "triton-lattice"), compare=None,
    tested_by="tests/benchmarks/rnnt/test_loss.py (the tiny config's joint is packed)")
