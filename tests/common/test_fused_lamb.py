"""``fused-lamb`` (``common.fused_lamb.FusedLamb``) against ``ShardedLamb``, its reference, on
the GPU: moments, fp32 master and the model's bf16 copy over several steps, for tensors that
end inside a block and a padded buffer, a tensor whose weights are zero (trust ratio 1),
gradients clipped and not, and the step captured as a CUDA graph."""

import pytest
import torch

from common.flat_params import FlatParameters
from common.lamb import LambHyper, ShardedLamb

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

STEPS = 5


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 70), torch.nn.LayerNorm(70),
                                torch.nn.Linear(70, 4099), torch.nn.Linear(4099, 3))
    torch.nn.init.zeros_(model[3].weight)   # |w| = 0: trust ratio 1
    return model.cuda()


def _decay(model):
    return [not (n.startswith("1.") or n.endswith("bias")) for n, _ in model.named_parameters()]


def _run(cls, dtype, max_grad_norm, graph=False):
    from common.fused_lamb import FusedLamb
    cls = {"plain": ShardedLamb, "fused": FusedLamb}[cls]
    model = _model()
    flat = FlatParameters(model, 1, dtype)
    flat.master[-5:] = 0   # nothing in the padding, which no tensor owns
    opt = cls(flat, _decay(model), LambHyper(max_grad_norm=max_grad_norm), 0, 1, False)
    lr = torch.tensor(0.01, device="cuda")
    torch.manual_seed(1)
    grads = [torch.randn(flat.grad.shape).cuda() * 0.1 for _ in range(STEPS)]
    given = torch.empty_like(flat.grad)

    def step():
        flat.grad.copy_(given)
        opt.step(lr)

    for i, grad in enumerate(grads):
        given.copy_(grad)
        if graph and i == 1:   # Triton compiled in step 0, outside the capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
        if graph and i >= 1:
            g.replay()
        else:
            step()
    torch.cuda.synchronize()
    return opt, flat


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("max_grad_norm", [1.0, float("inf")], ids=["clipped", "unclipped"])
def test_fused_lamb_equals_sharded_lamb(dtype, max_grad_norm):
    want_opt, want = _run("plain", dtype, max_grad_norm)
    got_opt, got = _run("fused", dtype, max_grad_norm)
    torch.testing.assert_close(got_opt.m, want_opt.m, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(got_opt.v, want_opt.v, rtol=1e-5, atol=1e-10)
    torch.testing.assert_close(got.master, want.master, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got.data, got.master.to(dtype), rtol=0, atol=0)
    start = FlatParameters(_model(), 1).master
    assert (got.master - start).abs().max() > 1e-3   # the weights moved


def test_fused_lamb_captured_equals_eager():
    _, eager = _run("fused", torch.bfloat16, 1.0)
    _, graphed = _run("fused", torch.bfloat16, 1.0, graph=True)
    torch.testing.assert_close(graphed.master, eager.master, rtol=0, atol=0)
    torch.testing.assert_close(graphed.data, eager.data, rtol=0, atol=0)
