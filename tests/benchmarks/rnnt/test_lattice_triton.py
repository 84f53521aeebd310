"""The Triton lattice (``triton-lattice``) against the reference recursion on the GPU: every
cell bit for bit, -inf weights and lattices of one row, one column or one cell included; and
the packed loss's values and gradients through it, with many utterances of varied lengths."""

import math

import pytest
import torch

from benchmarks.rnnt.compiled_loss import CompiledLogProbs
from benchmarks.rnnt.loss import lattice
from benchmarks.rnnt.packed_joint import packed_transducer_loss

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B, T, U1", [(3, 6, 4), (5, 37, 13), (2, 1, 9), (4, 17, 1),
                                      (1, 1, 1), (128, 206, 101), (6, 40, 300)])
def test_triton_lattice_equals_the_reference_bit_for_bit(dtype, B, T, U1):
    from benchmarks.rnnt.lattice_triton import lattice as fused

    g = torch.Generator().manual_seed(B * T + U1)
    wt, wu = (torch.randn(2, B, T, U1, generator=g) * 3).to(dtype)
    wt[:, 0] = wu[..., 0] = -math.inf           # as the loss calls it: no move into row/col 0
    wt[0, T // 2:] = wu[-1, :, U1 // 2:] = -math.inf
    init = torch.randn(B, generator=g).to(dtype)
    wt, wu, init = wt.cuda(), wu.cuda(), init.cuda()
    expected = lattice(wt, wu, init)
    got = fused(wt, wu, init)
    assert got.dtype == dtype and got.shape == (B, T, U1)
    assert torch.equal(got.isneginf(), expected.isneginf())
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_the_packed_loss_through_the_triton_lattice_matches_the_reference():
    from benchmarks.rnnt.lattice_triton import lattice as fused

    g = torch.Generator().manual_seed(21)
    B, V = 24, 129
    enc_lens = torch.randint(1, 160, (B,), generator=g)
    label_lens = torch.randint(0, 70, (B,), generator=g)
    enc_lens[0], label_lens[1], label_lens[2] = 160, 70, 0
    n = int((enc_lens * (label_lens + 1)).sum())
    logits = (torch.randn(n, V, generator=g) * 3).cuda()
    labels = torch.randint(0, V - 1, (B, 70), generator=g).cuda()
    enc_lens, label_lens = enc_lens.cuda(), label_lens.cuda()
    results = []
    for walk in (lattice, fused):
        x = logits.clone().requires_grad_()
        loss = packed_transducer_loss(x, enc_lens, labels, label_lens, reduction="none",
                                      log_probs=CompiledLogProbs.apply, walk=walk)
        (grad,) = torch.autograd.grad(loss.sum(), x)
        results.append((loss, grad))
    (ref_loss, ref_grad), (loss, grad) = results
    assert loss.isfinite().all()
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=0)


def test_new_lengths_compile_no_new_variant():
    """Sizes of 1 and multiples of 16 would each be a Triton specialisation, compiled inside
    whichever timed step first brings them."""
    from benchmarks.rnnt.lattice_triton import _kernel
    from benchmarks.rnnt.lattice_triton import lattice as fused
    from tests.triton_variants import compiled_variants

    def walk(T, U1):
        wt, wu = torch.randn(2, 3, T, U1, device="cuda")
        fused(wt, wu, torch.zeros(3, device="cuda"))

    walk(37, 13)
    before = compiled_variants(_kernel())
    for T, U1 in [(16, 16), (1, 1), (32, 101), (206, 128), (5, 64)]:
        walk(T, U1)
    torch.cuda.synchronize()
    assert compiled_variants(_kernel()) == before
