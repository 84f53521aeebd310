"""Greedy transducer decoding for a whole batch at once, as the MLPerf 1.1 evaluation does it
(mlcommons/training ``rnnt/decoder.py``, ``RNNTGreedyDecoder``; batched like NVIDIA's v1.1
``_greedy_decode_batch``).

Per utterance: at frame ``t`` the joint of the encoder output and the prediction network's
output for the labels so far picks its arg-max; a blank moves to the next frame, a label is
kept and fed to the prediction network (whose state only advances on labels), at most
``max_symbols_per_step`` (the reference's 30) labels per frame. Decoding stops at the end of
the utterance or at ``max_symbols`` labels (``eval_max_prediction_symbols``, 300), kept. The
reference tests that limit only when a frame starts (``len(label) > 300``), so it may keep up
to 330; NVIDIA's batched decoder ends at the 300th label without keeping it (299).
"""

from __future__ import annotations

from typing import Protocol

import torch

from benchmarks.rnnt.model import State

MAX_SYMBOLS = 300
MAX_SYMBOLS_PER_STEP = 30
START = -1


class TransducerModel(Protocol):
    """What decoding needs of a model (:class:`benchmarks.rnnt.model.RNNT` has it)."""

    training: bool

    def train(self, mode: bool = True) -> TransducerModel: ...

    def encode(self, feats: torch.Tensor, feat_lens: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def predict_step(self, labels: torch.Tensor, state: State | None
                     ) -> tuple[torch.Tensor, State]: ...

    def joint_step(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor: ...


def _select(mask: torch.Tensor, new: State, old: State) -> State:
    """Per utterance (dimension 1 of ``h`` and ``c``): ``new`` where ``mask``, else ``old``."""
    return tuple(torch.where(mask[None, :, None], n, o) for n, o in zip(new, old))


@torch.no_grad()
def greedy_decode(model: TransducerModel, feats: torch.Tensor, feat_lens: torch.Tensor,
                  blank: int, max_symbols: int = MAX_SYMBOLS,
                  max_symbols_per_step: int = MAX_SYMBOLS_PER_STEP) -> list[list[int]]:
    """Token ids (blank excluded) of each utterance of ``feats [B, T, F]``; the model runs in
    eval mode and gets its training flag back afterwards."""
    was_training = model.training
    model.train(False)
    try:
        enc, enc_lens = model.encode(feats, feat_lens)
        B = len(enc)
        rows = torch.arange(B, device=enc.device)
        enc_lens = enc_lens.to(enc.device)
        last = torch.full((B,), START, dtype=torch.long, device=enc.device)
        pred, state = model.predict_step(last, None)
        time = torch.zeros(B, dtype=torch.long, device=enc.device)
        on_frame = torch.zeros_like(time)
        tokens = torch.zeros(B, max_symbols, dtype=torch.long, device=enc.device)
        count = torch.zeros_like(time)
        done = time >= enc_lens
        while not bool(done.all()):
            frame = enc[rows, time.clamp(max=enc.shape[1] - 1)]
            best = model.joint_step(frame, pred).argmax(-1)
            emit = (best != blank) & ~done
            if bool(emit.any()):
                tokens[rows[emit], count[emit]] = best[emit]
                count += emit
                on_frame += emit
                new_pred, new_state = model.predict_step(torch.where(emit, best, last), state)
                pred = torch.where(emit[:, None], new_pred, pred)
                state = _select(emit, new_state, state)
                last = torch.where(emit, best, last)
            advance = ~done & (~emit | (on_frame >= max_symbols_per_step))
            time += advance
            on_frame.masked_fill_(advance, 0)
            done |= (time >= enc_lens) | (count >= max_symbols)
        return [row[:n].tolist() for row, n in zip(tokens.cpu(), count.tolist())]
    finally:
        model.train(was_training)
