"""LAMB: flat/sharded implementation vs the per-tensor reference, on 1 and 2 gloo processes."""

import torch
import torch.multiprocessing as mp

from common import dist
from common.flat_params import FlatParameters
from common.lamb import Lamb, LambHyper, ShardedLamb
from tests.common.test_dist import _free_port, _rendezvous

H = LambHyper(beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, max_grad_norm=1.0)
STEPS = 4


def _model():
    torch.manual_seed(0)
    # sizes chosen so shards of 2 split tensors in the middle, plus padding at the end
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def _decay(model):
    return [not (n.startswith("1.") or n.endswith("bias")) for n, _ in model.named_parameters()]


def _grads(step, rank, world):
    """Per-rank gradients whose mean over ranks is the same for any world size."""
    torch.manual_seed(1000 + step)
    full = [torch.randn(2, *p.shape) * 3 for p in _model().parameters()]  # 2 'samples'
    if world == 1:
        return [g.mean(0) for g in full]
    return [g[rank] for g in full]


def _run_flat(rank, world, sharded=True, dtype=torch.float32, grad_dtype=None):
    model = _model()
    flat = FlatParameters(model, world if sharded else 1, dtype)
    opt = ShardedLamb(flat, _decay(model), H, rank, world, sharded)
    lr = torch.tensor(0.05)
    for step in range(STEPS):
        opt.zero_grad()
        for p, g in zip(flat.params, _grads(step, rank, world)):
            p.grad.add_(g.to(grad_dtype or dtype))
        opt.step(lr)
    if dtype != torch.float32:
        torch.testing.assert_close(flat.data, flat.master.to(dtype), atol=0, rtol=0)
    return [flat.master[o:o + n].view_as(p).clone()
            for p, o, n in zip(flat.params, flat.offsets, flat.sizes)]


def test_bf16_weights_keep_an_fp32_master_updated_like_fp32_lamb():
    """bf16 model weights and gradients: the fp32 master follows fp32 LAMB fed the same
    (bf16-rounded) gradients, and the model's weights are the master rounded to bf16."""
    want = _run_flat(0, 1, grad_dtype=torch.bfloat16)
    got = _run_flat(0, 1, dtype=torch.bfloat16)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def _reference():
    model = _model()
    params = list(model.parameters())
    opt = Lamb(params, _decay(model), H)
    lr = torch.tensor(0.05)
    for step in range(STEPS):
        for p, g in zip(params, _grads(step, 0, 1)):
            p.grad = g.clone()
        opt.step(lr)
    return [p.detach().clone() for p in params]


def test_flat_lamb_matches_reference_on_one_process():
    ref = _reference()
    got = _run_flat(0, 1)
    assert any(not torch.equal(a, b) for a, b in zip(ref, _model().parameters()))  # it moved
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_an_infinite_clip_norm_does_not_clip():
    """``max_grad_norm`` inf (RNN-T's RCP at global batch 1024: no clipping) steps as an
    unreachably large norm does, and finitely."""
    results = []
    for max_norm in (float("inf"), 1e30):
        model = _model()
        params = list(model.parameters())
        h = LambHyper(beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01,
                      max_grad_norm=max_norm)
        opt = Lamb(params, _decay(model), h)
        for step in range(STEPS):
            for p, g in zip(params, _grads(step, 0, 1)):
                p.grad = g * 100
            opt.step(torch.tensor(0.05))
        results.append([p.detach().clone() for p in params])
    for a, b in zip(*results):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_trust_ratio_and_clipping_matter():
    """A weight-decayed tensor moves by lr * |w| per step (LAMB's ratio), not by lr * |u|."""
    model = _model()
    w0 = model[0].weight.detach().clone()
    after = _run_flat(0, 1)[0]
    first_step_change = None
    model = _model()
    flat = FlatParameters(model)
    opt = ShardedLamb(flat, _decay(model), H)
    for p, g in zip(flat.params, _grads(0, 0, 1)):
        p.grad.add_(g)
    opt.step(torch.tensor(0.05))
    first_step_change = (model[0].weight.detach() - w0).norm()
    torch.testing.assert_close(first_step_change, 0.05 * w0.norm(), rtol=1e-5, atol=0)
    assert not torch.equal(after, w0)


def _worker(rank, world, port, sharded, out):
    _rendezvous(rank, world, port)
    dist.init_distributed("cpu")
    out[(rank, sharded)] = _run_flat(rank, world, sharded)
    dist.shutdown()


def test_sharded_lamb_on_two_gloo_processes_matches_single_process():
    world = 2
    single = _run_flat(0, 1)
    with mp.Manager() as manager:
        out = manager.dict()
        for sharded in (True, False):
            mp.spawn(_worker, args=(world, _free_port(), sharded, out), nprocs=world, join=True)
        results = dict(out)
    for key, params in results.items():
        for a, b in zip(params, single):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=str(key))
