"""Group batch norm (``--bn-group 2``) over two processes (gloo on the CPU, NCCL and
``nn.SyncBatchNorm`` on 2 GPUs) equals single-process batch norm on the concatenated
batch: SSD300's outputs, its gradients and the running statistics, in fp64 (in fp32 both
sides differ from the exact gradients by up to 1% of a tensor's largest element at this
batch of 4, which would hide a real error)."""

import pytest
import torch
import torch.multiprocessing as mp

from benchmarks.ssd.model import SSD300
from common import dist
from common.group_bn import GroupBatchNorm2d
from tests.common.test_dist import _free_port, _rendezvous

WIDTH, CLASSES, SIZE, PER_RANK = 8, 4, 300, 2


def _inputs() -> torch.Tensor:
    return torch.randn(2 * PER_RANK, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1),
                       dtype=torch.float64)


def _model() -> SSD300:
    torch.manual_seed(0)
    return SSD300(CLASSES, WIDTH).double()


def _loss(model, images):
    loc, conf = model(images)
    return (loc.pow(2).mean() + conf.sin().mean()), loc, conf


def _worker(rank, world, port, device, out):
    _rendezvous(rank, world, port)
    env = dist.init_distributed(device)
    model = dist.group_norm_layers(_model().to(env.device), env, 2)
    layer = torch.nn.SyncBatchNorm if device == "cuda" else GroupBatchNorm2d
    assert any(isinstance(m, layer) for m in model.modules())
    images = _inputs()[rank * PER_RANK:(rank + 1) * PER_RANK].to(env.device)
    loss, loc, conf = _loss(model, images)
    # each rank's loss is its half's mean: the sum over ranks / 2 is the whole batch's mean
    (loss / world).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for g in grads.values():
        torch.distributed.all_reduce(g)
    bn = {n: b.cpu() for n, b in model.named_buffers() if "running" in n}
    out[rank] = (loc.detach().cpu(), conf.detach().cpu(),
                 {n: g.cpu() for n, g in grads.items()}, bn)
    dist.shutdown()


@pytest.mark.parametrize("device", [
    pytest.param("cpu", marks=pytest.mark.slow),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="needs 2 GPUs")])])
def test_group_bn_over_two_ranks_matches_one_process_on_the_whole_batch(device):
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(2, _free_port(), device, out), nprocs=2, join=True)
        results = dict(out)
    model = _model()
    loss, loc, conf = _loss(model, _inputs())
    # the split halves' means of the loss terms average to the whole batch's mean
    loss.backward()
    torch.testing.assert_close(torch.cat([results[r][0] for r in (0, 1)]), loc.detach(),
                               rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(torch.cat([results[r][1] for r in (0, 1)]), conf.detach(),
                               rtol=1e-9, atol=1e-9)
    for name, p in model.named_parameters():
        torch.testing.assert_close(results[0][2][name], p.grad, rtol=1e-7, atol=1e-10,
                                   msg=lambda m, n=name: f"{n}: {m}")
    for name, buf in model.named_buffers():
        if "running" in name:
            torch.testing.assert_close(results[0][3][name], buf, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(results[1][3][name], buf, rtol=1e-9, atol=1e-12)
