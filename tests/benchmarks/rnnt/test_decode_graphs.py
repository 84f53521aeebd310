"""Greedy decoding replayed as CUDA graphs (``decode-graphs``) against the eager loop on
the GPU: the same labels over batches of growing and shrinking shapes (captured again only
when a batch needs more), under autocast, at the label limits, and after the weights change
in place as the moving average changes them, and with another thread allocating pinned
memory meanwhile, as the evaluation loader's does."""

import pytest
import torch

from benchmarks.rnnt.decode_graphs import GraphedDecoder
from benchmarks.rnnt.decoding import greedy_decode
from benchmarks.rnnt.model import RNNT
from tests.benchmarks.rnnt.pinning import PinningThread
from tests.benchmarks.rnnt.test_decoding import tiny_rnnt

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _model(seed=0) -> RNNT:
    return tiny_rnnt(seed).cuda().eval()


def _batch(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, T, 6, generator=g) * 2
    feat_lens = torch.randint(1, T + 1, (B,), generator=g)
    feat_lens[0] = T
    return feats.cuda(), feat_lens.cuda()


# (rows, frames): grows in frames, then rows, then shrinks: three captures
SHAPES = [(5, 30), (3, 20), (5, 150), (9, 60), (2, 7), (9, 140)]


@pytest.mark.parametrize("autocast", [False, True])
def test_graphed_labels_equal_the_eager_loop(autocast):
    model = _model()
    decoder = GraphedDecoder(model, model.blank, max_symbols=40, max_symbols_per_step=3)
    lengths = []
    with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
        for i, (B, T) in enumerate(SHAPES):
            feats, feat_lens = _batch(B, T, i)
            out = decoder(feats, feat_lens)
            assert out == greedy_decode(model, feats, feat_lens, model.blank, 40, 3)
            lengths += map(len, out)
    assert decoder.captures == 3
    assert max(lengths) == 40 and any(0 < n < 40 for n in lengths)  # capped, ended early
    assert not model.training


def test_weights_changed_in_place_reach_the_graph():
    model, other = _model(0), _model(1)
    decoder = GraphedDecoder(model, model.blank, max_symbols=40, max_symbols_per_step=3)
    feats, feat_lens = _batch(6, 50, 0)
    before = decoder(feats, feat_lens)
    with torch.no_grad():
        torch._foreach_lerp_(list(model.parameters()), list(other.parameters()), 0.9)
    after = decoder(feats, feat_lens)
    assert after == greedy_decode(model, feats, feat_lens, model.blank, 40, 3)
    assert after != before and decoder.captures == 1


def test_a_thread_pinning_memory_during_the_capture_does_not_void_it():
    model = _model()
    decoder = GraphedDecoder(model, model.blank, max_symbols=40, max_symbols_per_step=3)
    feats, feat_lens = _batch(6, 50, 0)
    with PinningThread() as pinning:
        decoder._steps = pinning.during_capture(decoder._steps)
        out = decoder(feats, feat_lens)
    assert pinning.pinned.is_set() and not pinning.errors
    assert out == greedy_decode(model, feats, feat_lens, model.blank, 40, 3)
