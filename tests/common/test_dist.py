"""Two gloo processes: DDP through common.dist averages gradients across ranks."""

import os
import socket

import torch
import torch.multiprocessing as mp

from common import dist


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    env = dist.init_distributed("cpu")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ddp = dist.data_parallel(model, env)
    torch.manual_seed(100 + rank)            # each rank sees different data
    x = torch.randn(5, 3)
    ddp(x).pow(2).sum().backward()
    out[rank] = (x, model.weight.grad.clone(), model.bias.grad.clone())
    dist.shutdown()


def test_gradients_are_averaged_over_two_gloo_processes():
    world = 2
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(world, _free_port(), out), nprocs=world, join=True)
        results = dict(out)
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    grads = []
    for rank in range(world):
        ref.zero_grad()
        ref(results[rank][0]).pow(2).sum().backward()
        grads.append((ref.weight.grad.clone(), ref.bias.grad.clone()))
    mean_w = (grads[0][0] + grads[1][0]) / 2
    mean_b = (grads[0][1] + grads[1][1]) / 2
    for rank in range(world):
        torch.testing.assert_close(results[rank][1], mean_w)
        torch.testing.assert_close(results[rank][2], mean_b)
    assert not torch.allclose(grads[0][0], grads[1][0])  # the ranks really differed


def test_slurm_hostlist_first_host():
    assert dist._first_slurm_host("node[003-005,9],other") == "node003"
    assert dist._first_slurm_host("gpu12") == "gpu12"


def test_single_process_without_launcher(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    env = dist.init_distributed("cpu")
    assert (env.rank, env.world_size, env.device.type) == (0, 1, "cpu")
