"""The BERT throughput tool's per-variant set-up on the CPU, in either order of ``--variants``."""

import argparse
import dataclasses
import math
import sys
import types

import pytest
import torch

from benchmarks.bert import fusions, throughput
from benchmarks.bert.model import BertConfig
from benchmarks.bert.workload import BertWorkload
from common.precision import Precision

# BERT-large's vocabulary (the padded batch draws its tokens from it), everything else tiny
TINY = dataclasses.replace(BertConfig(), hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64)


class _HFBert(torch.nn.Module):
    """Stands in for ``transformers.BertForPreTraining``: its call and outputs, few weights."""

    def __init__(self, config):
        super().__init__()
        self.embed = torch.nn.Embedding(config.vocab_size, 8)
        self.mlm = torch.nn.Linear(8, config.vocab_size)
        self.nsp = torch.nn.Linear(8, 2)

    def forward(self, input_ids, token_type_ids, attention_mask):
        h = self.embed(input_ids + token_type_ids) * attention_mask[..., None]
        return types.SimpleNamespace(prediction_logits=self.mlm(h),
                                     seq_relationship_logits=self.nsp(h[:, 0]))


@pytest.fixture
def stubs(monkeypatch):
    """transformers (absent here: GPU machines only) as a stub; ours at a tiny size, its
    compiled kernels run eagerly (test_model checks them; Inductor takes ~20 s on the CPU)."""
    fake = types.ModuleType("transformers")
    fake.BertConfig = lambda **kw: types.SimpleNamespace(**kw)
    fake.BertForPreTraining = _HFBert
    monkeypatch.setitem(sys.modules, "transformers", fake)
    monkeypatch.setattr(BertWorkload, "_config", lambda self: TINY)
    monkeypatch.setattr(fusions, "compiled", lambda fn: fn)


def test_variants_are_the_registry_s():
    config = ["unpad", "triton-attention", "fused-qkv", "triton-qkv", "triton-gelu",
              "triton-layernorm", "flat-params", "sharded-optimizer", "fused-lamb", "bf16-weights",
              "cuda-graph"]
    assert throughput.OURS["plain"] == [] and throughput.OURS["config"] == config
    assert throughput.OURS["config-minus-flat-params"] == [   # and what requires it
        "unpad", "triton-attention", "fused-qkv", "triton-qkv", "triton-gelu", "triton-layernorm",
        "cuda-graph"]
    assert throughput.OURS["config-plus-compile"] == [*config, "compile"]
    assert throughput.OURS["config-plus-sdpa"] == [   # unpad (and what needs it) excludes it
        "fused-qkv", "triton-qkv", "triton-gelu", "triton-layernorm", "flat-params",
        "sharded-optimizer", "fused-lamb", "bf16-weights", "cuda-graph", "sdpa"]
    assert throughput.OURS["config-plus-fp8-ffn"] == [*config, "fp8-ffn"]
    assert throughput.OURS["config-plus-fp8-wgrad"] == [*config, "fp8-ffn", "fp8-wgrad"]
    assert throughput.OURS["config-plus-fused-layernorm"] == [   # in triton-layernorm's place
        *(c for c in config if c != "triton-layernorm"), "fused-layernorm"]
    assert set(throughput.VARIANTS) == {
        "plain", "config", "hf-sdpa", "hf-sdpa-compiled",
        *(f"config-minus-{n}" for n in config),
        *(f"config-plus-{n}" for n in ("sdpa", "compile", "fused-gelu", "fused-layernorm",
                                       "fp8-ffn", "fp8-wgrad"))}


# the config's step without its CUDA-only optimisations: what runs on the CPU
OURS = "config-on-the-cpu"


@pytest.mark.parametrize("variants", [["hf-sdpa", OURS], [OURS, "hf-sdpa"]])
def test_each_variant_sets_up_on_its_own_in_either_order(stubs, variants, monkeypatch):
    monkeypatch.setitem(throughput.OURS, OURS, [
        o for o in throughput.OURS["config"]
        if not BertWorkload.optimisations[o.partition("=")[0]].cuda])
    a = argparse.Namespace(batch_size=2, seq_len=32, fill=0.6)
    precision = Precision("amp-bf16", "cpu")
    batches = {}
    for variant in variants:
        step, batch = throughput.setup(variant, a, precision, torch.device("cpu"))
        assert math.isfinite(float(step(*batch).detach()))
        batches[variant] = batch
    hf, ours = batches["hf-sdpa"], batches[OURS]
    assert len(hf) == 6 and len(ours) == 8            # ours adds unpad's packing
    for h, o in zip(hf, ours):                         # the same padded data for both
        assert torch.equal(h, o)
