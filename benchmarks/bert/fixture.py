"""A tiny synthetic corpus in the MLPerf BERT layout (not Wikipedia), written through prepare_data.

    python -m benchmarks.bert.fixture OUTDIR [--words 32] [--train-docs 400] [--eval-docs 150]

The words are made-up syllable pairs; every document has one topic word and is a few sentences
of 3-8 repetitions of it, each ended by a full stop. A masked word is the topic of its own
segment; when segment B comes from a random other document (next-sentence label 1) the two
segments differ, so the model must learn to attend within its segment; full stops are not
predictable from the bag of words, so accuracy stays below 1. Writes ``vocab.txt``, a small
``bert_config.json``, ``text/``, then ``training/`` and ``eval/`` shards; a folder holding the
same fixture is reused (``common.fixture_cache``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from benchmarks.bert.prepare_data import SPECIALS, prepare
from common.fixture_cache import cached_fixture, fixture_command

TINY_BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=256, max_position_embeddings=64, type_vocab_size=2,
                 hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                 initializer_range=0.02)


def _words(n: int) -> list[str]:
    syll = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    rng = random.Random(0)
    words = sorted({rng.choice(syll) + rng.choice(syll) for _ in range(n * 4)})
    rng.shuffle(words)
    return words[:n]


def _documents(words: list[str], n_docs: int, rng: random.Random) -> str:
    docs = []
    for _ in range(n_docs):
        topic = rng.choice(words)
        docs.append(" ".join(" ".join([topic] * rng.randint(3, 8)) + "."
                             for _ in range(rng.randint(3, 8))))
    return "\n\n".join(docs) + "\n"


def write_fixture(out: Path, words: int = 32, train_docs: int = 400, eval_docs: int = 150,
                  seq_len: int = 64, max_pred: int = 10, dupe_factor: int = 5,
                  train_shards: int = 4, seed: int = 0) -> Path:
    """Write the fixture under ``out`` (reused when the same one is already there)."""
    params = dict(words=words, train_docs=train_docs, eval_docs=eval_docs, seq_len=seq_len,
                  max_pred=max_pred, dupe_factor=dupe_factor, train_shards=train_shards,
                  seed=seed, version=2)

    def write(tmp: Path) -> None:
        vocab_words = _words(words)
        vocab = tmp / "vocab.txt"
        tokens = [*SPECIALS, ".", *vocab_words]
        vocab.write_text("\n".join(tokens) + "\n")
        config = dict(TINY_BERT, vocab_size=len(tokens), max_position_embeddings=seq_len)
        (tmp / "bert_config.json").write_text(json.dumps(config, indent=2) + "\n")
        rng = random.Random(seed)
        for split, n_docs, shards, dupe in (("training", train_docs, train_shards, dupe_factor),
                                            ("eval", eval_docs, 1, 1)):
            text = tmp / "text" / f"{split}.txt"
            text.parent.mkdir(exist_ok=True)
            text.write_text(_documents(vocab_words, n_docs, rng))
            prepare([text], vocab, tmp / split, max_seq=seq_len, max_pred=max_pred,
                    shards=shards, dupe_factor=dupe, seed=seed + len(split), prefix=split)
    return cached_fixture(out, params, write)


@fixture_command
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--words", type=int, default=32)
    p.add_argument("--train-docs", type=int, default=400)
    p.add_argument("--eval-docs", type=int, default=150)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--max-pred", type=int, default=10)
    p.add_argument("--dupe-factor", type=int, default=5)
    p.add_argument("--train-shards", type=int, default=4)
    a = p.parse_args(argv)
    path = write_fixture(a.out, a.words, a.train_docs, a.eval_docs, a.seq_len, a.max_pred,
                         a.dupe_factor, a.train_shards)
    print(f"BERT fixture ready in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
