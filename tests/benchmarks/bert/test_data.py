"""prepare_data round trip, the HDF5 reader on fixture shards, and its bad-input errors."""

import re
import shutil

import h5py
import numpy as np
import pytest
import torch

from benchmarks.bert import data
from benchmarks.bert.fixture import write_fixture
from benchmarks.bert.prepare_data import SPECIALS, load_tokenizer, prepare
from common.errors import UserError

TEXT = """The quick brown fox jumps over the lazy dog. A second sentence follows here!
Another line about foxes and dogs.

Completely different document about rivers. Rivers flow to the sea.
The sea is salty and deep. Fish swim there.

Third document talks about mountains. Mountains are tall.
"""
WORDS = sorted(set(TEXT.lower().replace(".", " ").replace("!", " ").split()))
VOCAB = 38  # the fixture's vocab.txt: 5 specials, ".", 32 words


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("bert") / "data", train_docs=60, eval_docs=20,
                         dupe_factor=2, train_shards=3)


def test_prepare_data_round_trip(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join([*SPECIALS, ".", "!", *WORDS]) + "\n")
    (tmp_path / "in.txt").write_text(TEXT)
    paths = prepare([tmp_path / "in.txt"], tmp_path / "vocab.txt", tmp_path / "out", max_seq=32,
                    max_pred=5, shards=2, dupe_factor=3, seed=1)
    assert len(paths) == 2
    tok = load_tokenizer(tmp_path / "vocab.txt")
    source = " ".join(TEXT.lower().split())
    checked = 0
    for path in paths:
        with h5py.File(path) as f:
            a = {k: f[k][...] for k in data.KEYS}
        for r in range(len(a["next_sentence_labels"])):
            ids, n = a["input_ids"][r].copy(), int(a["input_mask"][r].sum())
            assert ids[0] == tok.token_to_id("[CLS]") and ids[n - 1] == tok.token_to_id("[SEP]")
            assert not a["input_mask"][r, n:].any() and not ids[n:].any()
            pos = a["masked_lm_positions"][r]
            k = int((pos > 0).sum())
            assert 1 <= k <= 5 and (pos[k:] == 0).all() and (np.diff(pos[:k]) > 0).all()
            ids[pos[:k]] = a["masked_lm_ids"][r, :k]  # undo the masking
            seps = np.nonzero(ids[:n] == tok.token_to_id("[SEP]"))[0]
            assert len(seps) == 2 and (a["segment_ids"][r, seps[0] + 1:n] == 1).all()
            first = tok.decode(ids[1:seps[0]].tolist())
            assert first.replace(" .", ".").replace(" !", "!") in source.replace(" !", "!")
            if a["next_sentence_labels"][r] == 0:
                both = tok.decode(ids[1:seps[1]].tolist(), skip_special_tokens=True)
                assert both.replace(" .", ".").replace(" !", "!") in source
                checked += 1
    assert checked > 0


def test_prepare_data_bad_vocab(tmp_path):
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    (tmp_path / "in.txt").write_text(TEXT)
    with pytest.raises(UserError, match=r"lacks the BERT special token"):
        prepare([tmp_path / "in.txt"], tmp_path / "vocab.txt", tmp_path / "out")


def test_reader_on_fixture_shards(fixture_dir):
    shards = data.Shards.scan(fixture_dir / "training", 64, 10)
    assert len(shards.files) == 3 and shards.samples == sum(shards.sizes) > 0
    stream = data.train_stream(shards, 40, global_batch=8, rank=1, world=2, seed=0,
                               device=torch.device("cpu"))
    batches = [next(stream) for _ in range(shards.samples // 8 + 3)]  # wraps into a 2nd pass
    ids, seg, mask, pos, labels, nsp = batches[0]
    assert ids.shape == (4, 64) and pos.shape == (4, 10) and nsp.shape == (4,)
    assert ids.dtype == torch.int64
    assert (ids.gather(1, pos)[pos > 0] == 4).float().mean() > 0.6  # mostly [MASK]
    ev = list(data.eval_batches(data.Shards.scan(fixture_dir / "eval", 64, 10), 40, 16, 0, 1,
                                torch.device("cpu"), limit=20))
    assert sum(len(b[0]) for b in ev) == 20


def test_reader_errors(fixture_dir, tmp_path):
    with pytest.raises(UserError, match="empty shard list"):
        (tmp_path / "none").mkdir()
        data.Shards.scan(tmp_path / "none", 64, 10)
    with pytest.raises(UserError, match="sequence length differs"):
        data.Shards.scan(fixture_dir / "training", 128, 10)
    with pytest.raises(UserError, match="max-predictions"):
        data.Shards.scan(fixture_dir / "training", 64, 76)
    bad = tmp_path / "bad"
    shutil.copytree(fixture_dir / "training", bad)
    victim = sorted(bad.glob("*.hdf5"))[1]
    with h5py.File(victim, "a") as f:
        del f["masked_lm_ids"]
    with pytest.raises(UserError, match=f"{victim.name}: missing HDF5 key.*masked_lm_ids"):
        data.Shards.scan(bad, 64, 10)
    victim.write_bytes(b"garbage")
    with pytest.raises(UserError, match="not a readable HDF5"):
        data.Shards.scan(bad, 64, 10)
    with pytest.raises(UserError, match="outside the vocabulary"):
        data.read_shard(sorted((fixture_dir / "training").glob("*.hdf5"))[0], vocab_size=10)


def empty_like(src, dst):
    """A shard with ``src``'s keys, dtypes and widths but 0 sequences."""
    with h5py.File(src) as f, h5py.File(dst, "w") as g:
        for k in data.KEYS:
            g.create_dataset(k, shape=(0, *f[k].shape[1:]), dtype=f[k].dtype)


@pytest.mark.parametrize("split", ["training", "eval"])
def test_shards_of_no_sequences_are_refused_at_scan(fixture_dir, tmp_path, split):
    shards = sorted((fixture_dir / split).glob("*.hdf5"))
    for src in shards:
        empty_like(src, tmp_path / src.name)
    with pytest.raises(UserError, match=re.escape(f"{tmp_path}: its {len(shards)} *.hdf5 "
                                                  "shard(s) hold 0 sequences")):
        data.Shards.scan(tmp_path, 64, 10)
    shutil.copy(shards[0], tmp_path / "z.hdf5")  # one empty shard among others is harmless
    assert data.Shards.scan(tmp_path, 64, 10).samples == data.Shards.scan(
        fixture_dir / split, 64, 10).sizes[0]


@pytest.mark.parametrize("key, where, value, words", [
    ("input_ids", (3, 5), VOCAB, f"input_ids {VOCAB} is outside the vocabulary of {VOCAB}"),
    ("input_ids", (3, 5), -1, f"input_ids -1 is outside the vocabulary of {VOCAB}"),
    ("masked_lm_ids", (3, 0), VOCAB + 7, f"masked_lm_ids {VOCAB + 7} is outside the vocab"),
    ("masked_lm_ids", (3, 9), -2, "masked_lm_ids -2 is outside the vocabulary"),
    ("masked_lm_positions", (3, 1), 64, "masked_lm_positions 64 is outside the sequence "
                                        "length 64; re-create the shard"),
    ("masked_lm_positions", (3, 0), -1, "masked_lm_positions -1 is outside the sequence"),
    ("next_sentence_labels", 3, 2, "next_sentence_labels 2 is not 0 (IsNext) or 1 (NotNext)"),
    ("next_sentence_labels", 3, -100, "next_sentence_labels -100 is not 0"),
])
def test_bad_values_name_the_shard_and_sequence(fixture_dir, tmp_path, key, where, value, words):
    shard = tmp_path / "bad.hdf5"
    shutil.copy(sorted((fixture_dir / "training").glob("*.hdf5"))[0], shard)
    with h5py.File(shard, "a") as f:
        f[key][where] = value
    with pytest.raises(UserError, match=re.escape(f"{shard}: sequence 3: {words}")):
        data.read_shard(shard, VOCAB)
    with pytest.raises(UserError, match=re.escape(str(shard))):  # the stream's first read
        next(data.eval_batches(data.Shards.scan(tmp_path, 64, 10), VOCAB, 4, 0, 1,
                               torch.device("cpu")))


def test_fixture_values_pass(fixture_dir):
    for path in sorted(fixture_dir.glob("*/*.hdf5")):
        data.read_shard(path, VOCAB)
