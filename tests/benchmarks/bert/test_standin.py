"""``benchmarks.bert.standin``: the reference's shard format at its shapes (512 tokens, up to
76 predictions, 10,000 evaluation sequences), with a config and an initial checkpoint, for
dry runs."""

import numpy as np

from benchmarks.bert import data, standin
from benchmarks.bert.checkpoint import load_checkpoint
from benchmarks.bert.model import BertConfig, BertForPreTraining
from benchmarks.bert.workload import EVAL_SAMPLES

TINY = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, vocab_size=2000)   # ids within its vocabulary


def test_lengths_have_the_mean_fill_asked_for():
    rng = np.random.default_rng(0)
    for fill in (0.3, 0.5, 0.6, 0.9):
        real = standin.lengths(200_000, fill, rng)
        assert abs(real.mean() / 512 - fill) < 0.005
        assert real.min() >= 16 and real.max() <= 512
        assert (real == 512).any() == (fill > 0.52)


def test_shards_in_the_reference_format_with_config_and_checkpoint(tmp_path):
    root = standin.write_standin(tmp_path / "b", shards=2, shard_size=50, config=TINY)
    train = data.Shards.scan(root / "training", 512, 76)      # the reader's own checks
    assert train.sizes == (50, 50)
    assert data.Shards.scan(root / "eval", 512, 76).samples == EVAL_SAMPLES
    assert BertConfig.from_json(root / "bert_config.json") == TINY
    load_checkpoint(BertForPreTraining(TINY), root / "phase1.pt")
    arrays = data.read_shard(train.files[0], TINY.vocab_size)   # values checked too
    ids, mask, seg, pos, lab = (arrays[k] for k in data.KEYS[:5])
    real = mask.sum(1)
    assert (ids[:, 0] == standin.CLS).all() and (ids * (1 - mask) == 0).all()
    count = (pos > 0).sum(1)
    assert (count == np.minimum(76, np.maximum(1, np.round(real * 0.15)))).all()
    rows = np.arange(len(ids))[:, None]
    assert ((pos < real[:, None] - 1) | (pos == 0)).all()
    assert ((lab == ids[rows, pos]) | (pos == 0)).all()
    assert set(np.unique(seg)) == {0, 1}
    assert standin.write_standin(tmp_path / "b", shards=2, shard_size=50, config=TINY) == root
