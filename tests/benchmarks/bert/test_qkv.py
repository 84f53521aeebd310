"""``fused-qkv``: one GEMM of the concatenated weights computes what the three projections do,
on every attention path, forward and backward."""

import pytest
import torch

from benchmarks.bert.attention import bucketed_packing, unpad
from benchmarks.bert.model import BertConfig
from benchmarks.bert.qkv import fuse_qkv
from tests.benchmarks.bert.test_model import _batch, built, sdpa


def _outputs_and_grads(model, batch, extra=(), device="cpu"):
    model.zero_grad()
    with torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda"):
        mlm, nsp = model(*batch, *extra)
    (mlm.float().square().mean() + nsp.float().square().mean()).backward()
    return (mlm.float(), nsp.float()), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("path", [None, sdpa, unpad], ids=["plain", "sdpa", "unpad"])
def test_fused_projection_matches_the_three_on_every_attention_path(path):
    torch.manual_seed(0)
    ref = built(path)
    fused = built(lambda m: (path and path(m), fuse_qkv(m)), ref)
    assert type(fused.bert.encoder.layer[0].attention.self).__name__.startswith("FusedQkv")
    batch = _batch()
    (out_r, grads_r), (out_f, grads_f) = (_outputs_and_grads(m, batch) for m in (ref, fused))
    torch.testing.assert_close(out_f, out_r, atol=1e-6, rtol=1e-5)
    for name, g in grads_r.items():
        torch.testing.assert_close(grads_f[name], g, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_projection_feeds_flash_attention_strided_views_on_gpu():
    """On the GPU the fused q, k, v are strided column views of one matrix: flash attention
    takes them as they are; bf16 against the unfused path within bf16 rounding."""
    torch.manual_seed(0)
    c = BertConfig(vocab_size=61, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=256, max_position_embeddings=16)   # flash's head size 64
    ref = built(unpad, c=c).cuda()
    fused = built(lambda m: (unpad(m), fuse_qkv(m)), ref, c=c).cuda()
    batch = [t.cuda() for t in _batch()]
    pack = [torch.from_numpy(t[0]).cuda() for t in bucketed_packing(batch[2].cpu().numpy(), 1, 8)]
    (out_r, grads_r), (out_f, grads_f) = (_outputs_and_grads(m, batch, pack, "cuda")
                                          for m in (ref, fused))
    torch.testing.assert_close(out_f, out_r, atol=2e-2, rtol=2e-2)
    for name, g in grads_r.items():
        torch.testing.assert_close(grads_f[name], g, atol=2e-2, rtol=5e-2, msg=name)
