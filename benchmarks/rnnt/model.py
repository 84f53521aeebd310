"""The RNN-T network of MLPerf Training 1.1 (mlcommons/training ``rnn_speech_recognition/
pytorch``: ``rnnt/model.py``, ``common/rnn.py``; sizes from ``configs/baseline_v3-1023sp.yaml``,
the initialisation scale from ``train.py``).

- Encoder: ``pre_rnn`` (2-layer LSTM 1024 on 240 features: 80 mel bins x 3 stacked frames),
  time stacking x2 (pairs of consecutive frames concatenated, lengths rounded up), ``post_rnn``
  (3-layer LSTM 1024 on 2048 inputs); dropout 0.1.
- Prediction network: ``pred_embed`` (one 512-wide row per token: no blank row; the start of a
  sequence is a zero vector, not an embedding), ``dec_rnn`` (2-layer LSTM 512; the yaml's
  ``pred_n_hid`` is 512 in the reference and NVIDIA's v1.1 code); dropout 0.3.
- Joint: ``joint_enc`` (1024 -> 512) and ``joint_pred`` (512 -> 512) added, ReLU, dropout 0.3,
  ``joint_net`` (512 -> vocabulary + 1). The blank is the last output.

Each LSTM is ``torch.nn.LSTM`` (dropout between its layers) followed by dropout on its output.
Initialisation is PyTorch's default, then per LSTM: the input-hidden forget-gate bias set to
``forget_gate_bias`` (1.0), the hidden-hidden one multiplied by ``hidden_hidden_bias_scale``
(0.0), then every LSTM weight and bias multiplied by ``weights_init_scale``, so the forget
gate's bias starts at 0.5. The scale defaults to 0.5, the value ``train.py`` and NVIDIA's code
use and log as ``model_weights_initialization_scale`` (the reference's ``RNNT`` constructor
default is 1.0). Embedding and linear layers keep PyTorch's defaults.

Tensors are batch-first here (the reference runs time-major): features ``[B, T, 240]``,
encoder output ``[B, T', 1024]``, labels ``[B, U]`` padded with any valid token id.

Two joints compute the same logits: :meth:`RNNT.joint` on the padded grid ``[B, T, U+1, V+1]``
(the reference), and :meth:`RNNT.joint_packed` on the valid ``(t, u)`` pairs only, utterance
by utterance at offsets ``cumsum(T_b * (U_b + 1))`` like NVIDIA's ``batch_offset``, ``t`` major,
with the add, ReLU and dropout in one autograd function that keeps only its output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IN_FEATS = 240
ENC_HIDDEN = 1024
ENC_PRE_RNN_LAYERS = 2
ENC_POST_RNN_LAYERS = 3
ENC_STACK_TIME_FACTOR = 2
ENC_DROPOUT = 0.1
PRED_HIDDEN = 512
PRED_RNN_LAYERS = 2
PRED_DROPOUT = 0.3
JOINT_HIDDEN = 512
JOINT_DROPOUT = 0.3
FORGET_GATE_BIAS = 1.0
HIDDEN_HIDDEN_BIAS_SCALE = 0.0
WEIGHTS_INIT_SCALE = 0.5
VOCAB_SIZE = 1023                   # SentencePiece pieces; the joint has one more output, blank

State = tuple[torch.Tensor, torch.Tensor]


class LSTM(nn.Module):
    """The reference's ``common/rnn.py`` LSTM: ``forward(x [B, T, in], state)`` ->
    ``(dropout(y) [B, T, hidden], (h, c))``, with its initialisation (see the module doc)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, dropout: float,
                 forget_gate_bias: float = FORGET_GATE_BIAS,
                 hidden_hidden_bias_scale: float = HIDDEN_HIDDEN_BIAS_SCALE,
                 weights_init_scale: float = WEIGHTS_INIT_SCALE):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True,
                            dropout=dropout if num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        forget = slice(hidden_size, 2 * hidden_size)     # gate order: input, forget, cell, output
        with torch.no_grad():
            for name, param in self.lstm.named_parameters():
                if name.startswith("bias_ih"):
                    param[forget] = forget_gate_bias
                elif name.startswith("bias_hh"):
                    param[forget] *= hidden_hidden_bias_scale
                param *= weights_init_scale

    def forward(self, x: torch.Tensor, state: State | None = None
                ) -> tuple[torch.Tensor, State]:
        y, state = self.lstm(x, state)
        return self.dropout(y), state


def stacked_lengths(lens, factor: int):
    """Lengths (a tensor or an int) after :func:`stack_time`: ``ceil(lens / factor)``."""
    return (lens + factor - 1) // factor


def stack_time(x: torch.Tensor, lens: torch.Tensor, factor: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T, H]`` -> ``[B, ceil(T / factor), factor * H]``: each output frame is ``factor``
    consecutive input frames side by side (zeros past the end); lengths rounded up."""
    pad = -x.shape[1] % factor
    x = F.pad(x, (0, 0, 0, pad))
    return x.reshape(x.shape[0], x.shape[1] // factor, -1), stacked_lengths(lens, factor)


class Encoder(nn.Module):
    """``forward(feats [B, T, in_feats], lens [B])`` -> ``([B, ceil(T / factor), hidden],
    lens)``: ``pre_rnn``, time stacking, ``post_rnn``."""

    def __init__(self, in_feats: int, hidden: int, pre_rnn_layers: int, post_rnn_layers: int,
                 stack_time_factor: int, dropout: float, **lstm_init: float):
        super().__init__()
        self.stack_time_factor = stack_time_factor
        self.pre_rnn = LSTM(in_feats, hidden, pre_rnn_layers, dropout, **lstm_init)
        self.post_rnn = LSTM(stack_time_factor * hidden, hidden, post_rnn_layers, dropout,
                             **lstm_init)

    def forward(self, feats: torch.Tensor, lens: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x, _ = self.pre_rnn(feats)
        x, lens = stack_time(x, lens, self.stack_time_factor)
        x, _ = self.post_rnn(x)
        return x, lens


class Prediction(nn.Module):
    """The prediction network: ``embed`` (``vocab_size`` rows, no blank) and ``dec_rnn``."""

    def __init__(self, vocab_size: int, hidden: int, rnn_layers: int, dropout: float,
                 **lstm_init: float):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.dec_rnn = LSTM(hidden, hidden, rnn_layers, dropout, **lstm_init)

    def forward(self, labels: torch.Tensor, state: State | None = None
                ) -> tuple[torch.Tensor, State]:
        """``labels [B, U]`` -> ``([B, U + 1, hidden], state)``: the start (a zero vector)
        then every label is fed; output ``u`` has seen the first ``u`` labels."""
        return self.dec_rnn(self.inputs(labels), state)

    def inputs(self, labels: torch.Tensor) -> torch.Tensor:
        """``labels [B, U]`` -> ``dec_rnn``'s input ``[B, U + 1, hidden]``: a zero vector,
        then each label's embedding."""
        return F.pad(self.embed(labels), (0, 0, 1, 0))

    def step(self, labels: torch.Tensor, state: State | None
             ) -> tuple[torch.Tensor, State]:
        """One step for a batch: ``labels [B]`` (-1 = the start: a zero input), ``state``
        (None = zeros) -> ``([B, hidden], state)``."""
        x = self.embed(labels.clamp(min=0)).masked_fill((labels < 0)[:, None], 0.0)
        y, state = self.dec_rnn(x[:, None], state)
        return y[:, 0], state


def packed_index(enc_lens: torch.Tensor, pred_lens: torch.Tensor, total: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``(b, t, u)`` of every valid pair ``t < enc_lens[b]``, ``u < pred_lens[b]``
    (``pred_lens`` = label lengths + 1), utterance by utterance, ``t`` major. ``total``, the
    number of pairs, spares a device-to-host copy when the caller knows it."""
    sizes = enc_lens.long() * pred_lens.long()
    b = torch.repeat_interleave(torch.arange(len(sizes), device=sizes.device), sizes,
                                output_size=total)
    start = torch.cumsum(sizes, 0) - sizes
    local = torch.arange(len(b), device=b.device) - start[b]
    width = pred_lens.long()[b]
    return b, local // width, local % width


def row_sums(x: torch.Tensor, rows: torch.Tensor, n: int, segments: bool | None = None
             ) -> torch.Tensor:
    """``[n, H]``: row ``i`` is the sum of the rows ``j`` of ``x [N, H]`` with ``rows[j] == i``,
    in ``x``'s dtype, accumulated in fp32 or wider. ``segments`` (default: on CUDA) sorts
    ``rows`` and reduces each run, as ``nn.Embedding``'s backward does; otherwise
    ``index_add_``, whose CUDA atomic adds round to bf16 at every add (a bf16 sum of hundreds
    of rows stalls) while its CPU kernel accumulates in fp32 and that backward does not."""
    if x.is_cuda if segments is None else segments:
        return torch.ops.aten.embedding_dense_backward(x, rows, n, -1, False)
    return x.new_zeros(n, x.shape[1]).index_add_(0, rows, x)


def gather_add_relu_dropout(f: torch.Tensor, g: torch.Tensor, rows_f: torch.Tensor,
                            rows_g: torch.Tensor, p: float) -> torch.Tensor:
    """``dropout(relu(f[rows_f] + g[rows_g]), p)`` with the gather and the add as one
    ``embedding_bag`` (a sum of two rows of ``[f; g]``), so neither gathered ``[N, H]`` tensor
    is made; the reference of ``compiled_joint``'s."""
    pairs = torch.stack((rows_f, rows_g + len(f)), 1)
    out = F.embedding_bag(pairs, torch.cat((f, g)), mode="sum").relu_()
    return F.dropout(out, p, training=True) if p > 0 else out   # one fused kernel on the GPU


class _AddReluDropout(torch.autograd.Function):
    """``dropout(relu(f[rows_f] + g[rows_g]))`` by ``gather`` (a function of
    ``(f, g, rows_f, rows_g, p)``), saving only its output: the output is positive exactly
    where the gradient passes (scaled by ``1 / (1 - p)``); the backward sums the gradient's
    rows with :func:`row_sums`."""

    @staticmethod
    def forward(ctx, f: torch.Tensor, g: torch.Tensor, rows_f: torch.Tensor,
                rows_g: torch.Tensor, p: float, gather) -> torch.Tensor:
        out = gather(f, g, rows_f, rows_g, p)
        ctx.save_for_backward(out, rows_f, rows_g)
        ctx.scale = 1.0 / (1.0 - p)
        ctx.sizes = len(f), len(g)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out, rows_f, rows_g = ctx.saved_tensors
        grad = torch.ops.aten.threshold_backward(grad, out, 0)   # grad where out > 0, else 0
        grad_f, grad_g = (row_sums(grad, rows, n) for rows, n in zip((rows_f, rows_g),
                                                                    ctx.sizes))
        if ctx.scale != 1.0:
            grad_f, grad_g = grad_f.mul_(ctx.scale), grad_g.mul_(ctx.scale)
        return grad_f, grad_g, None, None, None, None


def add_relu_dropout(f: torch.Tensor, g: torch.Tensor, rows_f: torch.Tensor,
                     rows_g: torch.Tensor, p: float, training: bool,
                     gather=gather_add_relu_dropout) -> torch.Tensor:
    """``dropout(relu(f[rows_f] + g[rows_g]), p)``: ``f [Nf, H]``, ``g [Ng, H]`` -> ``[N, H]``,
    the forward by ``gather`` (:func:`gather_add_relu_dropout`'s contract)."""
    return _AddReluDropout.apply(f, g, rows_f, rows_g, p if training else 0.0, gather)


class RNNT(nn.Module):
    """The RNN-T; every size is a keyword argument with the reference's value as default.
    ``forward(feats, feat_lens, labels)`` -> ``(logits [B, T', U+1, vocab_size+1], enc_lens)``
    on the padded grid, as the reference's ``RNNT.forward``."""

    def __init__(self, *, vocab_size: int = VOCAB_SIZE, in_feats: int = IN_FEATS,
                 enc_hidden: int = ENC_HIDDEN, enc_pre_rnn_layers: int = ENC_PRE_RNN_LAYERS,
                 enc_post_rnn_layers: int = ENC_POST_RNN_LAYERS,
                 enc_stack_time_factor: int = ENC_STACK_TIME_FACTOR,
                 enc_dropout: float = ENC_DROPOUT, pred_hidden: int = PRED_HIDDEN,
                 pred_rnn_layers: int = PRED_RNN_LAYERS, pred_dropout: float = PRED_DROPOUT,
                 joint_hidden: int = JOINT_HIDDEN, joint_dropout: float = JOINT_DROPOUT,
                 forget_gate_bias: float = FORGET_GATE_BIAS,
                 hidden_hidden_bias_scale: float = HIDDEN_HIDDEN_BIAS_SCALE,
                 weights_init_scale: float = WEIGHTS_INIT_SCALE):
        super().__init__()
        lstm_init = dict(forget_gate_bias=forget_gate_bias,
                         hidden_hidden_bias_scale=hidden_hidden_bias_scale,
                         weights_init_scale=weights_init_scale)
        self.vocab_size = vocab_size
        self.blank = vocab_size
        self.joint_dropout = joint_dropout
        self.encoder = Encoder(in_feats, enc_hidden, enc_pre_rnn_layers, enc_post_rnn_layers,
                               enc_stack_time_factor, enc_dropout, **lstm_init)
        self.prediction = Prediction(vocab_size, pred_hidden, pred_rnn_layers, pred_dropout,
                                     **lstm_init)
        self.joint_pred = nn.Linear(pred_hidden, joint_hidden)
        self.joint_enc = nn.Linear(enc_hidden, joint_hidden)
        self.joint_net = nn.Linear(joint_hidden, vocab_size + 1)

    def encode(self, feats: torch.Tensor, feat_lens: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``feats [B, T, in_feats]`` -> ``(enc [B, T', enc_hidden], enc_lens)``."""
        return self.encoder(feats, feat_lens)

    def predict(self, labels: torch.Tensor, state: State | None = None
                ) -> tuple[torch.Tensor, State]:
        """``labels [B, U]`` -> ``(pred [B, U + 1, pred_hidden], state)``."""
        return self.prediction(labels, state)

    def predict_step(self, labels: torch.Tensor, state: State | None
                     ) -> tuple[torch.Tensor, State]:
        """``labels [B]`` (-1 = start) -> ``(pred [B, pred_hidden], state)``."""
        return self.prediction.step(labels, state)

    def _output(self, h: torch.Tensor) -> torch.Tensor:
        h = F.dropout(F.relu(h), self.joint_dropout, self.training)
        return self.joint_net(h)

    def joint(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """``enc [B, T, He]``, ``pred [B, U+1, Hp]`` -> ``[B, T, U+1, vocab_size+1]``."""
        return self._output(self.joint_enc(enc)[:, :, None] + self.joint_pred(pred)[:, None])

    def joint_step(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """``enc [B, He]``, ``pred [B, Hp]`` -> ``[B, vocab_size+1]`` (one pair per row)."""
        return self._output(self.joint_enc(enc) + self.joint_pred(pred))

    def joint_packed(self, enc: torch.Tensor, pred: torch.Tensor, enc_lens: torch.Tensor,
                     label_lens: torch.Tensor, total: int | None = None,
                     gather=gather_add_relu_dropout) -> torch.Tensor:
        """The joint on the valid pairs only: ``[N, vocab_size+1]``, rows in
        :func:`packed_index` order (``N = sum(enc_lens * (label_lens + 1))``, or ``total``);
        ``gather``: the hidden layer's forward (:func:`add_relu_dropout`)."""
        b, t, u = packed_index(enc_lens, label_lens + 1, total)
        f = self.joint_enc(enc).flatten(0, 1)
        g = self.joint_pred(pred).flatten(0, 1)
        h = add_relu_dropout(f, g, b * enc.shape[1] + t, b * pred.shape[1] + u,
                             self.joint_dropout, self.training, gather)
        return self.joint_net(h)

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor, labels: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        enc, enc_lens = self.encode(feats, feat_lens)
        pred, _ = self.predict(labels)
        return self.joint(enc, pred), enc_lens


def mllog_tensor_modules(model: RNNT) -> dict[str, nn.Module]:
    """The ``weights_initialization`` tensor names of the 1.1.0 ruleset (``closed_rnnt.yaml``),
    each with the module it names."""
    return {"pre_rnn": model.encoder.pre_rnn, "post_rnn": model.encoder.post_rnn,
            "pred_embed": model.prediction.embed, "dec_rnn": model.prediction.dec_rnn,
            "joint_pred": model.joint_pred, "joint_enc": model.joint_enc,
            "joint_net": model.joint_net}


def mllog_tensor_names(model: RNNT) -> list[str]:
    """The ruleset's tensor names in the order the reference logs them."""
    return list(mllog_tensor_modules(model))
