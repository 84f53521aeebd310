"""common.dist on two gloo processes: DDP averages gradients across ranks; variable-size
results (tensors or picklable objects) gather on rank 0."""

import gc
import os
import socket
import time
import weakref
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp

from common import dist
from common.errors import UserError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rendezvous(rank: int, world: int, port: int) -> None:
    """The environment a spawned process needs to join a ``world``-process group on this
    host's ``port`` as ``rank`` (what torchrun sets)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))


def _worker(rank, world, port, out):
    _rendezvous(rank, world, port)
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


def _detections(rank: int, n: int) -> dict[str, torch.Tensor]:
    """``n`` rows of a detector's output on ``rank``, in several dtypes."""
    i = torch.arange(n) + 1000 * rank
    return {"boxes": torch.stack([i, i + 1, i + 2, i + 3], 1).float() / 8,
            "scores": (i / 4096).to(torch.bfloat16),
            "labels": i + 2**40,                             # int64 beyond 32 bits
            "crowd": i % 2 == 1}


# rows per rank in each case: one rank empty, the other rank empty, both empty
COUNTS = [(3, 0), (0, 2), (0, 0)]


def _gather_worker(rank, world, port, out):
    _rendezvous(rank, world, port)
    dist.init_distributed("cpu")
    results = []
    for counts in COUNTS:
        rows = _detections(rank, counts[rank])
        results.append((dist.gather_row_dict(rows),
                        dist.gather_rows(rows["boxes"][:, 1:3])))   # a strided view
    out[rank] = results, dist.gather_objects([{"image": rank, "rle": "x" * rank}] * rank)
    dist.shutdown()


def test_variable_rows_gather_on_rank_0_over_two_gloo_processes():
    world = 2
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_gather_worker, args=(world, _free_port(), out), nprocs=world, join=True)
        results, objects = zip(*(out[rank] for rank in range(world)))
    assert results[1] == [(None, None)] * len(COUNTS)
    assert objects == ([[], [{"image": 1, "rle": "x"}]], None)    # picklable objects too
    for counts, (rows, boxes) in zip(COUNTS, results[0]):
        parts = [_detections(rank, n) for rank, n in enumerate(counts)]
        for key, want in parts[0].items():
            got = rows[key]
            assert got.dtype == want.dtype and got.shape == (sum(counts), *want.shape[1:])
            assert torch.equal(got, torch.cat([p[key] for p in parts]))
        assert torch.equal(boxes, torch.cat([p["boxes"][:, 1:3] for p in parts]))


def test_gather_on_one_process_returns_the_input():
    t = torch.ones(2, 4)
    rows = {"boxes": t}
    assert dist.gather_rows(t) is t and dist.gather_row_dict(rows) is rows
    assert dist.gather_objects(rows) == [rows]


def test_slurm_hostlist_first_host():
    assert dist._first_slurm_host("node[003-005,9],other") == "node003"
    assert dist._first_slurm_host("gpu12") == "gpu12"


def test_single_process_without_launcher(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    env = dist.init_distributed("cpu")
    assert (env.rank, env.world_size, env.device.type) == (0, 1, "cpu")


def test_local_world_size_from_the_launcher(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "LOCAL_RANK",
              "LOCAL_WORLD_SIZE", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(k, raising=False)
    assert dist._env_from_launcher() == (0, 1, 0, 1)
    monkeypatch.setenv("RANK", "9")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert dist._env_from_launcher() == (9, 16, 1, 8)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")      # never fewer local ranks than this one's index
    assert dist._env_from_launcher() == (9, 16, 1, 2)
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("MASTER_ADDR", "localhost")   # the SLURM branch sets these if unset
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    assert dist._env_from_launcher() == (5, 8, 1, 4)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4(x2)")
    assert dist._env_from_launcher() == (5, 8, 1, 2)


def test_collective_timeout_is_5_minutes_unless_set(monkeypatch):
    """torch's gloo default (30 minutes) held a rank whose peer was gone that long."""
    monkeypatch.delenv(dist.TIMEOUT_VARIABLE, raising=False)
    assert dist.collective_timeout() == timedelta(seconds=300)
    monkeypatch.setenv(dist.TIMEOUT_VARIABLE, "20")
    assert dist.collective_timeout() == timedelta(seconds=20)
    for bad in ("0", "-5", "1.5", "abc"):
        monkeypatch.setenv(dist.TIMEOUT_VARIABLE, bad)
        with pytest.raises(UserError, match=f"COLLECTIVE_TIMEOUT_S={bad} is not a positive"):
            dist.collective_timeout()


def _hung_peer(rank: int, port: int, seconds: str, out) -> None:
    """Rank 1 joins the group and then hangs (alive, its connections open, no collective);
    rank 0 reports how its sum ended and after how long."""
    os.environ[dist.TIMEOUT_VARIABLE] = seconds
    _rendezvous(rank, 2, port)
    dist.init_distributed("cpu")
    if rank == 1:
        time.sleep(600)
        return
    start = time.monotonic()
    try:
        dist.all_reduce_sum(torch.ones(1))
        out.put(("summed", time.monotonic() - start))
    except Exception as exc:  # the timeout, reported to the test
        out.put((type(exc).__name__, time.monotonic() - start))


def test_a_collective_fails_after_the_timeout_when_a_peer_hangs():
    """A peer that stops answering without closing its connections (a partition, a hung
    process) fails the others' collective after COLLECTIVE_TIMEOUT_S, not torch's 30 minutes."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_hung_peer, args=(r, port, "3", out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        outcome, seconds = out.get(timeout=120)   # two torch imports on 2 busy cores
    finally:
        for p in procs:
            p.kill()
            p.join()
    assert outcome != "summed" and 3 <= seconds < 20, (outcome, seconds)


def test_launcher_rank_reads_torchrun_then_slurm_and_changes_nothing(monkeypatch):
    for key in ("RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    assert dist.launcher_rank() == 0
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert dist.launcher_rank() == 3
    monkeypatch.setenv("RANK", "5")
    before = dict(os.environ)
    assert dist.launcher_rank() == 5 and dict(os.environ) == before


class _Cycle:
    def __init__(self, ddp):
        self.ddp, self.me = ddp, self


def _frozen_worker(rank, world, port, out):
    _rendezvous(rank, world, port)
    env = dist.init_distributed("cpu")
    cycle = _Cycle(dist.data_parallel(torch.nn.Linear(3, 2), env))
    alive = weakref.ref(cycle)
    del cycle
    gc.freeze()                   # what --gc-freeze does after setup
    dist.shutdown()
    out[rank] = alive() is None, gc.get_freeze_count()


def test_shutdown_frees_cycles_that_gc_freeze_moved_out_of_reach():
    """A cycle holding a DDP module (and through it the group's finished work) is freed
    before the group is destroyed, even when --gc-freeze froze it."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_frozen_worker, args=(2, _free_port(), out), nprocs=2, join=True)
        assert dict(out) == {0: (True, 0), 1: (True, 0)}
