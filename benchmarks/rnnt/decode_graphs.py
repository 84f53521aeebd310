"""Greedy decoding's steps replayed as a CUDA graph (``decode-graphs``).

A step of :func:`benchmarks.rnnt.decoding.advance` is many small kernels (the joint, the
prediction network's one-step LSTM, the selects) launched from the host, and a batch takes one
step per encoder frame and one per label emitted: 5.8x as fast replayed at batch 256 on one
H100 (docs/performance.md, RNN-T). Here ``unroll`` steps are captured as one graph
on a :class:`Search` of fixed shape: the batch padded to the most rows met so far (padding
rows have length 0, done from the start) and the encoder output to a power of two of frames
(at least ``MIN_FRAMES``); a batch that needs more is captured again, so an evaluation sorted
by duration captures a few times. A done row goes through a step unchanged, so the host asks
whether every row is done once per replay, and the labels are those of the eager loop,
:func:`benchmarks.rnnt.decoding.greedy_decode`, the reference. The graph reads the model's
weights where they are: the moving average's updates in place reach it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.rnnt.decoding import (
    MAX_SYMBOLS,
    MAX_SYMBOLS_PER_STEP,
    Search,
    TransducerModel,
    advance,
    eval_mode,
)
from common.cuda_graph import side_stream, uncached_autocast
from common.optimisations import Optimisation

UNROLL = 16       # steps a replay
MIN_FRAMES = 64
WARMUP_STEPS = 3


class GraphedDecoder:
    """``decoder(feats, feat_lens)`` -> token ids of each utterance, as :func:`greedy_decode`
    gives them. Graphs replay the autocast state of their capture: call under the same one."""

    def __init__(self, model: TransducerModel, blank: int, max_symbols: int = MAX_SYMBOLS,
                 max_symbols_per_step: int = MAX_SYMBOLS_PER_STEP, unroll: int = UNROLL):
        self.model, self.blank, self.unroll = model, blank, unroll
        self.max_symbols, self.max_symbols_per_step = max_symbols, max_symbols_per_step
        self.search: Search | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.captures = 0

    def _steps(self, s: Search, n: int) -> None:
        for _ in range(n):
            advance(self.model, s, self.blank, self.max_symbols, self.max_symbols_per_step)

    def _capture(self, fresh: Search) -> None:
        self.graph = self.search = None       # the old graph's memory goes back first
        self.search = fresh.clone()
        stream = side_stream(fresh.enc.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), uncached_autocast():
            self._steps(fresh.clone(), WARMUP_STEPS)
            stream.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: the evaluation loader's pinning thread allocates host memory
            # during the capture, which would void a capture in the default (global) mode
            with torch.cuda.graph(self.graph, stream=stream, capture_error_mode="thread_local"):
                self._steps(self.search, self.unroll)
        torch.cuda.current_stream().wait_stream(stream)
        self.captures += 1

    @torch.no_grad()
    def __call__(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> list[list[int]]:
        with eval_mode(self.model):
            enc, enc_lens = self.model.encode(feats, feat_lens)
            (B, T), held = enc.shape[:2], self.search
            rows, frames = B, max(MIN_FRAMES, 1 << (T - 1).bit_length())
            if held is not None:
                rows, frames = max(rows, len(held.enc)), max(frames, held.enc.shape[1])
            enc = F.pad(enc, (0, 0, 0, frames - T, 0, rows - B))
            fresh = Search.start(self.model, enc, F.pad(enc_lens.to(enc.device), (0, rows - B)),
                                 self.max_symbols)
            if held is None or held.enc.shape != enc.shape or held.enc.dtype != enc.dtype:
                self._capture(fresh)
            self.search.copy_(fresh)
            while not bool(self.search.done.all()):
                self.graph.replay()
            return self.search.hypotheses()[:B]


def apply(wl, _) -> None:
    wl.decode = GraphedDecoder(wl.ema_model, wl.ema_model.blank, wl.hp.max_symbols)


OPTIMISATION = Optimisation(
    "decode-graphs", "evaluation's greedy decoding steps as a CUDA graph of 16 steps "
    "(benchmarks/rnnt/decode_graphs.py)", apply=apply, cuda=True, compare=None,
    tested_by="tests/benchmarks/rnnt/test_decode_graphs.py (evaluation, not the step)")
