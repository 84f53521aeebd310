"""``bf16-tables``: stochastic rounding, the reference update against fp32 SGD, the Triton
kernel over the plan's runs (on the GPU or under ``TRITON_INTERPRET=1``) against the reference,
and the workload training with it."""

import os

import pytest
import torch

from benchmarks.dlrm import bf16_tables, throughput
from benchmarks.dlrm.data import split_bounds
from benchmarks.dlrm.hybrid import HybridEmbedding, frequent_rows
from benchmarks.dlrm.workload import DLRMWorkload
from common.dist import DistEnv
from common.precision import Precision
from common.training import build_parser

TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``x``'s bf16 neighbours toward zero and away from it (equal where x is one)."""
    down = (x.view(torch.int32) & -(1 << 16)).view(torch.float32)
    exact = down == x
    up = ((x.view(torch.int32) & -(1 << 16)) + (1 << 16)).view(torch.float32)
    return down, torch.where(exact, down, up)


def _assert_rounded(got: torch.Tensor, want: torch.Tensor, rel: float = 0.0):
    """Each of bf16 ``got`` one of fp32 ``want``'s two neighbours (``rel``: ``want`` known to
    that relative error, an fp32 sum's order)."""
    lo, hi = _neighbours(want * (1 - rel * torch.sign(want)))
    lo2, hi2 = _neighbours(want * (1 + rel * torch.sign(want)))
    g = got.float()
    assert bool(((g == lo) | (g == hi) | (g == lo2) | (g == hi2)).all())


def test_stochastic_rounding_lands_on_a_neighbour_and_is_unbiased():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, generator=g) * torch.logspace(-6, 6, 64)
    x[:4] = torch.tensor([0.0, 1.0, -2.5, 3.0 * 2 ** -20])    # bf16 values stay put
    draws = torch.stack([bf16_tables.stochastic_round(x, g) for _ in range(4000)])
    _assert_rounded(draws, x.expand(4000, -1))
    assert torch.equal(draws[:, :4].float(), x[:4].expand(4000, -1))
    lo, hi = _neighbours(x)
    p = (x - lo) / torch.where(hi == lo, 1.0, hi - lo)   # the chance of rounding away from 0
    spread = (hi - lo).abs() * (p * (1 - p)).sqrt() / 4000 ** 0.5
    assert bool(((draws.float().mean(0) - x).abs() <= 5 * spread + 1e-30).all())
    assert 0.2 < float((draws[:, 4:].float() == hi[4:]).float().mean()) < 0.8


def _case(n_rows=40, dim=8, lookups=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    table = (torch.randn(n_rows, dim, generator=g) * 4).to(torch.bfloat16)
    rows = torch.randint(-1, n_rows // 2, (lookups,), generator=g)   # repeats; -1: skipped
    grads = torch.randn(lookups, dim, generator=g).to(torch.bfloat16)
    return table, rows, grads, torch.tensor(0.3)


def _fp32_sgd(table, rows, grads, lr):
    """``fused_sgd.sparse_sgd_``'s result in fp32 on a copy, one addition a lookup."""
    want = table.float()
    for r, gr in zip(rows.tolist(), grads.float()):
        if r >= 0:
            want[r] -= lr * gr
    return want


def test_the_reference_sums_each_rows_gradients_then_rounds_it_once():
    table, rows, grads, lr = _case()
    want = _fp32_sgd(table, rows, grads, lr)
    got = table.clone()
    bf16_tables.sparse_sgd_sr_(got, None, rows, grads, lr, torch.Generator().manual_seed(1))
    touched = torch.zeros(table.shape[0], dtype=torch.bool)
    touched[rows[rows >= 0]] = True
    assert torch.equal(got[~touched], table[~touched])
    _assert_rounded(got[touched], want[touched], rel=1e-5)
    mean = torch.zeros_like(want)   # unbiased: the mean of many updates is fp32 SGD's
    for s in range(400):
        t = table.clone()
        bf16_tables.sparse_sgd_sr_(t, None, rows, grads, lr, torch.Generator().manual_seed(s))
        mean += t.float() / 400
    ulp = (want.abs() * 2 ** -7).clamp_min(1e-30)
    assert bool(((mean - want).abs() <= ulp * 0.2).all())
    with pytest.raises(ValueError, match="no low-precision copy"):
        bf16_tables.sparse_sgd_sr_(got, got, rows, grads, lr)


def test_updates_below_half_a_bf16_step_still_move_the_rows_on_average():
    table = torch.ones(1, 4, dtype=torch.bfloat16)
    grads = torch.full((1, 4), 1e-3)   # lr * grad = 1e-3: a bf16 step at 1.0 is 2^-7
    rounded = (table.float() - grads).to(torch.bfloat16)   # round to nearest: no change
    assert torch.equal(rounded, table)
    g, t = torch.Generator().manual_seed(0), table.clone()
    for _ in range(1000):
        bf16_tables.sparse_sgd_sr_(t, None, torch.zeros(1, dtype=torch.int64), grads,
                                   torch.tensor(1.0), g)
    assert abs(float(t.float().mean()) - (1 - 1000 * 1e-3)) < 0.1


def _hybrid(world=1, rank=0, rare_dtype=torch.float32):
    from benchmarks.dlrm import lookups_triton

    sizes, g = [30, 7, 50, 3], torch.Generator().manual_seed(3)
    stats = torch.stack([torch.randint(0, n, (60,), generator=g) ** 2 % n for n in sizes], 1)
    emb = HybridEmbedding(sizes, 8, frequent_rows(stats, sizes, 3.0), rank, world, 5, DEVICE,
                          rare_dtype=rare_dtype)
    lookups_triton.apply(emb)
    emb.plan_runs = True
    ids = torch.stack([torch.randint(0, n, (24,), generator=g) for n in sizes], 1)
    return emb, ids.to(DEVICE)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_plans_runs_name_each_updated_row_once_with_all_its_gradients(world):
    """Each run is one distinct row >= 0 and the positions of every one of its updates in
    ``rare_grad``'s order; the rest of the runs are empty."""
    for rank in range(world):
        emb, ids = _hybrid(world, rank)
        plan = emb.plan(ids, split_bounds(ids.shape[0], world))
        rows = emb.rare_rows(plan).cpu()
        order, starts = plan["run_order"].cpu(), plan["run_starts"].cpu()
        runs = plan["run_rows"].cpu()
        assert starts.numel() == runs.numel() + 1 == rows.numel() + 1   # fixed by the batch
        sizes = starts[1:] - starts[:-1]
        used = int((sizes > 0).sum())
        assert bool((sizes[:used] > 0).all()) and bool((sizes[used:] == 0).all())
        assert torch.equal(runs[:used], torch.unique(rows[rows >= 0]))
        for r in range(used):
            assert bool((rows[order[starts[r]:starts[r + 1]]] == runs[r]).all())
        assert int(starts[used]) == rows.numel() and int(sizes.sum()) == int((rows >= 0).sum())


@pytest.mark.skipif(not TRITON, reason="Triton: a GPU or TRITON_INTERPRET=1")
def test_the_kernel_over_the_runs_updates_as_the_reference_does():
    emb, ids = _hybrid()
    plan = emb.plan(ids, [0, ids.shape[0]])
    g = torch.Generator().manual_seed(4)
    grads = torch.randn(*ids.shape, 8, generator=g).to(torch.bfloat16).to(DEVICE)   # [B, T, d]
    table = (torch.randn(emb.rare_weight.shape, generator=g) * 4).to(torch.bfloat16).to(DEVICE)
    rows, lr, seed = plan["rare_rows"], torch.tensor(0.3, device=DEVICE), torch.tensor(
        7, device=DEVICE)
    want = _fp32_sgd(table.cpu(), rows.cpu(), grads.reshape(-1, 8).cpu(), lr.cpu())
    got, reference = table.clone(), table.clone()
    bf16_tables.run_sgd_(got, grads, plan, lr, seed)
    bf16_tables.sparse_sgd_sr_(reference, None, rows, grads, lr)
    assert int(seed) == 8   # the next step draws other bits
    touched = torch.zeros(table.shape[0], dtype=torch.bool)
    touched[rows[rows >= 0].cpu()] = True
    assert torch.equal(got.cpu()[~touched], table.cpu()[~touched])
    assert torch.equal(reference.cpu()[~touched], table.cpu()[~touched])
    _assert_rounded(got.cpu()[touched], want[touched], rel=1e-5)
    _assert_rounded(reference.cpu()[touched], want[touched], rel=1e-5)
    mean = torch.zeros_like(want)
    for _ in range(200):
        t = table.clone()
        bf16_tables.run_sgd_(t, grads, plan, lr, seed)
        mean += t.float().cpu() / 200
    ulp = (want.abs() * 2 ** -7).clamp_min(1e-30)
    assert bool(((mean - want).abs() <= ulp * 0.25).all())


def _workload(opts: str):
    args = build_parser(DLRMWorkload).parse_args(
        ["--synthetic-data", "--precision", "amp-bf16", "--seed", "0", "--batch-size", "64",
         "--max-ind-range", "50", "--opt", opts])
    torch.manual_seed(0)   # the MLPs' init, as the driver seeds it
    wl = DLRMWorkload(args, DistEnv(), Precision("amp-bf16", "cpu"))
    wl.setup()
    return wl


def test_the_workload_trains_with_bf16_tables_as_with_fp32_masters():
    """On the CPU, the reference path: the rare table bf16 alone, the losses of four steps
    within bf16's rounding of the fp32-master run's."""
    runs = {}
    for opts in ("fused-sgd,hybrid-embeddings", "fused-sgd,hybrid-embeddings,bf16-tables"):
        wl = _workload(opts)
        dense, labels, idx = wl.synthetic_batch(64)
        runs[opts] = [float(wl.train_step(dense, labels, idx)) for _ in range(4)], wl
    (plain, _), (ours, wl) = runs.values()
    emb = wl.emb
    assert emb.rare_weight.dtype == torch.bfloat16 and emb.rare_lp is None
    built = sum(t.numel() * t.element_size()
                for t in (emb.freq_weight, emb.freq_lp, emb.rare_weight))
    assert 0 < built <= throughput.table_bytes(wl.args, world=1, lp_bytes=2)
    assert plain != ours
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(plain), rtol=2e-3, atol=0)
    assert ours[-1] < ours[0]


def test_the_rare_table_is_built_in_bf16_as_the_fp32_one_rounded():
    """``bf16-tables`` builds the rare table in bf16 (no fp32 table of it is ever held: the
    reference's 40M-row tables would take 96 GB): the same rows as fp32's, rounded."""
    fp32, ours = _workload("fused-sgd,hybrid-embeddings"), _workload(
        "fused-sgd,hybrid-embeddings,bf16-tables")
    assert fp32.emb.rare_weight.dtype == torch.float32
    assert torch.equal(ours.emb.rare_weight, fp32.emb.rare_weight.to(torch.bfloat16))
    assert torch.equal(ours.emb.freq_weight, fp32.emb.freq_weight)
    built = _hybrid(rare_dtype=torch.bfloat16)[0].rare_weight
    assert built.dtype == torch.bfloat16
    assert torch.equal(built, _hybrid()[0].rare_weight.to(torch.bfloat16))
