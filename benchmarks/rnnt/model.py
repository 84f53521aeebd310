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
encoder output ``[B, T', 1024]``, labels ``[B, U]`` padded with any valid token id; the joint
makes the padded grid ``[B, T', U+1, V+1]``, as the reference's.
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
