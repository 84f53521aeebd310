"""BERT's warm-up batches: with ``unpad``, two token counts near the data's (not the full
bucket), so the graphs a run meets and ``compile``'s dynamic recompilation come before the
clock; without it, one batch at ``--synthetic-fill``."""

import pytest
import torch

from benchmarks.bert.workload import WARM_UP_FILLS, BertWorkload
from common.dist import DistEnv
from common.precision import Precision
from common.training import build_parser
from tests.benchmarks.bert.test_throughput import TINY


def _workload(monkeypatch, opts):
    monkeypatch.setattr(BertWorkload, "_config", lambda self: TINY)
    args = build_parser(BertWorkload).parse_args(
        ["--synthetic-data", "--seed", "0", "--max-seq-length", "64", "--max-predictions", "10",
         "--batch-size", "8", "--grad-accum", "2"] + (["--opt", opts] if opts else []))
    wl = BertWorkload(args, DistEnv(device=torch.device("cpu")), Precision("fp32", "cpu"))
    wl.setup()
    return wl


@pytest.mark.parametrize("opts", ["unpad=16", ""])
def test_warm_up_batches_pack_to_two_token_counts_with_unpad(monkeypatch, opts):
    wl = _workload(monkeypatch, opts)
    batches = wl.warm_up_batches(wl.rank_batch_size)
    fills = [float(b[2].float().mean()) for b in batches]
    if not opts:
        assert fills == [1.0]   # --synthetic-fill's default
        return
    assert fills == pytest.approx(WARM_UP_FILLS, abs=0.02)
    tokens = [b[6].shape[-1] for b in batches]   # the packed index's bucketed count
    assert len(set(tokens)) == 2 and max(tokens) < 4 * 64   # not the full micro-batch
    for batch in batches:
        wl.train_step(*batch)
