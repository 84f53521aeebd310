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

A step of the whole batch (:func:`advance`) works in place on a :class:`Search` and never
reads a value back to the host: a done row goes through it unchanged, so the host only asks
whether every row is done. ``decode-graphs`` (:mod:`benchmarks.rnnt.decode_graphs`) replays
those steps as a CUDA graph; :func:`greedy_decode` runs them eagerly and is its reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
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


@dataclass
class Search:
    """A batch's decoding so far, one row per utterance: the encoder output ``enc [B, T, H]``
    and lengths, the frame each row is on and the labels it emitted there, its labels
    ``tokens [B, max_symbols]`` (``count`` of them), whether it is done, and the prediction
    network's last label, output and state."""

    enc: torch.Tensor
    enc_lens: torch.Tensor
    time: torch.Tensor
    on_frame: torch.Tensor
    tokens: torch.Tensor
    count: torch.Tensor
    done: torch.Tensor
    last: torch.Tensor
    pred: torch.Tensor
    state: State

    @classmethod
    def start(cls, model: TransducerModel, enc: torch.Tensor, enc_lens: torch.Tensor,
              max_symbols: int) -> Search:
        B, device = len(enc), enc.device
        enc_lens = enc_lens.to(device)
        time = torch.zeros(B, dtype=torch.long, device=device)
        last = torch.full((B,), START, dtype=torch.long, device=device)
        pred, state = model.predict_step(last, None)
        return cls(enc, enc_lens, time, torch.zeros_like(time),
                   torch.zeros(B, max_symbols, dtype=torch.long, device=device),
                   torch.zeros_like(time), time >= enc_lens, last,
                   pred.clone(), tuple(s.clone() for s in state))

    def tensors(self) -> list[torch.Tensor]:
        *plain, state = (getattr(self, f.name) for f in fields(self))
        return [*plain, *state]

    def clone(self) -> Search:
        *plain, h, c = (t.clone() for t in self.tensors())
        return Search(*plain, (h, c))

    def copy_(self, other: Search) -> None:
        """Takes ``other``'s values into these tensors (of the same shapes)."""
        for mine, theirs in zip(self.tensors(), other.tensors()):
            mine.copy_(theirs)

    def hypotheses(self) -> list[list[int]]:
        return [row[:n].tolist() for row, n in zip(self.tokens.cpu(), self.count.tolist())]


def advance(model: TransducerModel, s: Search, blank: int, max_symbols: int,
            max_symbols_per_step: int) -> None:
    """One step of every row, in place and without a host sync: the joint of its frame and
    prediction picks a label; a blank (or the per-frame limit) moves it to the next frame, a
    label is kept and fed to the prediction network. A done row is left as it is."""
    rows = torch.arange(len(s.enc), device=s.enc.device)
    frame = s.enc[rows, s.time.clamp(max=s.enc.shape[1] - 1)]
    best = model.joint_step(frame, s.pred).argmax(-1)
    emit = (best != blank) & ~s.done
    slot = s.count.clamp(max=max_symbols - 1)
    s.tokens[rows, slot] = torch.where(emit, best, s.tokens[rows, slot])
    s.count += emit
    s.on_frame += emit
    label = torch.where(emit, best, s.last)
    pred, state = model.predict_step(label, s.state)
    s.pred.copy_(torch.where(emit[:, None], pred, s.pred))
    for old, new in zip(s.state, state):
        old.copy_(torch.where(emit[None, :, None], new, old))
    s.last.copy_(label)
    moves = ~s.done & (~emit | (s.on_frame >= max_symbols_per_step))
    s.time += moves
    s.on_frame.masked_fill_(moves, 0)
    s.done |= (s.time >= s.enc_lens) | (s.count >= max_symbols)


@contextmanager
def eval_mode(model: TransducerModel) -> Iterator[None]:
    """``model`` in eval mode, its training flag given back afterwards."""
    was_training = model.training
    model.train(False)
    try:
        yield
    finally:
        model.train(was_training)


@torch.no_grad()
def greedy_decode(model: TransducerModel, feats: torch.Tensor, feat_lens: torch.Tensor,
                  blank: int, max_symbols: int = MAX_SYMBOLS,
                  max_symbols_per_step: int = MAX_SYMBOLS_PER_STEP) -> list[list[int]]:
    """Token ids (blank excluded) of each utterance of ``feats [B, T, F]``; the model runs in
    eval mode and gets its training flag back afterwards."""
    with eval_mode(model):
        s = Search.start(model, *model.encode(feats, feat_lens), max_symbols)
        while not bool(s.done.all()):
            advance(model, s, blank, max_symbols, max_symbols_per_step)
        return s.hypotheses()
