"""The LSTMs as CUDA graphs of padded lengths (``rnn-graphs``) against the plain encoder and
prediction network on the GPU: the same outputs and weight gradients without dropout (an odd
length included, where the time stacking adds a zero frame), one graph per padded length,
and new dropout masks at every replay, graphs replayed after later captures included, and
captures that another thread's pinned host allocations do not void."""

import pytest
import torch
from torch import nn

from benchmarks.rnnt.model import RNNT
from tests.benchmarks.rnnt.pinning import PinningThread

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SIZES = dict(vocab_size=29, enc_hidden=64, pred_hidden=32, joint_hidden=16)


def _model(seed: int, dropout: bool) -> RNNT:
    torch.manual_seed(seed)
    model = RNNT(**SIZES).cuda().train()
    if not dropout:
        for m in model.modules():
            if isinstance(m, nn.LSTM):
                m.dropout = 0.0
            elif isinstance(m, nn.Dropout):
                m.p = 0.0
    return model


def _inputs(B, T, U, seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, T, 240, generator=g).cuda()
    feat_lens = torch.randint(T // 2, T + 1, (B,), generator=g).cuda()
    labels = torch.randint(0, 29, (B, U), generator=g).cuda()
    return feats, feat_lens, labels


def _forward_backward(model, encode, predict, feats, feat_lens, labels):
    enc, enc_lens = encode(feats, feat_lens)
    pred = predict(labels)
    g = torch.Generator(device="cuda").manual_seed(5)
    (enc * torch.randn(enc.shape, generator=g, device="cuda")).sum().backward(
        retain_graph=False)
    (pred * torch.randn(pred.shape, generator=g, device="cuda")).sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return enc.detach(), enc_lens, pred.detach(), grads


def test_graphs_equal_the_plain_lstms_without_dropout():
    """Each shape against the plain path, a shape's graph replayed after others' captures
    (they share a memory pool) included."""
    from benchmarks.rnnt.rnn_graphs import GraphedRNNs

    model = _model(1, dropout=False)
    rnns = GraphedRNNs(model)
    for T, U in [(37, 5), (37, 5), (64, 15), (21, 0), (37, 5), (130, 40), (64, 15)]:
        batch = _inputs(3, T, U, seed=T)
        ref = _forward_backward(model, model.encode, lambda y: model.predict(y)[0], *batch)
        got = _forward_backward(model, rnns.encode, rnns.predict, *batch)
        assert got[0].shape == ref[0].shape and got[2].shape == ref[2].shape
        torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
        assert torch.equal(got[1], ref[1])
        torch.testing.assert_close(got[2], ref[2], rtol=1e-5, atol=1e-6)
        assert len(got[3]) == len(ref[3])
        for a, b in zip(got[3], ref[3]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert len(rnns.graphs) == 3 + 2   # frames 64, 32, 160; labels padded to 15 and 47
    assert len(rnns.pools) == 2


def test_one_graph_per_padded_length_under_autocast():
    from benchmarks.rnnt.rnn_graphs import GraphedRNNs

    model = _model(2, dropout=True)
    rnns = GraphedRNNs(model)
    with torch.autocast("cuda", torch.bfloat16):
        for T, U in [(37, 5), (40, 9), (70, 5), (33, 14)]:   # frames padded to 64, 64, 96, 64
            feats, feat_lens, labels = _inputs(2, T, U)
            enc, _ = rnns.encode(feats, feat_lens)
            pred = rnns.predict(labels)
            assert enc.shape == (2, -(-T // 2), 64) and pred.shape == (2, U + 1, 32)
            (enc.float().sum() + pred.float().sum()).backward()
    assert all(p.grad is not None and p.grad.isfinite().all()
               for p in model.encoder.parameters())
    kinds = sorted(key[0] for key in rnns.graphs)
    assert kinds == ["_EncoderCore"] * 2 + ["_PredictionCore"]   # 64, 96 frames; 16 labels


@pytest.mark.parametrize("wrapper_dropout", [True, False])
def test_every_replay_draws_new_dropout_masks(wrapper_dropout):
    """With the LSTM wrappers' dropout off, only cuDNN's between-layer dropout is left: its
    masks must change between replays too."""
    from benchmarks.rnnt.rnn_graphs import GraphedRNNs

    model = _model(3, dropout=True)
    if not wrapper_dropout:
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
    rnns = GraphedRNNs(model)
    feats, feat_lens, labels = _inputs(2, 40, 5)
    outs = [rnns.encode(feats, feat_lens)[0].detach().clone() for _ in range(3)]
    assert not torch.equal(outs[1], outs[2]) and not torch.equal(outs[0], outs[1])


def test_graphs_replayed_after_later_captures_still_run():
    """A graph replayed after other shapes were captured, dropout on (cuDNN's own
    between-layer dropout made such replays read freed memory)."""
    from benchmarks.rnnt.rnn_graphs import GraphedRNNs

    model = _model(4, dropout=True)
    rnns = GraphedRNNs(model)
    for T, U in [(37, 5), (70, 20), (130, 40), (37, 5), (70, 20)]:
        feats, feat_lens, labels = _inputs(4, T, U)
        with torch.autocast("cuda", torch.bfloat16):
            enc, _ = rnns.encode(feats, feat_lens)
            pred = rnns.predict(labels)
        (enc.float().square().mean() + pred.float().square().mean()).backward()
        torch.cuda.synchronize()
        assert all(p.grad.isfinite().all() for p in model.parameters() if p.grad is not None)
        model.zero_grad(set_to_none=True)
    assert len(rnns.graphs) == 6


def test_a_thread_pinning_memory_during_a_capture_does_not_void_it(monkeypatch):
    """A loader's pinning thread allocates host memory while a new length is captured."""
    from benchmarks.rnnt import rnn_graphs

    model = _model(3, dropout=False)
    rnns = rnn_graphs.GraphedRNNs(model)
    batch = _inputs(2, 37, 5)
    with PinningThread() as pinning:
        monkeypatch.setattr(rnn_graphs._EncoderCore, "forward",
                            pinning.during_capture(rnn_graphs._EncoderCore.forward))
        got = _forward_backward(model, rnns.encode, rnns.predict, *batch)
    assert pinning.pinned.is_set() and not pinning.errors
    ref = _forward_backward(model, model.encode, lambda y: model.predict(y)[0], *batch)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
