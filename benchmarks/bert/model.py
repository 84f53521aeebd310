"""BERT for pre-training (masked LM + next sentence), as the MLPerf reference defines it.

Module and parameter names follow the reference's PyTorch checkpoint
(``bert.encoder.layer.0.attention.self.query.weight``...), so a converted
phase-1 checkpoint loads as a plain state dict; ``mllog_tensor_names`` maps
them to the TensorFlow names that ``closed_bert.yaml`` lists.

Attention has three interchangeable implementations (a switch, same maths):
``plain`` (explicit softmax, the reference), ``sdpa`` (padded
``scaled_dot_product_attention``) and ``unpad`` (padding tokens removed: every
layer works on the packed ``[tokens, hidden]`` matrix and attention runs on
variable-length sequences). The masked-LM head only transforms the masked
positions, which is the same loss as transforming every position.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.errors import UserError
from common.fusion import compiled

ATTENTION_IMPLS = ("plain", "sdpa", "unpad")


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


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU (erf form) of ``x + bias``: the unfused reference of ``fused_bias_gelu``."""
    return F.gelu(x + bias)


def layer_norm(x, weight, bias, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension. With low-precision weights (``--bf16-weights``) the
    output keeps their dtype (statistics still in fp32) instead of autocast's fp32, so the
    residual stream stays bf16 from layer to layer."""
    if weight is None or weight.dtype == torch.float32:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    with torch.autocast(x.device.type, enabled=False):
        return F.layer_norm(x.to(weight.dtype), (x.shape[-1],), weight, bias, eps)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` through ``layer_norm``: bf16 output when its weights are bf16."""

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)


def bias_dropout_add_layer_norm(x, bias, residual, weight, ln_bias, p: float, eps: float):
    """LayerNorm(dropout(x + bias) + residual): the unfused reference of
    ``fused_bias_dropout_add_layer_norm``."""
    return layer_norm(F.dropout(x + bias, p) + residual, weight, ln_bias, eps)


def fused_bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``bias_gelu`` as one Inductor-generated kernel (forward and backward)."""
    return compiled(bias_gelu)(x, bias)


def fused_bias_dropout_add_layer_norm(x, bias, residual, weight, ln_bias, p: float, eps: float):
    """``bias_dropout_add_layer_norm`` as Inductor-generated kernels (dropout drawn by
    Inductor's own generator: the same distribution, not the same mask as eager)."""
    return compiled(bias_dropout_add_layer_norm)(x, bias, residual, weight, ln_bias, p, eps)


@dataclass(frozen=True)
class Fusions:
    """Which elementwise chains run as compiled kernels instead of eager ops."""

    bias_gelu: bool = False
    dropout_add_layer_norm: bool = False


@dataclass
class Packing:
    """Where the tokens of a padded ``[batch, seq]`` batch live in the packed token matrix.

    ``index`` [tokens]: the flat positions (``b * seq + s``) gathered into the
    packed matrix; ``offsets`` [sequences + 1] (int32): sequence ``i`` is rows
    ``offsets[i]:offsets[i + 1]``. The batch's sequences come first; a bucketed
    packing (``bucketed_packing``) then has filler sequences made of padding
    positions, which no output reads and which therefore get zero gradient.
    """

    index: torch.Tensor
    offsets: torch.Tensor
    max_len: int

    @classmethod
    def from_mask(cls, mask: torch.Tensor) -> Packing:
        """The exact packing of ``mask`` (real tokens first in every row, as BERT pads)."""
        lengths = mask.sum(1)
        offsets = F.pad(lengths.cumsum(0), (1, 0)).int()
        return cls(mask.flatten().nonzero().squeeze(1), offsets, mask.shape[1])


def bucketed_packing(mask: np.ndarray, micro: int, bucket: int) -> tuple[np.ndarray, ...]:
    """Static-shape packings of the ``micro`` micro-batches of a host ``mask`` [batch, seq].

    The token count is the largest micro-batch's, rounded up to a multiple of
    ``bucket`` (at most all positions); the gap is filled with padding positions
    split into ``ceil(bucket / seq)`` filler sequences (some possibly empty), so
    every batch of a bucket has the same shapes and one CUDA graph serves them.
    Returns ``index`` [micro, tokens] (int64) and ``offsets`` [micro, rows + 1 + fillers]
    (int32), ``rows`` being the micro-batch size.
    """
    b, s = mask.shape
    parts = mask.reshape(micro, b // micro, s).astype(bool)
    cap = min(-(-int(parts.sum((1, 2)).max()) // bucket) * bucket, b // micro * s)
    fillers = -(-bucket // s)
    index, offsets = [], []
    for part in parts:
        flat = part.reshape(-1)
        real, pad = np.flatnonzero(flat), np.flatnonzero(~flat)
        tail = cap - len(real)
        index.append(np.concatenate([real, pad[:tail]]))
        filler = np.clip(tail - s * np.arange(fillers), 0, s)
        offsets.append(np.cumsum(np.concatenate([[0], part.sum(1), filler])))
    return np.stack(index).astype(np.int64), np.stack(offsets).astype(np.int32)


class _FlashVarlen(torch.autograd.Function):
    """Flash attention over packed variable-length sequences ([tokens, heads, dim]), with
    dropout; shapes are static, so it runs inside CUDA graphs."""

    @staticmethod
    def forward(ctx, q, k, v, offsets, max_len: int, dropout_p: float):
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, offsets, offsets, max_len, max_len, dropout_p, False, False)
        ctx.save_for_backward(q, k, v, out, lse, offsets, rng, unused)
        ctx.max_len, ctx.dropout_p = max_len, dropout_p
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, offsets, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad.contiguous(), q, k, v, out, lse, offsets, offsets, ctx.max_len, ctx.max_len,
            ctx.dropout_p, False, rng, unused)
        return dq, dk, dv, None, None, None


def varlen_attention(q, k, v, packing: Packing, dropout_p: float) -> torch.Tensor:
    """Attention within each packed sequence of ``q, k, v`` [tokens, heads, dim].

    CUDA: flash attention (bf16/fp16). Elsewhere: one SDPA call per sequence.
    """
    if q.is_cuda:
        return _FlashVarlen.apply(q, k, v, packing.offsets, packing.max_len, dropout_p)
    bounds = packing.offsets.tolist()
    pieces = [F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)),
                                             dropout_p=dropout_p).transpose(0, 1)
              for a, b in zip(bounds, bounds[1:]) if b > a]
    return torch.cat(pieces)


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.padded_vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, input_ids, segment_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(pos)
             + self.token_type_embeddings(segment_ids))
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, c: BertConfig, impl: str):
        super().__init__()
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, not {impl!r}")
        self.impl, self.heads = impl, c.num_attention_heads
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.dropout_p = c.attention_probs_dropout_prob
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x, mask, packing: Packing | None):
        q, k, v = self.query(x), self.key(x), self.value(x)
        p = self.dropout_p if self.training else 0.0
        if self.impl == "unpad":
            return self._packed(q, k, v, packing, p)
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :].bool(),
                                                 dropout_p=p)
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
            scores = scores + (1.0 - mask[:, None, None, :].to(scores.dtype)) * -10000.0
            out = F.dropout(scores.softmax(-1), p) @ v
        return out.transpose(1, 2).reshape(b, s, h)

    def _packed(self, q, k, v, packing: Packing, p: float):
        t, h = q.shape
        q, k, v = (x.view(t, self.heads, self.head_dim) for x in (q, k, v))
        return varlen_attention(q, k, v, packing, p).reshape(t, h)


class DenseLayerNorm(nn.Module):
    """dense -> dropout -> + residual -> LayerNorm (``attention.output`` and ``output``)."""

    def __init__(self, c: BertConfig, d_in: int, fused: bool):
        super().__init__()
        self.dense = nn.Linear(d_in, c.hidden_size)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        self.fused = fused

    def forward(self, x, residual):
        if not self.fused:  # the bias stays in the GEMM
            return self.LayerNorm(self.dropout(self.dense(x)) + residual)
        p = self.dropout.p if self.training else 0.0
        return fused_bias_dropout_add_layer_norm(
            F.linear(x, self.dense.weight), self.dense.bias, residual, self.LayerNorm.weight,
            self.LayerNorm.bias, p, self.LayerNorm.eps)


class Attention(nn.Module):
    def __init__(self, c: BertConfig, impl: str, fused: Fusions):
        super().__init__()
        self.self = SelfAttention(c, impl)
        self.output = DenseLayerNorm(c, c.hidden_size, fused.dropout_add_layer_norm)

    def forward(self, x, mask, packing):
        return self.output(self.self(x, mask, packing), x)


class Intermediate(nn.Module):
    def __init__(self, c: BertConfig, fused: Fusions):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)
        self.act = fused_bias_gelu if fused.bias_gelu else bias_gelu

    def forward(self, x):
        return self.act(F.linear(x, self.dense.weight), self.dense.bias)


class Layer(nn.Module):
    def __init__(self, c: BertConfig, impl: str, fused: Fusions):
        super().__init__()
        self.attention = Attention(c, impl, fused)
        self.intermediate = Intermediate(c, fused)
        self.output = DenseLayerNorm(c, c.intermediate_size, fused.dropout_add_layer_norm)

    def forward(self, x, mask, packing):
        x = self.attention(x, mask, packing)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, c: BertConfig, impl: str, fused: Fusions):
        super().__init__()
        self.layer = nn.ModuleList(Layer(c, impl, fused) for _ in range(c.num_hidden_layers))

    def forward(self, x, mask, packing):
        for layer in self.layer:
            x = layer(x, mask, packing)
        return x


class Pooler(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, first_token):
        return torch.tanh(self.dense(first_token))


class BertModel(nn.Module):
    def __init__(self, c: BertConfig, impl: str, fused: Fusions):
        super().__init__()
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c, impl, fused)
        self.pooler = Pooler(c)


class HeadTransform(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

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

    def __init__(self, c: BertConfig, attention: str = "plain", fused: Fusions = Fusions()):
        super().__init__()
        self.config, self.attention = c, attention
        self.bert = BertModel(c, attention, fused)
        self.cls = PreTrainingHeads(c, self.bert.embeddings.word_embeddings)
        self.apply(self._init_weights)

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(m.weight, std=self.config.initializer_range,
                                  a=-2 * self.config.initializer_range,
                                  b=2 * self.config.initializer_range)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, input_ids, segment_ids, input_mask, masked_lm_positions,
                pack_index=None, pack_offsets=None):
        """``pack_index``/``pack_offsets``: a ``bucketed_packing`` of the batch for
        ``unpad`` (static shapes); without them the exact packing is computed here."""
        b, s = input_ids.shape
        x = self.bert.embeddings(input_ids, segment_ids)
        if self.attention == "unpad":
            packing = (Packing(pack_index, pack_offsets, s) if pack_index is not None
                       else Packing.from_mask(input_mask))
            x = self.bert.encoder(x.view(b * s, -1)[packing.index], None, packing)
            starts = packing.offsets[:b].long()
            first = x[starts]
            masked = x[starts[:, None] + masked_lm_positions]
        else:
            x = self.bert.encoder(x, input_mask, None)
            first = x[:, 0]
            masked = x.gather(1, masked_lm_positions[..., None].expand(-1, -1, x.shape[-1]))
        mlm = self.cls.predictions(masked)
        nsp = self.cls.seq_relationship(self.bert.pooler(first))
        return mlm, nsp


def no_weight_decay(name: str) -> bool:
    """The reference excludes LayerNorm and bias parameters from weight decay (and LAMB's ratio)."""
    return "LayerNorm" in name or name.endswith("bias")


def mllog_tensor_name(name: str) -> str:
    """``bert.encoder.layer.3.attention.self.query.weight`` -> the TF name closed_bert.yaml uses."""
    parts = name.split(".")
    leaf = parts.pop()
    path = "/".join(parts).replace("layer/", "layer_")
    if name == "cls.predictions.bias":
        return "cls/predictions/output_bias"
    if parts[:2] == ["cls", "seq_relationship"]:
        return f"{path}/output_{'weights' if leaf == 'weight' else 'bias'}"
    if parts[-1].endswith("embeddings"):
        return path
    if parts[-1] == "LayerNorm":
        return f"{path}/{'gamma' if leaf == 'weight' else 'beta'}"
    return f"{path}/{'kernel' if leaf == 'weight' else 'bias'}"


def mllog_tensor_names(model: nn.Module) -> list[str]:
    return [mllog_tensor_name(n) for n, _ in model.named_parameters()]
