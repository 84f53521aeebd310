"""Hybrid embeddings over 2 gloo processes == one plain nn.EmbeddingBag per table; with
``fused-lookups``' kernels under Triton's interpreter too (``TRITON_INTERPRET=1``)."""

import math
import os

import pytest
import torch
import torch.multiprocessing as mp

from benchmarks.dlrm.data import split_bounds
from benchmarks.dlrm.fused_sgd import hybrid_update
from benchmarks.dlrm.hybrid import HybridEmbedding, Plan, compute_plan, frequent_rows
from benchmarks.dlrm.model import PlainEmbeddings, table_chunks
from common import dist
from tests.common.test_dist import _free_port, _rendezvous

SIZES = [7, 3, 50, 1, 20]
DIM, BATCH, SEED = 4, 10, 5


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randint(0, n, (BATCH,), generator=g) for n in SIZES], 1)
    weight = torch.randn(BATCH, len(SIZES), DIM, generator=g)   # d loss / d output
    return ids, weight


def _stats():
    g = torch.Generator().manual_seed(1)
    return torch.stack([torch.randint(0, n, (40,), generator=g) ** 2 % n for n in SIZES], 1)


def _worker(rank, world, port, threshold, fused, out):
    _rendezvous(rank, world, port)
    dist.init_distributed("cpu")
    ids, weight = _batch()
    emb = HybridEmbedding(SIZES, DIM, frequent_rows(_stats(), SIZES, threshold), rank, world,
                          SEED, torch.device("cpu"))
    if fused:
        from benchmarks.dlrm import lookups_triton
        lookups_triton.apply(emb)
    bounds = split_bounds(BATCH, world)
    plan = emb.plan(ids, bounds)
    lookups, _ = emb(plan)
    (lookups * weight[bounds[rank]:bounds[rank + 1]]).sum().backward()
    freq_grad = dist.all_reduce_sum(emb.frequent_grad())
    rows, grads = emb.rare_grad()
    out[rank] = dict(lookups=lookups.detach(), freq_grad=freq_grad,
                     freq_map=emb.freq_map.clone(), rows=rows, grads=grads,
                     n_frequent=emb.freq_weight.shape[0])
    dist.shutdown()


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="fused-lookups: TRITON_INTERPRET=1"))],
    ids=["reference", "fused-lookups"])
@pytest.mark.parametrize("threshold", [0.0, 2.0, 4.0, math.inf])
def test_two_gloo_ranks_match_plain_embedding_bag(threshold, fused):
    world = 2
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(world, _free_port(), threshold, fused, out), nprocs=world,
                 join=True)
        res = dict(out)
    ids, weight = _batch()
    plain = PlainEmbeddings(SIZES, DIM, SEED, torch.device("cpu"), sparse=False)
    looked = plain(ids)
    (looked * weight).sum().backward()
    bounds = split_bounds(BATCH, world)
    torch.testing.assert_close(torch.cat([res[r]["lookups"] for r in range(world)]),
                               looked.detach())
    # Reassemble the whole gradient from the replicated and the sharded rows.
    total = sum(SIZES)
    grad = torch.zeros(total, DIM)
    fmap = res[0]["freq_map"].long()
    frequent = torch.nonzero(fmap >= 0).squeeze(1)
    grad[frequent] += res[0]["freq_grad"][fmap[frequent]]
    torch.testing.assert_close(res[0]["freq_grad"], res[1]["freq_grad"])
    for r in range(world):   # fused-lookups' padded exchange serves row -1: skipped
        rows, keep = res[r]["rows"], res[r]["rows"] >= 0
        grad.index_add_(0, rows[keep] * world + r, res[r]["grads"][keep])
    want = torch.cat([bag.weight.grad for bag in plain.tables])
    torch.testing.assert_close(grad, want)
    n_freq = res[0]["n_frequent"]
    if threshold == 0:
        assert n_freq == total                        # pure data parallel
    elif threshold == math.inf:
        assert n_freq == 0                            # pure model parallel
    else:
        assert 0 < n_freq < total
    assert bounds == [0, 5, 10]


def _update_worker(rank, world, port, frequent_dtype, out):
    _rendezvous(rank, world, port)
    dist.init_distributed("cpu")
    ids, weight = _batch()
    emb = HybridEmbedding(SIZES, DIM, frequent_rows(_stats(), SIZES, 2.0), rank, world, SEED,
                          torch.device("cpu"))
    bounds = split_bounds(BATCH, world)
    lookups, _ = emb(emb.plan(ids, bounds))
    (lookups * weight[bounds[rank]:bounds[rank + 1]]).sum().backward()
    before, mine = emb.freq_weight.clone(), emb.frequent_grad()
    dense = torch.zeros(3, requires_grad=True)
    dense.grad = torch.full((3,), float(rank + 1))
    hybrid_update([dense], emb, torch.tensor(0.5), True, frequent_dtype=frequent_dtype)
    out[rank] = dict(before=before, mine=mine, after=emb.freq_weight.clone(),
                     dense=dense.detach().clone())
    dist.shutdown()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_frequent_gradient_is_summed_over_the_ranks_in_the_dtype_asked(dtype):
    """``bf16-frequent-grads``: each rank's frequent gradient rounded to bf16 and summed (two
    ranks: one more rounding), added to the fp32 rows; fp32 (the reference) sums exactly."""
    world = 2
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_update_worker, args=(world, _free_port(), dtype, out), nprocs=world,
                 join=True)
        res = dict(out)
    mine = [res[r]["mine"].to(dtype) for r in range(world)]
    summed = (mine[0].float() + mine[1].float()).to(dtype).float()
    assert summed.abs().sum() > 0
    for r in range(world):
        torch.testing.assert_close(res[r]["after"], res[r]["before"] - 0.5 * summed,
                                   rtol=0, atol=1e-6)
        torch.testing.assert_close(res[r]["dense"], torch.full((3,), -1.5))   # -0.5 * (1 + 2)
    if dtype == torch.bfloat16:   # the rounding is there: rows move off the fp32 sum's
        exact = res[0]["mine"] + res[1]["mine"]
        assert not torch.equal(res[0]["after"], res[0]["before"] - 0.5 * exact)
        torch.testing.assert_close(summed, exact, rtol=2 ** -7, atol=1e-6)


def _direct_plan(ids, bounds, rank, world, offsets, fmap) -> Plan:
    """The plan by explicit loops over samples and tables."""
    T = ids.shape[1]
    freq_pos, freq_rows, recv = [], [], {r: [] for r in range(world)}
    serve = {r: [] for r in range(world)}
    for dest in range(world):
        for s in range(bounds[dest], bounds[dest + 1]):
            for t in range(T):
                g = int(ids[s, t]) + offsets[t]
                pos = (s - bounds[dest]) * T + t
                if fmap[g] >= 0:
                    if dest == rank:
                        freq_pos.append(pos)
                        freq_rows.append(int(fmap[g]))
                    continue
                if dest == rank:
                    recv[g % world].append(pos)
                if g % world == rank:
                    serve[dest].append(g // world)
    flat = lambda d: [x for r in range(world) for x in d[r]]  # noqa: E731
    return Plan(bounds[rank + 1] - bounds[rank], torch.tensor(freq_pos), torch.tensor(freq_rows),
                torch.tensor(flat(recv)), [len(recv[r]) for r in range(world)],
                torch.tensor(flat(serve)), [len(serve[r]) for r in range(world)])


@pytest.mark.parametrize("world", [1, 2, 3])
def test_index_precomputation_equals_direct_computation(world):
    g = torch.Generator().manual_seed(world)
    ids = torch.stack([torch.randint(0, n, (11,), generator=g) for n in SIZES], 1)
    offsets = [0, 7, 10, 60, 61]
    fmap = torch.full((sum(SIZES),), -1, dtype=torch.int32)
    picked = frequent_rows(_stats(), SIZES, 2.0)
    fmap[picked] = torch.arange(picked.numel(), dtype=torch.int32)
    bounds = split_bounds(11, world)
    for rank in range(world):
        got = compute_plan(ids, bounds, rank, world, torch.tensor(offsets), fmap)
        want = _direct_plan(ids, bounds, rank, world, offsets, fmap)
        assert got.local_batch == want.local_batch
        assert got.recv_counts == want.recv_counts and got.send_counts == want.send_counts
        for name in ("freq_pos", "freq_rows", "recv_pos", "serve_rows"):
            assert getattr(got, name).tolist() == getattr(want, name).tolist(), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_plan_on_the_gpu_equals_the_plan_on_the_cpu():
    g = torch.Generator().manual_seed(5)
    ids = torch.stack([torch.randint(0, n, (40,), generator=g) for n in SIZES], 1)
    fmap = torch.full((sum(SIZES),), -1, dtype=torch.int32)
    picked = frequent_rows(_stats(), SIZES, 2.0)
    fmap[picked] = torch.arange(picked.numel(), dtype=torch.int32)
    offsets, bounds = torch.tensor([0, 7, 10, 60, 61]), split_bounds(40, 3)
    for rank in range(3):
        want = compute_plan(ids, bounds, rank, 3, offsets, fmap)
        got = compute_plan(ids.cuda(), bounds, rank, 3, offsets.cuda(), fmap.cuda())
        assert (got.recv_counts, got.send_counts) == (want.recv_counts, want.send_counts)
        for a, b in zip(got.tensors(), want.tensors()):
            assert a.is_cuda and a.tolist() == b.tolist()


def test_init_is_the_same_whatever_the_split():
    whole = torch.cat([rows for _, rows in table_chunks(2, 50, DIM, SEED, "cpu")])
    emb = HybridEmbedding(SIZES, DIM, torch.tensor([7 + 10 + 3]), 1, 3, SEED, "cpu")
    g = torch.arange(10, 60)
    own = g[g % 3 == 1]
    torch.testing.assert_close(emb.rare_weight[own // 3], whole[own - 10])
    torch.testing.assert_close(emb.freq_weight[0], whole[10])
    assert whole.abs().max() <= 1 / math.sqrt(50)


def test_the_exchange_capacity_climbs_a_ladder():
    from benchmarks.dlrm.lookups_triton import LADDER, exchange_capacity

    assert exchange_capacity(0) == exchange_capacity(8) == 8
    sizes = [exchange_capacity(n) for n in range(1, 5000)]
    assert all(c >= n and c % 8 == 0 for n, c in zip(range(1, 5000), sizes))
    assert sizes == sorted(sizes)
    assert all(c <= n * 2 ** (1 / LADDER) + 8 for n, c in zip(range(1, 5000), sizes))
    assert len(set(sizes[1000:2000])) <= LADDER + 1   # a doubling: at most the ladder's steps


@pytest.mark.parametrize("world", [2, 3])
def test_the_padded_exchange_plan_serves_every_rare_lookup_once(world):
    """``fused-lookups``' plan on several ranks: each rank's rare lookup names a slot of the
    received vectors whose sender serves exactly that lookup's shard row; every served slot
    is named by one lookup; padding serves row -1 and is named by none."""
    from benchmarks.dlrm.lookups_triton import exchange_capacity, several_rank_plan

    g = torch.Generator().manual_seed(world)
    batch = 23
    ids = torch.stack([torch.randint(0, n, (batch,), generator=g) for n in SIZES], 1)
    frequent = frequent_rows(_stats(), SIZES, 2.0)
    embs = [HybridEmbedding(SIZES, DIM, frequent, r, world, SEED, "cpu") for r in range(world)]
    bounds, T = split_bounds(batch, world), len(SIZES)
    plans = [several_rank_plan(e, ids, bounds) for e in embs]
    flat = (ids + embs[0].offsets).reshape(-1)
    fmap = embs[0].freq_map.long()
    cap = plans[0]["serve_rows"].numel() // world
    pairs = torch.zeros(world, world, dtype=torch.int64)   # [owner, dest] rare lookups
    for dest in range(world):
        for g in flat[bounds[dest] * T:bounds[dest + 1] * T].tolist():
            if fmap[g] < 0:
                pairs[g % world, dest] += 1
    assert cap == exchange_capacity(int(pairs.max()))
    named = [torch.zeros(world * cap, dtype=torch.int64) for _ in range(world)]
    for r, plan in enumerate(plans):
        assert plan["slot_pos"].numel() == plan["serve_rows"].numel() == world * cap
        mine = flat[bounds[r] * T:bounds[r + 1] * T]
        code = plan["code"]
        assert code.numel() == mine.numel()
        freq = code >= 0
        assert torch.equal(code[freq], fmap[mine[freq]]) and (fmap[mine[~freq]] < 0).all()
        for p in torch.nonzero(~freq).squeeze(1).tolist():
            slot = -1 - int(code[p])
            owner, k = divmod(slot, cap)
            assert int(mine[p]) % world == owner
            assert int(plans[owner]["serve_rows"][r * cap + k]) == int(mine[p]) // world
            assert int(plan["slot_pos"][slot]) == p
            named[owner][r * cap + k] += 1
    for owner, plan in enumerate(plans):
        served = plan["serve_rows"] >= 0
        assert torch.equal(named[owner][served], torch.ones(int(served.sum()), dtype=torch.int64))
        assert not named[owner][~served].any()


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 100_000])
def test_each_position_gets_the_start_of_its_run_as_cummax_gives_it(n):
    from benchmarks.dlrm.lookups_triton import run_starts

    g = torch.Generator().manual_seed(n)
    rows = torch.sort(torch.randint(0, max(1, n // 7), (n,), generator=g)).values
    new_row = torch.ones(n, dtype=torch.bool)
    new_row[1:] = rows[1:] != rows[:-1]
    k = torch.arange(n)
    assert torch.equal(run_starts(new_row), torch.cummax(torch.where(new_row, k, 0), 0).values)
