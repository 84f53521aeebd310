"""DLRM's initialization before the clock: with ``compile``, the evaluation forward compiled
on synthetic batches (``DLRMWorkload.warm_up_eval``), for every evaluation batch size."""

import torch
from torch._dynamo.utils import counters

from benchmarks.dlrm.workload import DLRMWorkload
from common.dist import DistEnv
from common.precision import Precision
from common.training import build_parser


def test_the_evaluation_forward_compiles_before_the_clock_for_any_batch_size(monkeypatch):
    compile_ = torch.compile   # Dynamo's graphs on aot_eager: what compiles, not how fast
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic=None, **_: compile_(
        fn, dynamic=dynamic, backend="aot_eager"))
    torch._dynamo.reset()
    args = build_parser(DLRMWorkload).parse_args(
        ["--synthetic-data", "--precision", "fp32", "--seed", "0", "--batch-size", "64",
         "--eval-batch-size", "96", "--max-ind-range", "500", "--embedding-dim", "16",
         "--arch-mlp-bot", "13-32-16", "--arch-mlp-top", "64-16-1",
         "--opt", "fused-sgd,hybrid-embeddings,compile"])
    wl = DLRMWorkload(args, DistEnv(device=torch.device("cpu")), Precision("fp32", "cpu"))
    wl.setup()
    counters.clear()
    with torch.no_grad():
        wl.warm_up_eval()
        built = counters["stats"]["unique_graphs"]
        assert built >= 2 and wl.dense_arch.training
        wl.dense_arch.eval()
        dense, _, idx = wl.synthetic_batch(64)      # a third size: no new graph
        assert wl._forward(dense, idx).shape == (64,)
    assert counters["stats"]["unique_graphs"] == built, dict(counters["stats"])


def test_the_warm_up_keeps_only_the_rare_rows_its_steps_update():
    """Hybrid embeddings' rare table (tens of GB on the GPU configs) is kept only in the rows
    the warm-up batches' plans update: every row the steps change is among them, and the
    warm-up puts the whole training state back."""
    from common.cuda_graph import GraphedStep
    from common.training import warm_up

    args = build_parser(DLRMWorkload).parse_args(
        ["--synthetic-data", "--precision", "fp32", "--seed", "0", "--batch-size", "64",
         "--max-ind-range", "500", "--embedding-dim", "16", "--arch-mlp-bot", "13-32-16",
         "--arch-mlp-top", "64-16-1", "--opt", "fused-sgd,hybrid-embeddings=3"])
    wl = DLRMWorkload(args, DistEnv(device=torch.device("cpu")), Precision("fp32", "cpu"))
    wl.setup()
    before = [t.clone() for t in wl.training_state()]
    batches = wl.warm_up_batches(wl.rank_batch_size)
    (rows,) = [r for t, r in wl.warm_up_state(batches) if r is not None]
    rare = wl.emb.rare_weight
    assert 0 < rows.numel() < rare.shape[0]
    table = rare.clone()
    for _ in range(3):
        wl.train_step(*batches[0])
    changed = torch.nonzero((rare != table).any(1)).squeeze(1)
    assert changed.numel() and torch.isin(changed, rows).all()
    with torch.no_grad():   # put back by hand for the warm-up
        for t, b in zip(wl.training_state(), before):
            t.copy_(b)
    warm_up(wl, GraphedStep(wl.train_step, enabled=False), 3, wl.env)
    for t, b in zip(wl.training_state(), before):
        assert torch.equal(t, b)
