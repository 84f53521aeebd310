"""``fused-lookups`` (``benchmarks/dlrm/lookups_triton.py``) against the reference
``HybridEmbedding`` on one rank: lookups, gradients and three SGD steps of both tables, with
power-law repeats (a frequent row met more often than a chunk holds). On the GPU, or on the CPU
under Triton's interpreter (``TRITON_INTERPRET=1`` with Triton installed). Several ranks:
``tests/benchmarks/dlrm/test_hybrid.py``."""

import os

import pytest
import torch

from benchmarks.dlrm.fused_sgd import sparse_sgd_, table_sgd_
from benchmarks.dlrm.hybrid import HybridEmbedding, frequent_rows

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRETED),
                                 reason="needs CUDA (or TRITON_INTERPRET=1 and Triton)")]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SIZES, DIM, BATCH = [300, 5, 1000, 40], 16, 256


def _ids(g: torch.Generator) -> torch.Tensor:
    """Power-law ids: row 0 of each table about a third of the time."""
    return torch.stack([(torch.rand(BATCH, generator=g) ** 4 * n).long() for n in SIZES], 1)


def _pair(low_precision):
    from benchmarks.dlrm import lookups_triton

    stats = _ids(torch.Generator().manual_seed(0))
    made = []
    for _ in range(2):
        emb = HybridEmbedding(SIZES, DIM, frequent_rows(stats, SIZES, 3.0), 0, 1, 7, DEVICE)
        if low_precision is not None:
            emb.keep_low_precision(low_precision)
        made.append(emb)
    lookups_triton.apply(made[1])
    return made


@pytest.mark.parametrize("low_precision", [torch.bfloat16, None], ids=["bf16-copy", "fp32"])
def test_fused_lookups_train_as_the_reference(low_precision):
    ref, fused = _pair(low_precision)
    assert 0 < ref.freq_weight.shape[0] < sum(SIZES)
    g = torch.Generator().manual_seed(1)
    lr = torch.tensor(0.2, device=DEVICE)
    for step in range(3):
        ids = _ids(g).to(DEVICE)
        w = torch.randn(BATCH, len(SIZES), DIM, generator=g).to(DEVICE)
        grads = []
        for emb in (ref, fused):
            out, _ = emb(emb.plan(ids, [0, BATCH]))
            (out.float() * w).sum().backward()
            grads.append((out.detach(), emb.frequent_grad(), emb.rare_grad()))
        (out_ref, freq_ref, rare_ref), (out_fused, freq_fused, rare_fused) = grads
        if step == 0:   # later, the tables differ by the frequent sums' order
            assert torch.equal(out_fused, out_ref)
        torch.testing.assert_close(out_fused, out_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(freq_fused, freq_ref, rtol=1e-5, atol=1e-5)
        assert rare_ref[2] is None and rare_fused[2] is not None   # read in place
        for emb, freq, rare in ((ref, freq_ref, rare_ref), (fused, freq_fused, rare_fused)):
            table_sgd_(emb.freq_weight, emb.freq_lp, freq, lr)
            sparse_sgd_(emb.rare_weight, emb.rare_lp, *rare[:2], lr, rare[2])
        torch.testing.assert_close(fused.freq_weight, ref.freq_weight, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused.rare_weight, ref.rare_weight, rtol=1e-6, atol=1e-6)


def test_the_plan_codes_every_lookup_once():
    from benchmarks.dlrm.lookups_triton import CHUNK

    _, fused = _pair(None)
    ids = _ids(torch.Generator().manual_seed(2)).to(DEVICE)
    plan = fused.plan(ids, [0, BATCH])
    x = plan.extra
    flat = (ids + fused.offsets).reshape(-1)
    frequent = fused.freq_map[flat].long()
    want = torch.where(frequent >= 0, frequent, -1 - flat)   # one rank: rare row = global row
    assert torch.equal(x["code"], want)
    starts, rows = x["chunk_starts"], x["chunk_rows"]
    sizes = starts[1:] - starts[:-1]
    assert int(sizes.min()) >= 1 and int(sizes.max()) == CHUNK   # the hottest row is cut
    assert torch.equal(torch.sort(frequent[x["freq_order"]]).values,
                       torch.sort(frequent[frequent >= 0]).values)
    for c in range(len(rows)):
        assert bool((frequent[x["freq_order"][starts[c]:starts[c + 1]]] == rows[c]).all())
