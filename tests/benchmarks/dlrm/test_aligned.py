"""``aligned-dense`` (``benchmarks/dlrm/aligned.py``) against the plain dense part: the same
outputs, gradients and parameters, on the CPU in fp32."""

import copy

import torch

from benchmarks.dlrm import aligned
from benchmarks.dlrm.model import DenseArch, dot_interaction, parse_mlp


def test_the_interaction_is_the_plain_one_then_zeros():
    g = torch.Generator().manual_seed(0)
    bottom, emb = torch.randn(5, 16, generator=g), torch.randn(5, 26, 16, generator=g)
    plain = dot_interaction(bottom, emb)                    # 16 + 351 = 367 columns
    got = aligned.aligned_interaction(bottom, emb)
    assert got.shape == (5, 368)
    torch.testing.assert_close(got[:, :367], plain, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[:, 367:], torch.zeros(5, 1))


def test_the_aligned_dense_part_trains_as_the_plain_one():
    torch.manual_seed(0)
    plain = DenseArch(16, 26, parse_mlp("13-32-16"), parse_mlp("64-1"))
    ours = copy.deepcopy(plain)
    aligned.apply(ours)
    assert [p.shape for p in ours.parameters()] == [p.shape for p in plain.parameters()]
    dense, emb = torch.randn(6, 13), torch.randn(6, 26, 16)
    outs = []
    for arch in (plain, ours):
        out = arch(arch.bottom_mlp(dense), emb)
        out.square().sum().backward()
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    for p, q in zip(plain.parameters(), ours.parameters()):
        assert p.grad is not None and torch.any(p.grad != 0)
        # fp32 sums over other GEMM shapes: a few 1e-6 apart where terms cancel (AMD EPYC)
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5,
                                   atol=1e-5 * float(p.grad.abs().max()))
