"""``triton-gelu`` (``benchmarks/bert/gelu_triton.py``) against ``F.gelu(z + bias)`` in fp64
autograd: the output and the input and bias gradients, for row and column counts that are
not multiples of a program's tile and for no rows; then the whole model's outputs and
gradients against the plain model's. On the GPU (fp32, and bf16 within its rounding), or on
the CPU under Triton's interpreter (``TRITON_INTERPRET=1``, fp32)."""

import os

import pytest
import torch
import torch.nn.functional as F

from benchmarks.bert.model import Intermediate, swap_class
from tests.benchmarks.bert.test_model import _batch, built
from tests.benchmarks.bert.test_qkv import _outputs_and_grads

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRETED),
                                 reason="needs CUDA (or TRITON_INTERPRET=1 and Triton)")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("rows, n", [(130, 200), (70, 64), (0, 64)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernels_equal_autograd(rows, n, dtype):
    from benchmarks.bert.gelu_triton import BiasGelu

    g = torch.Generator().manual_seed(0)
    z, bias, dh = (torch.randn(s, generator=g) * 3 for s in ((2, rows, n), (n,), (2, rows, n)))
    z, bias = (t.to(DEVICE, dtype).requires_grad_() for t in (z, bias))
    got = BiasGelu.apply(z, bias)
    assert got.dtype == dtype
    ref = [t.detach().double().requires_grad_() for t in (z, bias)]
    want = F.gelu(ref[0] + ref[1])
    grads = torch.autograd.grad(got, (z, bias), dh.to(DEVICE, dtype))
    want_grads = torch.autograd.grad(want, ref, dh.to(DEVICE).double())
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(got.double(), want, **tol)
    for name, a, e in zip(("z", "bias"), grads, want_grads):
        assert a.dtype == dtype
        # the bias gradient: a sum over 2 * rows, each term within the tolerance
        scale = max(1, 2 * rows) if name == "bias" and dtype != torch.float32 else 1
        torch.testing.assert_close(a.double(), e, atol=tol["atol"] * scale, rtol=tol["rtol"],
                                   msg=name)


def test_the_model_with_it_equals_the_plain_model():
    from benchmarks.bert.gelu_triton import TritonGeluIntermediate

    torch.manual_seed(0)
    ref = built().to(DEVICE)
    fast = built(lambda m: swap_class(m, Intermediate, TritonGeluIntermediate), ref).to(DEVICE)
    assert isinstance(fast.bert.encoder.layer[0].intermediate, TritonGeluIntermediate)
    batch = [t.to(DEVICE) for t in _batch()]
    (out_r, grads_r), (out_f, grads_f) = (_outputs_and_grads(m, batch) for m in (ref, fast))
    torch.testing.assert_close(out_f, out_r, atol=1e-5, rtol=1e-5)
    for name, g in grads_r.items():
        torch.testing.assert_close(grads_f[name], g, atol=1e-5, rtol=1e-4, msg=name)
