"""``interaction-backward`` (``benchmarks/dlrm/interaction.py``) against autograd through
``model.lower_dots``: the same products, and their gradient within fp32 rounding, on the plain
and the ``aligned-dense`` interaction, eager, under autocast and compiled (on the CPU)."""

import copy

import pytest
import torch

from benchmarks.dlrm import aligned, interaction
from benchmarks.dlrm.model import DenseArch, lower_dots, parse_mlp


@pytest.mark.parametrize("n, m", [(27, 27), (27, 32), (4, 8)])
def test_the_products_and_their_gradient_are_autograds(n, m):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5, m, 16, generator=g)
    z[:, n:] = 0   # aligned-dense's padding vectors
    w = torch.randn(5, n * (n - 1) // 2, generator=g)
    got_z, want_z = z.clone().requires_grad_(), z.clone().requires_grad_()
    got, want = interaction.lower_dots(got_z, n), lower_dots(want_z, n)
    assert torch.equal(got, want)
    (got * w).sum().backward()
    (want * w).sum().backward()
    assert torch.any(want_z.grad != 0)
    torch.testing.assert_close(got_z.grad, want_z.grad, rtol=1e-6, atol=1e-6)


def test_under_autocast_the_products_and_gradient_take_bmms_dtypes():
    """bf16 as autocast gives ``torch.bmm``; the gradient, rounded once where autograd rounds
    two products and their sum, is closer to the fp32 gradient of the rounded vectors."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(64, 32, 128, generator=g)
    got_z, want_z = z.clone().requires_grad_(), z.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = interaction.lower_dots(got_z, 27), lower_dots(want_z, 27)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)
    w = torch.randn(got.shape, generator=g)
    (got.float() * w).sum().backward()
    (want.float() * w).sum().backward()
    exact_z = z.to(torch.bfloat16).float().requires_grad_()
    (lower_dots(exact_z, 27) * w.to(torch.bfloat16).float()).sum().backward()
    assert got_z.grad.dtype == torch.float32
    error = [(t.grad - exact_z.grad).abs().mean() for t in (got_z, want_z)]
    assert error[0] < error[1], error


@pytest.mark.parametrize("aligned_dense", [False, True], ids=["plain", "aligned-dense"])
def test_the_dense_part_trains_as_without_it_compiled_too(aligned_dense):
    torch.manual_seed(0)
    plain = DenseArch(16, 26, parse_mlp("13-32-16"), parse_mlp("64-1"))
    if aligned_dense:
        aligned.apply(plain)
    ours = copy.deepcopy(plain)
    interaction.apply(ours)
    dense, emb = torch.randn(6, 13), torch.randn(6, 26, 16)
    outs = []
    for arch, forward in ((plain, plain.forward),
                          (ours, torch.compile(ours.forward, backend="aot_eager"))):
        emb_in = emb.clone().requires_grad_()
        out = forward(arch.bottom_mlp(dense), emb_in)
        out.square().sum().backward()
        outs.append((out, emb_in.grad))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-5, atol=1e-6)
    for p, q in zip(plain.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
