"""``fused-lamb`` (``common.fused_lamb.FusedLamb``) against ``ShardedLamb``, its reference, on
the GPU: moments, fp32 master and the model's bf16 copy over several steps, for tensors that
end inside a block and a padded buffer, a tensor whose weights are zero (trust ratio 1),
gradients clipped and not, the step captured as a CUDA graph, and sharded over 2 GPUs."""

import pytest
import torch
import torch.multiprocessing as mp

from common import dist
from common.flat_params import FlatParameters
from common.lamb import LambHyper, ShardedLamb
from tests.common.test_dist import _free_port, _rendezvous

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


def _run(cls, dtype, max_grad_norm, graph=False, rank=0, world=1):
    """``cls``'s optimizer after STEPS steps of the same gradients on every rank (their mean),
    sharded over ``world`` ranks."""
    from common.fused_lamb import FusedLamb
    cls = {"plain": ShardedLamb, "fused": FusedLamb}[cls]
    model = _model()
    flat = FlatParameters(model, world, dtype)
    opt = cls(flat, _decay(model), LambHyper(max_grad_norm=max_grad_norm), rank, world,
              world > 1)
    lr = torch.tensor(0.01, device="cuda")
    torch.manual_seed(1)
    pad = len(flat.grad) - flat.numel   # the shards' padding, whatever the world size
    grads = [torch.cat([torch.randn(flat.numel), torch.zeros(pad)]).cuda() * 0.1
             for _ in range(STEPS)]
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


def _sharded_worker(rank, world, port, out):
    _rendezvous(rank, world, port)
    dist.init_distributed("cuda")
    opt, flat = _run("fused", torch.bfloat16, 1.0, rank=rank, world=world)
    out[rank] = (flat.shard(flat.master, rank).cpu(), flat.data.cpu())
    dist.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_fused_lamb_sharded_over_two_gpus_equals_one():
    """Each rank's shard of the master as one process's, and every rank's gathered bf16
    weights the same."""
    _, single = _run("plain", torch.bfloat16, 1.0)
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_sharded_worker, args=(2, _free_port(), out), nprocs=2, join=True)
        results = dict(out)
    whole = torch.cat([results[r][0] for r in range(2)])[:single.numel].cuda()
    torch.testing.assert_close(whole, single.master[:single.numel], rtol=1e-5, atol=1e-7)
    assert torch.equal(results[0][1], results[1][1])
