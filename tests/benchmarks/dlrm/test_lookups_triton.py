"""``fused-lookups`` (``benchmarks/dlrm/lookups_triton.py``) against the reference
``HybridEmbedding`` on one rank: lookups, gradients and three SGD steps of both tables, with
power-law repeats (a frequent row met more often than a chunk holds). On the GPU, or on the CPU
under Triton's interpreter (``TRITON_INTERPRET=1`` with Triton installed). Several ranks:
``tests/benchmarks/dlrm/test_hybrid.py``."""

import os

import pytest
import torch

from benchmarks.dlrm.fused_sgd import sparse_sgd_, table_sgd_
from benchmarks.dlrm.hybrid import HybridEmbedding, frequent_rows
from benchmarks.dlrm.sparse_triton import sparse_sgd_ as triton_sgd_

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRETED),
                                 reason="needs CUDA (or TRITON_INTERPRET=1 and Triton)")]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SIZES, DIM, BATCH = [300, 5, 1000, 40], 16, 256


def _ids(g: torch.Generator) -> torch.Tensor:
    """Power-law ids: row 0 of each table about a third of the time."""
    return torch.stack([(torch.rand(BATCH, generator=g) ** 4 * n).long() for n in SIZES], 1)


def _pair(low_precision):
    from benchmarks.dlrm import lookups_triton

    stats = _ids(torch.Generator().manual_seed(0))
    made = []
    for _ in range(2):
        emb = HybridEmbedding(SIZES, DIM, frequent_rows(stats, SIZES, 3.0), 0, 1, 7, DEVICE)
        if low_precision is not None:
            emb.keep_low_precision(low_precision)
        made.append(emb)
    lookups_triton.apply(made[1])
    return made


def _loss(out: torch.Tensor, w: torch.Tensor, sliced: bool) -> torch.Tensor:
    """A loss whose gradient reaches ``out`` [B, T, d] contiguous, or (``sliced``) as the
    interaction's does: a slice of the gradient of ``out`` between other vectors."""
    if sliced:
        b, _, d = out.shape
        out = torch.cat([out.new_zeros(b, 1, d), out, out.new_zeros(b, 4, d)], 1)
        w = torch.cat([w.new_ones(b, 1, d), w, w.new_ones(b, 4, d)], 1)
    return (out.float() * w).sum()


@pytest.mark.parametrize("sliced", [False, True], ids=["contiguous-grad", "sliced-grad"])
@pytest.mark.parametrize("low_precision", [torch.bfloat16, None], ids=["bf16-copy", "fp32"])
def test_fused_lookups_train_as_the_reference(low_precision, sliced):
    ref, fused = _pair(low_precision)
    assert 0 < ref.freq_weight.shape[0] < sum(SIZES)
    g = torch.Generator().manual_seed(1)
    lr = torch.tensor(0.2, device=DEVICE)
    for step in range(3):
        ids = _ids(g).to(DEVICE)
        w = torch.randn(BATCH, len(SIZES), DIM, generator=g).to(DEVICE)
        grads = []
        for emb in (ref, fused):
            out, _ = emb(emb.plan(ids, [0, BATCH]))
            _loss(out, w, sliced).backward()
            grads.append((out.detach(), emb.frequent_grad(), emb.rare_grad()))
        (out_ref, freq_ref, rare_ref), (out_fused, freq_fused, rare_fused) = grads
        if step == 0:   # later, the tables differ by the frequent sums' order (and under
            assert torch.equal(out_fused, out_ref)   # the interpreter, the bf16 copy's rounding)
        ulp = 2 ** -7 if INTERPRETED and low_precision is not None else 1e-5
        torch.testing.assert_close(out_fused, out_ref, rtol=ulp, atol=1e-5)
        torch.testing.assert_close(freq_fused, freq_ref, rtol=1e-5, atol=1e-5)
        assert rare_fused[1] is fused._out_grad   # read in place ...
        assert fused._out_grad.is_contiguous() is not sliced   # ... even as a slice
        for emb, freq, rare, sparse in ((ref, freq_ref, rare_ref, sparse_sgd_),
                                        (fused, freq_fused, rare_fused, triton_sgd_)):
            table_sgd_(emb.freq_weight, emb.freq_lp, freq, lr)
            sparse(emb.rare_weight, emb.rare_lp, *rare, lr)
        torch.testing.assert_close(fused.freq_weight, ref.freq_weight, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused.rare_weight, ref.rare_weight, rtol=1e-6, atol=1e-6)
        if low_precision is not None:   # the interpreter truncates to bf16; a GPU rounds
            ulp = dict(rtol=2 ** -7, atol=0) if INTERPRETED else dict(rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(fused.rare_lp, fused.rare_weight.to(low_precision), **ulp)


def test_the_plan_codes_every_lookup_once():
    from benchmarks.dlrm.lookups_triton import CHUNK, chunk_capacity

    _, fused = _pair(None)
    ids = _ids(torch.Generator().manual_seed(2)).to(DEVICE)
    x = fused.plan(ids, [0, BATCH])
    flat = (ids + fused.offsets).reshape(-1)
    frequent = fused.freq_map[flat].long()
    # one rank: a rare lookup's row is its global row
    assert torch.equal(x["code"], torch.where(frequent >= 0, frequent, -1 - flat))
    assert torch.equal(x["rare_rows"], torch.where(frequent >= 0, -1, flat))
    starts, rows = x["chunk_starts"], x["chunk_rows"]
    n_freq = int((frequent >= 0).sum())
    assert len(rows) == chunk_capacity(fused.freq_weight.shape[0], flat.numel())   # fixed
    sizes = starts[1:] - starts[:-1]
    used = int((sizes > 0).sum())
    assert bool((sizes[:used] > 0).all()) and bool((sizes[used:] == 0).all())   # then padding
    assert int(starts[used]) == n_freq and int(sizes.max()) == CHUNK   # the hottest row is cut
    order = x["freq_order"][:n_freq]
    assert torch.equal(torch.sort(frequent[order]).values,
                       torch.sort(frequent[frequent >= 0]).values)
    for c in range(used):
        assert bool((frequent[x["freq_order"][starts[c]:starts[c + 1]]] == rows[c]).all())
    assert int(fused.plan(ids[:0], [0, 0])["chunk_starts"].numel()) == 1   # an empty batch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs CUDA")
def test_the_one_rank_step_as_a_cuda_graph_trains_as_eager():
    from benchmarks.dlrm.workload import DLRMWorkload
    from common.cuda_graph import GraphedStep
    from common.dist import DistEnv
    from common.precision import Precision
    from common.training import build_parser

    def workload():
        args = build_parser(DLRMWorkload).parse_args(
            ["--synthetic-data", "--precision", "amp-bf16", "--seed", "0", "--batch-size", "512",
             "--max-ind-range", "2000", "--opt", "fused-sgd,triton-sparse-sgd,"
             "hybrid-embeddings=2,fused-lookups,aligned-dense,cuda-graph"])
        wl = DLRMWorkload(args, DistEnv(device=torch.device("cuda")),
                          Precision("amp-bf16", "cuda"))
        wl.setup()
        assert wl.capture_policy().mode == "static"
        return wl

    eager, again, graphed = workload(), workload(), workload()
    for other in (again, graphed):   # each draws its own initial weights: start from eager's
        assert torch.equal(other.emb.freq_map, eager.emb.freq_map)
        with torch.no_grad():
            for dst, src in zip(other.training_state(), eager.training_state(), strict=True):
                dst.copy_(src)
    step = GraphedStep(graphed.train_step, warmup_steps=2)
    batches = [eager.synthetic_batch(512) for _ in range(6)]
    losses = []   # (eager, a second eager workload, graphed) a step
    for dense, labels, plan in batches:
        copies = [(dense.clone(), labels.clone(), {k: v.clone() for k, v in plan.items()})
                  for _ in range(2)]
        losses.append((float(eager.train_step(dense, labels, plan)),
                       float(again.train_step(*copies[0])), float(step(*copies[1]))))
    assert step.captured
    # steps 1-2 eager on a side stream, 3 captured and replayed, 4-6 replays
    for i, (want, repeat, got) in enumerate(losses, 1):
        assert repeat == pytest.approx(want, rel=1e-4, abs=1e-5), f"eager, step {i}: {losses}"
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5), f"graphed, step {i}: {losses}"
    for w, g in zip(eager.training_state(), graphed.training_state()):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def _two_rank_worker(rank, world, port, out):
    from benchmarks.dlrm.workload import DLRMWorkload
    from common import dist
    from common.cuda_graph import GraphedStep
    from common.precision import Precision
    from common.training import build_parser
    from tests.common.test_dist import _rendezvous

    _rendezvous(rank, world, port)
    env = dist.init_distributed("cuda")

    def workload():
        args = build_parser(DLRMWorkload).parse_args(
            ["--synthetic-data", "--precision", "amp-bf16", "--seed", "0", "--batch-size", "1024",
             "--max-ind-range", "2000", "--opt", "fused-sgd,triton-sparse-sgd,"
             "hybrid-embeddings=2,fused-lookups,aligned-dense,cuda-graph"])
        wl = DLRMWorkload(args, env, Precision("amp-bf16", "cuda"))
        wl.setup()
        return wl

    eager, graphed = workload(), workload()
    with torch.no_grad():   # the same initial weights (each workload draws its own)
        for dst, src in zip(graphed.training_state(), eager.training_state(), strict=True):
            dst.copy_(src)
    policy = graphed.capture_policy()
    step = GraphedStep(graphed.train_step, warmup_steps=2, max_graphs=policy.max_graphs,
                       eager_beyond=policy.eager_beyond)
    losses = []
    for _ in range(6):
        dense, labels, plan = eager.synthetic_batch(1024)
        copy = (dense.clone(), labels.clone(), {k: v.clone() for k, v in plan.items()})
        losses.append((float(eager.train_step(dense, labels, plan)), float(step(*copy))))
    out[rank] = dict(losses=losses, captured=len(step.graphs), policy=policy.mode,
                     state=[(w.detach().cpu(), g.detach().cpu()) for w, g in zip(
                         eager.training_state(),
                                                               graphed.training_state())])
    step.release()
    dist.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_ranks_step_as_cuda_graphs_trains_as_eager():
    """On several ranks the padded exchange makes the step capturable: two NCCL ranks'
    graphed steps (all-to-alls and the all-reduce inside the graphs) give the eager steps'
    losses and weights."""
    import torch.multiprocessing as mp

    from tests.common.test_dist import _free_port

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_two_rank_worker, args=(2, _free_port(), out), nprocs=2, join=True)
        res = dict(out)
    for rank in range(2):
        assert res[rank]["policy"] == "bucketed" and res[rank]["captured"] >= 1
        for i, (want, got) in enumerate(res[rank]["losses"], 1):
            assert got == pytest.approx(want, rel=1e-4, abs=1e-5), f"rank {rank}, step {i}"
        for w, g in res[rank]["state"]:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dim", [16, 13])
def test_the_exchange_gathers_vectors_of_a_table_and_of_a_gradient_slice(dim):
    from benchmarks.dlrm.lookups_triton import gather_vectors

    g = torch.Generator().manual_seed(dim)
    table = torch.randn(50, dim, generator=g).to(DEVICE, torch.bfloat16)
    rows = torch.tensor([3, -1, 49, 0, 3, -1, 17], device=DEVICE)
    want = torch.where((rows >= 0)[:, None], table[rows.clamp(min=0)], 0)
    assert torch.equal(gather_vectors(table, rows), want)
    wide = torch.randn(6, 8, dim, generator=g).to(DEVICE)   # the interaction's gradient
    grad = wide[:, 1:6]                                      # its embeddings' slice, in place
    pos = torch.tensor([0, 29, 7, 7, 12], device=DEVICE)
    assert torch.equal(gather_vectors(grad, pos), grad.reshape(-1, dim)[pos])
    assert gather_vectors(table, rows[:0]).shape == (0, dim)


def test_tables_beyond_int32_rows_are_refused():
    import types

    from benchmarks.dlrm import lookups_triton

    emb = types.SimpleNamespace(freq_weight=torch.empty(5, DIM), sizes=[2**31 - 5])
    with pytest.raises(ValueError, match="2\\^31"):
        lookups_triton.apply(emb)
