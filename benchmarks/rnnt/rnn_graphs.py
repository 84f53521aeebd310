"""The encoder's and the prediction network's LSTMs replayed as CUDA graphs (``rnn-graphs``), one
pair of graphs (forward, backward) per padded input length.

cuDNN launches several kernels per time step and layer from the host, about 10,000 launches in a
training step at 206 encoder steps and 100 labels, the GPU waiting on the host (docs/performance.md,
RNN-T). The lengths change with every batch (duration buckets, speed perturbation), so each input is
padded at its end to a multiple of ``PAD_STEPS`` steps, one graph pair is built per padded shape the
first time it is met (``torch.cuda.make_graphed_callables``; the encoder's graphs share one memory
pool, the prediction network's another), and the outputs are cut back to the batch's length. The
LSTMs are causal: the padding changes no output inside the batch's length and gets no gradient. The
time stacking's zero frame past an odd length is kept by masking the padded frames' pre-stacking
outputs. Each LSTM is one cuDNN call, its dropout state the graphs' own (:func:`cudnn_lstm`). The
plain path, :meth:`RNNT.encode` and :meth:`RNNT.predict`, is the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.rnnt.model import LSTM, RNNT, stacked_lengths
from common.cuda_graph import thread_local_captures, uncached_autocast
from common.optimisations import Optimisation

PAD_STEPS = 16   # encoder steps (0.96 s) and labels a padded length is a multiple of


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


CUDNN_LSTM = 2   # cudnnRNNMode_t


def cudnn_lstm(rnn: LSTM, x: torch.Tensor, dropout_state: torch.Tensor) -> torch.Tensor:
    """``rnn(x)[0]`` as one cuDNN call over all its layers, the between-layer dropout drawn
    from ``dropout_state`` (``torch._cudnn_init_dropout_state``), a buffer the graphs own.
    Through ``nn.LSTM``, which takes that state from PyTorch's per-device cache, graphs
    replayed after a later capture failed with an illegal address on the H100 (the cause not
    isolated); one call per layer with ``F.dropout`` between them avoided it but lost the
    layers' wavefront: 858-873 against 1,024-1,028 utterances/s at batch 64, 1,007 against
    1,311-1,313 at batch 128 (docs/performance.md, RNN-T)."""
    lstm = rnn.lstm
    h0 = x.new_zeros(lstm.num_layers, x.shape[0], lstm.hidden_size)
    y = torch._cudnn_rnn(x, lstm._flat_weights, 4, None, h0, h0, CUDNN_LSTM, lstm.hidden_size,
                         0, lstm.num_layers, True, lstm.dropout, lstm.training, False, [],
                         dropout_state)[0]
    return rnn.dropout(y)


class _EncoderCore(nn.Module):
    """``(feats [B, T, in_feats], keep [1, T, 1])`` -> ``[B, T / stack, hidden]``: the
    encoder with the pre-stacking outputs past ``keep`` zeroed (``T`` a multiple of the
    stacking factor)."""

    def __init__(self, model: RNNT, dropout_state: torch.Tensor):
        super().__init__()
        self.encoder, self.dropout_state = model.encoder, dropout_state

    def forward(self, feats: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        e = self.encoder
        x = cudnn_lstm(e.pre_rnn, feats, self.dropout_state)
        x = torch.where(keep, x, 0.0).reshape(x.shape[0], -1, e.stack_time_factor * x.shape[2])
        return cudnn_lstm(e.post_rnn, x, self.dropout_state)


class _PredictionCore(nn.Module):
    """``labels [B, U]`` -> ``[B, U + 1, hidden]``."""

    def __init__(self, model: RNNT, dropout_state: torch.Tensor):
        super().__init__()
        self.prediction, self.dropout_state = model.prediction, dropout_state

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        p = self.prediction
        return cudnn_lstm(p.dec_rnn, p.inputs(labels), self.dropout_state)


class GraphedRNNs:
    """:meth:`RNNT.encode` and :meth:`RNNT.predict` for training, through graphs of padded
    shapes. Graphs replay the autocast state of their capture: call under the same one."""

    def __init__(self, model: RNNT, pad_steps: int = PAD_STEPS):
        self.model = model
        # the graphs' own dropout state, kept as long as they are, seeded from torch's RNG
        # (cuDNN's random states do not depend on the rate it is made with)
        seed = int(torch.randint(2**62, ()))
        self.dropout_state = torch._cudnn_init_dropout_state(
            0.5, True, seed, dtype=torch.uint8, device="cuda")
        self.stack = model.encoder.stack_time_factor
        self.pad_steps = pad_steps
        self.graphs: dict[tuple, nn.Module] = {}
        self.pools: dict[type, tuple] = {}

    def _graph(self, core: type[nn.Module], *args: torch.Tensor) -> nn.Module:
        """The graphed ``core`` for the shapes of ``args``: a wrapper of its own per shape,
        as ``make_graphed_callables`` replaces the forward of the module it is given. The
        graphs of one core share a memory pool: a step replays one of them (forward, later
        backward) and no other in between, and each replay rewrites what it reads."""
        key = (core.__name__, *(tuple(a.shape) for a in args))
        if key not in self.graphs:
            with uncached_autocast(), thread_local_captures():
                if core not in self.pools:
                    self.pools[core] = torch.cuda.graph_pool_handle()
                self.graphs[key] = torch.cuda.make_graphed_callables(
                    core(self.model, self.dropout_state), tuple(a.clone() for a in args),
                    pool=self.pools[core])
        return self.graphs[key]

    def encode(self, feats: torch.Tensor, feat_lens: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        T = feats.shape[1]
        padded = _round_up(T, self.pad_steps * self.stack)
        keep = (torch.arange(padded, device=feats.device) < T)[None, :, None]
        feats = F.pad(feats, (0, 0, 0, padded - T))
        enc = self._graph(_EncoderCore, feats, keep)(feats, keep)
        return enc[:, :stacked_lengths(T, self.stack)], stacked_lengths(feat_lens, self.stack)

    def predict(self, labels: torch.Tensor) -> torch.Tensor:
        U = labels.shape[1]
        labels = F.pad(labels, (0, _round_up(U + 1, self.pad_steps) - 1 - U))
        return self._graph(_PredictionCore, labels)(labels)[:, :U + 1]


def apply(wl, _) -> None:
    rnns = GraphedRNNs(wl.net)
    wl.train_loss.encode, wl.train_loss.predict = rnns.encode, rnns.predict


OPTIMISATION = Optimisation(
    "rnn-graphs", "the encoder's and prediction network's LSTMs as CUDA graphs, one per input "
    "length padded to 16 steps (benchmarks/rnnt/rnn_graphs.py)", apply=apply, cuda=True,
    compare=None, tested_by="tests/benchmarks/rnnt/test_rnn_graphs.py (the graphs draw their "
    "own dropout masks)")
