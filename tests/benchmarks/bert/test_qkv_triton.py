"""``triton-qkv`` (``benchmarks/bert/qkv_triton.py``) against ``fused-qkv``'s autograd path,
``F.linear(x, w, b).chunk(3)``: the three outputs and the data, weight and bias gradients,
for a hidden size that is a power of two and one that is not, row counts that are not a
multiple of a join program's and gradients that are strided views or already joined; then
the whole model's gradients. On the GPU, or on the CPU under Triton's interpreter
(``TRITON_INTERPRET=1``)."""

import os

import pytest
import torch
import torch.nn.functional as F

from benchmarks.bert.qkv import fuse_qkv
from tests.benchmarks.bert.test_model import _batch, built
from tests.benchmarks.bert.test_qkv import _outputs_and_grads

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRETED),
                                 reason="needs CUDA (or TRITON_INTERPRET=1 and Triton)")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("rows, h", [(130, 64), (70, 40), (1100, 32)])   # 1100: 3 programs
@pytest.mark.parametrize("layout", ["contiguous", "strided", "thirds"])
def test_the_join_equals_autograd(rows, h, layout):
    from benchmarks.bert.qkv_triton import ProjectQkv, _side_by_side

    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g).to(DEVICE).requires_grad_()
               for s in ((2, rows, h), (3 * h, h), (3 * h,)))
    # output gradients: contiguous, each a column slice of a wider matrix, or the thirds of
    # one [rows, 3h] matrix (triton-attention's, not joined again)
    wide = torch.randn(3, 2, rows, 2 * h, generator=g).to(DEVICE)
    dys = [d[..., :h] if layout == "strided" else d[..., :h].contiguous() for d in wide]
    if layout == "thirds":
        dys = list(torch.cat(dys, -1).chunk(3, -1))
    assert _side_by_side([d.reshape(-1, h) for d in dys]) == (layout == "thirds")
    got = ProjectQkv.apply(x, w, b)
    want = F.linear(x, w, b).chunk(3, dim=-1)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)
    for name, a, e in zip(("x", "weight", "bias"), torch.autograd.grad(got, (x, w, b), dys),
                          torch.autograd.grad(want, (x, w, b), dys)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-5, msg=name)


def test_the_model_with_it_equals_fused_qkv():
    from benchmarks.bert.qkv_triton import triton_qkv

    torch.manual_seed(0)
    ref = built(fuse_qkv).to(DEVICE)
    fast = built(lambda m: (fuse_qkv(m), triton_qkv(m)), ref).to(DEVICE)
    assert type(fast.bert.encoder.layer[0].attention.self).__name__.startswith("TritonQkvFusedQkv")
    batch = [t.to(DEVICE) for t in _batch()]
    (out_r, grads_r), (out_f, grads_f) = (_outputs_and_grads(m, batch) for m in (ref, fast))
    torch.testing.assert_close(out_f, out_r, atol=1e-5, rtol=1e-5)
    for name, g in grads_r.items():
        torch.testing.assert_close(grads_f[name], g, atol=1e-5, rtol=1e-4, msg=name)
