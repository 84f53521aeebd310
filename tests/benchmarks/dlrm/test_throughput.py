"""The DLRM throughput tool on the CPU: its errors, the synthetic batches and the workload hook."""

import argparse
import math

import pytest
import torch
import torch.multiprocessing as mp

from benchmarks.dlrm import data, throughput
from benchmarks.dlrm.workload import DLRMWorkload
from common import dist
from common.dist import DistEnv
from common.errors import UserError
from common.precision import Precision
from tests.common.test_dist import _free_port, _rendezvous
from tests.entry_points import assert_needs_cuda


def test_without_cuda_exits_2_with_one_line():
    assert_needs_cuda("benchmarks.dlrm.throughput")


def test_unknown_variant_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exc:
        throughput.main(["--variants", "config,ours"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(err) == 1 and "['ours']" in err[0]


def test_variants_come_from_the_registry_and_the_config():
    v = throughput.VARIANTS
    assert v["plain"] == [] and v["plain-compiled"] == []
    assert v["config"] == ["fused-sgd", "triton-sparse-sgd", "hybrid-embeddings",
                           "fused-lookups", "bf16-tables", "aligned-dense",
                           "interaction-backward", "compile", "cuda-graph"]
    assert v["config-8xH200"] == ["fused-sgd", "triton-sparse-sgd", "hybrid-embeddings",
                                  "bf16-frequent-grads", "fused-lookups", "aligned-dense",
                                  "interaction-backward", "compile", "cuda-graph"]
    # what requires the dropped one goes with it
    assert v["config-minus-hybrid-embeddings"] == ["fused-sgd", "triton-sparse-sgd",
                                                   "aligned-dense", "interaction-backward",
                                                   "compile"]
    assert v["config-minus-fused-sgd"] == ["aligned-dense", "interaction-backward", "compile"]
    assert v["config-minus-cuda-graph"] == v["config"][:-1]
    assert v["config-minus-interaction-backward"] == [
        "fused-sgd", "triton-sparse-sgd", "hybrid-embeddings", "fused-lookups", "bf16-tables",
        "aligned-dense", "compile", "cuda-graph"]
    assert v["config-minus-bf16-tables"] == [o for o in v["config"] if o != "bf16-tables"]
    assert v["config-plus-model-parallel-embeddings"] == [
        "fused-sgd", "triton-sparse-sgd", "aligned-dense", "interaction-backward", "compile",
        "model-parallel-embeddings"]
    assert v["config-plus-split-linear"] == ["fused-sgd", "triton-sparse-sgd",
                                             "hybrid-embeddings", "fused-lookups", "bf16-tables",
                                             "interaction-backward", "compile", "cuda-graph",
                                             "split-linear"]   # not aligned-dense
    assert not any(n in v for n in ("config-minus-prefetch", "config-plus-cache-eval"))


def test_embedding_bytes_count_lookups_and_distinct_rows():
    ids = torch.tensor([[0, 1], [0, 2], [0, 1]])   # tables at offsets 0 and 10
    # 6 lookups x 3 passes x 2 bytes + 3 distinct rows (0, 11, 12) x (8 + 2), of 4 elements
    assert throughput.embedding_bytes(ids, 4, torch.tensor([0, 10]), 2) == 4 * (36 + 30)
    assert throughput.embedding_bytes(ids, 4, torch.tensor([0, 10]), 4) == 4 * (72 + 24)
    # bf16-tables: each distinct row read and written in bf16
    assert throughput.embedding_bytes(ids, 4, torch.tensor([0, 10]), 2,
                                      masters=False) == 4 * (36 + 12)


def test_power_law_ids_stay_in_their_tables_and_are_skewed():
    sizes = [2000, 7, 1]
    ids = data.power_law_ids(200_000, sizes, torch.Generator().manual_seed(0))
    assert ids.shape == (200_000, 3) and ids.dtype == torch.int64
    for t, n in enumerate(sizes):
        assert 0 <= int(ids[:, t].min()) and int(ids[:, t].max()) < n
    counts = torch.bincount(ids[:, 0], minlength=2000).sort(descending=True).values.double()
    assert counts[:20].sum() > 0.3 * counts.sum()          # top 1% of ids: uniform gives 1%
    ranks = torch.arange(5, 200, dtype=torch.float64)     # log count falls ~1.1 per log rank
    x, y = ranks.log(), counts[5:200].log()
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    assert -1.4 < slope < -0.8
    again = data.power_law_ids(200_000, sizes, torch.Generator().manual_seed(0))
    assert torch.equal(ids, again)                        # every rank draws the same batch


def _tool_args(variant: str):
    return throughput.workload_args(variant, argparse.Namespace(
        precision="amp-bf16", batch_size=64, max_ind_range=50))


# the variants without a CUDA-only optimisation
CPU_VARIANTS = [v for v, items in throughput.VARIANTS.items()
                if not any(DLRMWorkload.optimisations[i.partition("=")[0]].cuda for i in items)]


@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_synthetic_workload_trains_on_cpu(variant):
    args = _tool_args(variant)
    wl = DLRMWorkload(args, DistEnv(), Precision(args.precision, "cpu"))
    wl.setup()
    dense, labels, idx = wl.synthetic_batch(64)
    assert dense.shape == (64, data.NUM_DENSE) and labels.shape == (64,)
    losses = [float(wl.train_step(dense, labels, idx)) for _ in range(2)]
    assert all(math.isfinite(x) for x in losses) and losses[0] != losses[1]
    with pytest.raises(UserError, match="global --batch-size 64"):
        wl.synthetic_batch(32)


@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_table_estimate_bounds_the_tables_built(variant):
    args = _tool_args(variant)
    wl = DLRMWorkload(args, DistEnv(), Precision(args.precision, "cpu"))
    wl.setup()
    plain = not {"hybrid-embeddings", "model-parallel-embeddings"} & set(args.optimisations)
    tables = ([bag.weight for bag in wl.emb.tables] if plain
              else [wl.emb.freq_weight, wl.emb.rare_weight])
    built = sum(t.numel() * t.element_size() for t in tables)
    estimate = throughput.table_bytes(args, world=1, lp_bytes=0)
    exact = plain or "model-parallel-embeddings" in args.optimisations  # no frequent rows
    assert built == estimate if exact else 0 < built <= estimate


def _train_and_keep(rank, world, port, out):
    """3 steps of the hybrid workload on a synthetic global batch of 64; the weights after."""
    _rendezvous(rank, world, port)
    env = dist.init_distributed("cpu")
    torch.manual_seed(rank)   # as the driver seeds each rank: rank 1's MLPs differ until broadcast
    registry = DLRMWorkload.optimisations   # the config less what needs CUDA or amp-bf16
    throughput.VARIANTS["config-on-cpu"] = [
        i for i in throughput.VARIANTS["config"]
        if not registry[i.partition("=")[0]].cuda
        and "fp32" in (registry[i.partition("=")[0]].precisions or ("fp32",))]
    args = throughput.workload_args("config-on-cpu", argparse.Namespace(
        precision="fp32", batch_size=64, max_ind_range=50))
    assert {"hybrid-embeddings", "aligned-dense"} <= set(args.optimisations)
    wl = DLRMWorkload(args, env, Precision("fp32", "cpu"))
    wl.setup()
    batch = wl.synthetic_batch(64)
    for _ in range(3):
        wl.train_step(*batch)
    out[rank] = dict(mlp={k: v.clone() for k, v in wl.dense_arch.state_dict().items()},
                     frequent=wl.emb.freq_weight.clone(), rare=wl.emb.rare_weight.clone())
    dist.shutdown()


def test_two_gloo_ranks_train_as_one_process():
    """Data parallelism with global-batch semantics: the MLPs, the replicated frequent rows
    and the sharded rare rows after 3 steps on 2 ranks equal one process's."""
    results = {}
    for world in (1, 2):
        with mp.Manager() as manager:
            out = manager.dict()
            mp.spawn(_train_and_keep, args=(world, _free_port(), out), nprocs=world, join=True)
            results[world] = dict(out)
    one, two = results[1][0], results[2]
    for k, v in one["mlp"].items():
        for rank in (0, 1):
            torch.testing.assert_close(two[rank]["mlp"][k], v, rtol=1e-4, atol=1e-5)
    for rank in (0, 1):
        torch.testing.assert_close(two[rank]["frequent"], one["frequent"], rtol=1e-4, atol=1e-5)
        # rank r holds the rows g with g % 2 == r, at g // 2
        torch.testing.assert_close(two[rank]["rare"], one["rare"][rank::2], rtol=1e-4, atol=1e-5)
    assert not torch.equal(one["rare"], torch.zeros_like(one["rare"]))
