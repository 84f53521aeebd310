"""``triton-gelu`` (``benchmarks/bert/gelu_triton.py``) against ``F.gelu(z + bias)`` in fp32
autograd: the output and both gradients, for a width and a row count that are not multiples
of a program's tile, and in bf16 within its rounding. On the GPU, or on the CPU under
Triton's interpreter (``TRITON_INTERPRET=1`` with Triton installed)."""

import os

import pytest
import torch
import torch.nn.functional as F

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRETED),
                                 reason="needs CUDA (or TRITON_INTERPRET=1 and Triton)")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("rows, n, dtype", [(300, 520, torch.float32), (40, 256, torch.bfloat16)],
                         ids=["fp32", "bf16"])
def test_the_kernels_equal_the_reference(rows, n, dtype):
    from benchmarks.bert.gelu_triton import BiasGelu

    g = torch.Generator().manual_seed(0)
    z, bias, dy = (torch.randn(s, generator=g).to(DEVICE, dtype) * 2
                   for s in ((2, rows // 2, n), (n,), (2, rows // 2, n)))
    z.requires_grad_(), bias.requires_grad_()
    out = BiasGelu.apply(z, bias)
    want = F.gelu(z.float() + bias.float())
    got_grads = torch.autograd.grad(out, (z, bias), dy)
    want_grads = torch.autograd.grad(want, (z, bias), dy.float())
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert out.dtype == dtype and out.shape == z.shape
    torch.testing.assert_close(out.float(), want, **tol)
    torch.testing.assert_close(got_grads[0].float(), want_grads[0].float(), **tol)
    bias_tol = tol if dtype == torch.float32 else dict(atol=0.5, rtol=2e-2)   # a sum of 40
    torch.testing.assert_close(got_grads[1].float(), want_grads[1].float(), **bias_tol)
