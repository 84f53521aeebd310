"""The binary reader, AUC, the LR schedule, the model's shape and the fused SGD."""

import inspect
import itertools
import struct

import numpy as np
import pytest
import torch

from benchmarks.dlrm import data
from benchmarks.dlrm.auc import roc_auc
from benchmarks.dlrm.fused_sgd import sparse_sgd_, table_sgd_
from benchmarks.dlrm.hybrid import HybridEmbedding, frequent_rows
from benchmarks.dlrm.model import (
    MLP,
    DenseArch,
    PlainEmbeddings,
    dot_interaction,
    interaction_width,
    mllog_tensor_names,
    parse_mlp,
)
from benchmarks.dlrm.workload import lr_at
from common.errors import UserError

SIZES = [10] * 26


def _write(path, records):
    with open(path, "wb") as f:
        for r in records:
            f.write(struct.pack("<40i", *r))


def _record(label, dense, ids):
    return [label, *dense, *ids]


def test_reader_matches_hand_written_records(tmp_path):
    recs = [_record(1, range(13), range(26)), _record(0, [0] * 12 + [99], [9] * 26),
            _record(1, [5] * 13, [3] * 26)]
    recs[0][14:] = [i % 10 for i in range(26)]
    _write(tmp_path / "x.bin", recs)
    log = data.BinaryClickLog(tmp_path / "x.bin", SIZES, max_ind_range=40_000_000)
    assert log.num_records == 3
    b = log.read(0, 2)
    assert b.labels.tolist() == [1.0, 0.0]
    torch.testing.assert_close(b.dense[0], torch.log1p(torch.arange(13.0)))
    assert b.dense[1, 12].item() == pytest.approx(np.log(100.0))
    assert b.sparse[0].tolist() == [i % 10 for i in range(26)] and b.sparse.dtype == torch.int32
    assert b.sparse[1].tolist() == [9] * 26


def test_max_ind_range_is_applied(tmp_path):
    _write(tmp_path / "x.bin", [_record(0, [1] * 13, [13] * 26)])
    log = data.BinaryClickLog(tmp_path / "x.bin", [5] * 26, max_ind_range=5)
    assert log.read(0, 1).sparse[0].tolist() == [3] * 26


def test_the_modulo_of_any_int32_id_is_the_reference_s(tmp_path):
    """Ids are folded only where the modulo changes them: every int32 (negatives, ids past the
    cap, ids under it) comes out as numpy's (and the reference's) ``id % max_ind_range``."""
    g = np.random.default_rng(0)
    ids = g.integers(-2**31, 2**31, size=(300, 26), dtype=np.int64)
    ids[:100] %= 1000            # some already under the cap
    ids[0, :3] = [0, 999, -1]
    _write(tmp_path / "x.bin",
           [_record(i % 2, [1] * 13, row.tolist()) for i, row in enumerate(ids)])
    log = data.BinaryClickLog(tmp_path / "x.bin", [1000] * 26, max_ind_range=1000)
    got = log.read(0, 300).sparse
    assert got.dtype == torch.int32
    assert got.tolist() == np.remainder(ids, 1000).tolist()


def test_ids_beyond_a_capped_table_fold_into_it_as_in_the_reference(tmp_path):
    """The reference takes every id modulo --max-ind-range and caps each table at it
    (facebookresearch/dlrm _transform_features, ln_emb): ids beyond a capped table are
    mapped, not refused; ids outside an uncapped table are refused, naming the record."""
    counts = [50, 10] + [10] * 24
    ids = [1] * 26
    ids[0] = 47          # table 0: 50 rows in the counts, capped at 20
    path = tmp_path / "x.bin"
    _write(path, [_record(0, [1] * 13, ids), _record(1, [1] * 13, [-3] + [2] * 25)])
    capped = data.BinaryClickLog(path, data.cap_sizes(counts, 20), max_ind_range=20)
    assert capped.sizes[:2].tolist() == [20, 10]
    assert capped.read(0, 2).sparse[:, 0].tolist() == [47 % 20, -3 % 20]  # Python's sign rule
    uncapped = data.BinaryClickLog(path, data.cap_sizes(counts, 0), max_ind_range=0)
    assert uncapped.read(0, 1).sparse[0, 0].item() == 47
    with pytest.raises(UserError, match=r"x\.bin: record 1: category id -3 of feature 0 is "
                                        r"beyond its table size 50"):
        uncapped.read(0, 2)
    ids[1] = 15          # table 1: 10 rows, under the cap, so 15 % 20 = 15 is outside it
    _write(path, [_record(0, [1] * 13, ids)])
    with pytest.raises(UserError, match=r"record 0: category id 15 of feature 1 is beyond its "
                                        r"table size 10"):
        data.BinaryClickLog(path, data.cap_sizes(counts, 20), max_ind_range=20).read(0, 1)


def test_truncated_file_names_file_and_record(tmp_path):
    path = tmp_path / "x.bin"
    _write(path, [_record(0, [1] * 13, [1] * 26)] * 3)
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(UserError, match=r"x\.bin.*truncated.*record 2 is partial"):
        data.BinaryClickLog(path, SIZES, 40_000_000)


def test_category_beyond_table_names_record(tmp_path):
    path = tmp_path / "x.bin"
    ids = [1] * 26
    ids[4] = 10
    _write(path, [_record(0, [1] * 13, [1] * 26), _record(1, [1] * 13, ids)])
    log = data.BinaryClickLog(path, SIZES, 40_000_000)
    with pytest.raises(UserError, match=r"x\.bin: record 1: category id 10 of feature 4"):
        log.read(0, 2)


def test_feature_count_mismatch(tmp_path):
    np.savez(tmp_path / data.COUNTS_FILE, counts=np.arange(1, 26))
    with pytest.raises(UserError, match=r"day_fea_count\.npz.*25 entries, expected 26"):
        data.table_sizes(tmp_path, 40_000_000)
    np.savez(tmp_path / data.COUNTS_FILE, counts=np.full(26, 50_000_000))
    assert data.table_sizes(tmp_path, 40_000_000) == [40_000_000] * 26


def test_split_bounds_and_schedule(tmp_path):
    assert data.split_bounds(10, 3) == [0, 4, 7, 10]
    _write(tmp_path / "x.bin", [_record(0, [1] * 13, [1] * 26)] * 10)
    log = data.BinaryClickLog(tmp_path / "x.bin", SIZES, 0)
    train = data.BatchSchedule(log, 4, drop_last=True)
    assert sorted(train.ranges(0, 1, shuffle=True)) == [(0, 4), (4, 8)]
    assert data.BatchSchedule(log, 4, drop_last=False).ranges(0, 1, False)[-1] == (8, 10)


def _pairwise_auc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(4))
def test_auc_equals_pairwise_reference_with_ties(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 7, (300,), generator=g).float() / 7   # many ties
    labels = torch.rand(300, generator=g) < 0.3
    assert roc_auc(scores, labels) == pytest.approx(_pairwise_auc(scores.tolist(),
                                                                  labels.tolist()), abs=1e-12)
    assert roc_auc(torch.arange(4.0), torch.tensor([0, 0, 1, 1])) == 1.0


def test_lr_schedule_warmup_hold_decay():
    lr = lambda s: float(lr_at(torch.tensor(float(s)), 24.0, 2750, 49315, 27772, 2.0))  # noqa
    assert lr(0) == pytest.approx(24 / 2750) and lr(2749) == pytest.approx(24.0)
    assert lr(10_000) == 24.0 and lr(49315) == 24.0
    assert lr(49315 + 27772 // 2) == pytest.approx(24 * (1 - (27772 // 2) / 27772) ** 2)
    assert lr(49315 + 27772) == 0.0 and lr(90_000) == 0.0


def test_reference_model_shape():
    arch = DenseArch(128, 26, parse_mlp("13-512-256-128"), parse_mlp("1024-1024-512-256-1"))
    assert interaction_width(128, 26) == 479
    assert arch.top_mlp[0].in_features == 479
    n_params = sum(p.numel() for p in arch.parameters())
    assert n_params == (13 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128 + 479 * 1024 + 1024
                        + 1024 * 1024 + 1024 + 1024 * 512 + 512 + 512 * 256 + 256 + 257)
    out = arch(torch.randn(3, 128), torch.randn(3, 26, 128))
    assert out.shape == (3,)
    assert mllog_tensor_names(parse_mlp("13-512-256-128"), parse_mlp("1024-1024-512-256-1")) == [
        "embeddings", "bottom_mlp_dense1", "bottom_mlp_dense2", "bottom_mlp_dense3",
        "top_mlp_dense1", "top_mlp_dense2", "top_mlp_dense3", "top_mlp_dense4", "top_mlp_dense5"]


@pytest.mark.parametrize("cls", [DenseArch, MLP, PlainEmbeddings])
def test_the_model_takes_no_optimisation_switch(cls):
    """The reference network alone: optimisations transform or replace the built parts
    (split_linear.py, hybrid.py, fused_sgd.py)."""
    allowed = {"self", "dim", "num_sparse", "bottom", "top", "widths", "last_relu", "sizes",
               "seed", "device", "sparse", "x", "input", "bottom_out", "emb"}
    for fn in (cls.__init__, cls.forward):
        assert set(inspect.signature(fn).parameters) <= allowed, fn


def test_dot_interaction_is_lower_triangle_of_pairwise_dots():
    b, e = torch.randn(2, 3), torch.randn(2, 2, 3)
    z = dot_interaction(b, e)
    assert z.shape == (2, 3 + 3)
    torch.testing.assert_close(z[:, 3], (e[:, 0] * b).sum(1))
    torch.testing.assert_close(z[:, 5], (e[:, 1] * e[:, 0]).sum(1))


def test_dot_interaction_forward_and_gradients_match_explicit_pairs():
    g = torch.Generator().manual_seed(0)
    b, e = torch.randn(4, 5, generator=g), torch.randn(4, 6, 5, generator=g)
    w = torch.randn(4, 5 + 21, generator=g)
    grads = []
    for explicit in (False, True):
        bi, ei = b.clone().requires_grad_(True), e.clone().requires_grad_(True)
        if explicit:
            vecs = [bi] + [ei[:, t] for t in range(6)]
            pairs = [(vecs[i] * vecs[j]).sum(1) for i in range(7) for j in range(i)]
            out = torch.cat([bi, torch.stack(pairs, 1)], 1)
        else:
            out = dot_interaction(bi, ei)
        (out * w).sum().backward()
        grads.append((out.detach(), bi.grad, ei.grad))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("threshold", [0.0, 3.0, float("inf")])
def test_fused_sgd_steps_match_torch_sgd_on_plain_bags(threshold):
    sizes, dim, lr = [6, 40, 3], 4, 0.5
    g = torch.Generator().manual_seed(0)
    stats = torch.stack([torch.randint(0, n, (30,), generator=g) for n in sizes], 1)
    emb = HybridEmbedding(sizes, dim, frequent_rows(stats, sizes, threshold), 0, 1, 3, "cpu")
    emb.keep_low_precision(torch.bfloat16)
    plain = PlainEmbeddings(sizes, dim, 3, "cpu", sparse=True)
    opt = torch.optim.SGD(plain.parameters(), lr=lr)
    lr_t = torch.tensor(lr)
    for _ in range(3):
        ids = torch.stack([torch.randint(0, n, (8,), generator=g) for n in sizes], 1)
        w = torch.randn(8, len(sizes), dim, generator=g)
        out, _ = emb(emb.plan(ids, [0, 8]))
        (out.float() * w).sum().backward()
        table_sgd_(emb.freq_weight, emb.freq_lp, emb.frequent_grad(), lr_t)
        sparse_sgd_(emb.rare_weight, emb.rare_lp, *emb.rare_grad(), lr_t)
        opt.zero_grad()
        (plain(ids) * w).sum().backward()
        opt.step()
    whole = torch.cat([b.weight for b in plain.tables]).detach()
    frequent = torch.nonzero(emb.freq_map >= 0).squeeze(1)
    rows = emb.freq_map[frequent].long()

    def merged(freq, rare):   # world 1: the rare shard holds every row
        out = rare.clone()
        out[frequent] = freq[rows]
        return out

    got = merged(emb.freq_weight, emb.rare_weight)
    # bf16 lookups make the gradients differ slightly from the fp32 reference.
    torch.testing.assert_close(got, whole, atol=2e-2, rtol=0)
    lp = merged(emb.freq_lp, emb.rare_lp)
    assert torch.equal(lp, got.to(torch.bfloat16))     # the copy follows the masters exactly


def test_prepare_data_from_tsv_days(tmp_path):
    from benchmarks.dlrm.prepare_data import main as prepare_main

    raw = tmp_path / "raw"
    raw.mkdir()
    day0 = ["1\t" + "\t".join(["3", "", "-2"] + ["1"] * 10) + "\t" + "\t".join(["a"] * 25 + [""]),
            "0\t" + "\t".join(["0"] * 13) + "\t" + "\t".join(["ff"] * 26)]
    (raw / "day_0").write_text("\n".join(day0) + "\n")
    (raw / "day_1").write_text(day0[1] + "\n" + day0[0] + "\n" + day0[0] + "\n")
    assert prepare_main([str(raw), str(tmp_path / "out"), "--days", "2",
                         "--max-ind-range", "200"]) == 0
    sizes = data.table_sizes(tmp_path / "out", 200)
    assert sizes == [2] * 25 + [2]          # {0xa, 0xff % 200}; last: {0, 0xff % 200}
    train = data.BinaryClickLog(tmp_path / "out" / data.TRAIN_FILE, sizes, 200)
    test = data.BinaryClickLog(tmp_path / "out" / data.EVAL_FILE, sizes, 200)
    assert (train.num_records, test.num_records) == (2, 2)     # first half (rounded up) of day 1
    raw_rec = np.array(train.records[0])
    assert raw_rec[:4].tolist() == [1, 3, 0, 0]                # empty -> 0, negative -> 0
    assert raw_rec[14:].tolist() == [0] * 26                   # 0xa < 0xff % 200 = 55; "" -> 0
    assert np.array(train.records[1])[14:].tolist() == [1] * 26
    (raw / "day_0").write_text("1\t2\t3\n")
    assert prepare_main([str(raw), str(tmp_path / "out2"), "--days", "2"]) == 2
