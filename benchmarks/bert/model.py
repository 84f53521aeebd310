"""BERT for pre-training (masked LM + next sentence), as the MLPerf reference defines it.

HuggingFace's ``BertForPreTraining`` with its eager attention (an explicit softmax, padding
masked by -10000), named as the reference's PyTorch checkpoint
(``bert.encoder.layer.0.attention.self.query.weight``...) so that a converted phase-1
checkpoint loads as a plain state dict. The masked-LM head transforms only the masked
positions: the same loss as transforming every position. Optimisations swap the classes of the
built modules (``swap_class``); the ``mask`` the encoder passes on is whatever its attention takes.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from common.errors import UserError


@dataclass(frozen=True)
class BertConfig:
    """The reference's ``bert_config.json`` (defaults: BERT-large uncased)."""

    vocab_size: int = 30522
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12

    @property
    def padded_vocab_size(self) -> int:
        """Vocabulary rounded up to a multiple of 8 (tensor-core friendly; extra rows unused)."""
        return (self.vocab_size + 7) // 8 * 8

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: not a readable bert_config.json ({exc})") from exc
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        if raw.get("hidden_act", "gelu") != "gelu":
            raise UserError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (gelu)")
        return cls(**values)


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.padded_vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, input_ids, segment_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(pos)
             + self.token_type_embeddings(segment_ids))
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads = c.num_attention_heads
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.dropout_p = c.attention_probs_dropout_prob
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x, mask):
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2)
                   for t in self.project(x))
        out = self.attend(q, k, v, mask, self.dropout_p if self.training else 0.0)
        return out.transpose(1, 2).reshape(b, s, h)

    def project(self, x):
        """The query, key and value projections of ``x``."""
        return self.query(x), self.key(x), self.value(x)

    def attend(self, q, k, v, mask, p: float):
        """Softmax attention of ``q, k, v`` [batch, heads, seq, dim] over the real tokens of
        ``mask`` [batch, seq], with dropout ``p`` on the probabilities."""
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        scores = scores + (1.0 - mask[:, None, None, :].to(scores.dtype)) * -10000.0
        return F.dropout(scores.softmax(-1), p) @ v


class DenseLayerNorm(nn.Module):
    """dense -> dropout -> + residual -> LayerNorm (``attention.output`` and ``output``)."""

    def __init__(self, c: BertConfig, d_in: int):
        super().__init__()
        self.dense = nn.Linear(d_in, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)

    def after_dense(self, y, residual):
        """The block for the dense GEMM's output ``y`` computed elsewhere, without its bias."""
        return self.LayerNorm(self.dropout(y + self.dense.bias) + residual)


class Attention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.self = SelfAttention(c)
        self.output = DenseLayerNorm(c, c.hidden_size)

    def forward(self, x, mask):
        return self.output(self.self(x, mask), x)


class Intermediate(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))


class Layer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = DenseLayerNorm(c, c.intermediate_size)

    def forward(self, x, mask):
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))

    def forward(self, x, mask):
        for layer in self.layer:
            x = layer(x, mask)
        return x


class Pooler(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, first_token):
        return torch.tanh(self.dense(first_token))


class BertModel(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        self.pooler = Pooler(c)


class HeadTransform(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


class LMPredictionHead(nn.Module):
    def __init__(self, c: BertConfig, embedding: nn.Embedding):
        super().__init__()
        self.transform = HeadTransform(c)
        self.decoder = nn.Linear(c.hidden_size, c.padded_vocab_size, bias=False)
        self.decoder.weight = embedding.weight  # tied, as in the reference
        self.bias = nn.Parameter(torch.zeros(c.padded_vocab_size))

    def forward(self, x):
        return self.decoder(self.transform(x)) + self.bias


class PreTrainingHeads(nn.Module):
    def __init__(self, c: BertConfig, embedding: nn.Embedding):
        super().__init__()
        self.predictions = LMPredictionHead(c, embedding)
        self.seq_relationship = nn.Linear(c.hidden_size, 2)


class BertForPreTraining(nn.Module):
    """Returns masked-LM logits ``[batch, predictions, vocab]`` and NSP logits ``[batch, 2]``."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.config = c
        self.bert = BertModel(c)
        self.cls = PreTrainingHeads(c, self.bert.embeddings.word_embeddings)
        self.apply(self._init_weights)

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(m.weight, std=self.config.initializer_range,
                                  a=-2 * self.config.initializer_range,
                                  b=2 * self.config.initializer_range)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, input_ids, segment_ids, input_mask, masked_lm_positions):
        x = self.bert.encoder(self.bert.embeddings(input_ids, segment_ids), input_mask)
        masked = x.gather(1, masked_lm_positions[..., None].expand(-1, -1, x.shape[-1]))
        return self.heads(masked, x[:, 0])

    def heads(self, masked, first):
        """The masked-LM logits of the ``masked`` hidden states, the NSP logits of ``first``."""
        return self.cls.predictions(masked), self.cls.seq_relationship(self.bert.pooler(first))


@functools.cache
def mixed_class(mixin: type, cls: type) -> type:
    """``cls`` with ``mixin``'s methods first, named ``{mixin}{cls}``."""
    return type(f"{mixin.__name__}{cls.__name__}", (mixin, cls), {})


def mix_in(module: nn.Module, base: type, mixin: type) -> None:
    """Every submodule that is a ``base`` takes ``mixin``'s methods first (its parameters
    kept)."""
    for m in module.modules():
        if isinstance(m, base):
            m.__class__ = mixed_class(mixin, type(m))


def swap_class(module: nn.Module, plain: type, new: type) -> None:
    """Every submodule of exactly class ``plain`` becomes a ``new`` (its parameters kept)."""
    for m in module.modules():
        if type(m) is plain:
            m.__class__ = new
