"""Raw text + WordPiece vocab -> the MLPerf BERT packed HDF5 shards.

    python -m benchmarks.bert.prepare_data --input FILE... --vocab vocab.txt --output-dir DIR
        [--max-seq-length 512] [--max-predictions 76] [--shards 1] [--dupe-factor 10] ...

Follows the reference's ``create_pretraining_data`` algorithm: documents are
separated by blank lines and split into sentences; sentences are packed into
segment pairs up to a (sometimes shortened) target length, B being the true
continuation or, half the time, text from a random other document
(``next_sentence_labels`` 1); the pair is truncated from random ends to fit
``[CLS] A [SEP] B [SEP]``; 15% of the tokens (at most ``max_predictions``)
are chosen for masked LM, of which 80% become ``[MASK]``, 10% a random token
and 10% stay. Tokenisation is WordPiece (lower-cased) from the ``tokenizers``
package.
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import h5py
import numpy as np

from benchmarks.bert.data import KEYS
from common.cli import OneLineParser, one_line_errors
from common.errors import UserError

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def load_tokenizer(vocab: Path):
    """The uncased BERT WordPiece tokenizer over ``vocab`` (one token per line)."""
    from tokenizers import BertWordPieceTokenizer
    vocab = Path(vocab)
    if not vocab.is_file():
        raise UserError(f"{vocab}: no such WordPiece vocab file (one token per line)")
    tokens = vocab.read_text().split("\n")
    missing = [s for s in SPECIALS if s not in tokens]
    if missing:
        raise UserError(f"{vocab}: lacks the BERT special token(s) {', '.join(missing)}")
    return BertWordPieceTokenizer(str(vocab), lowercase=True)


def read_documents(files: list[Path]) -> list[list[str]]:
    """Documents (blank-line separated) as lists of sentences (lines, split at . ! ?)."""
    docs, current = [], []
    for path in files:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise UserError(f"{path}: cannot read input text ({exc})") from exc
        for line in lines + [""]:
            line = line.strip()
            if line:
                current.extend(s for s in _SENTENCE_END.split(line) if s)
            elif current:
                docs.append(current)
                current = []
    return docs


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        del longer[0 if rng.random() < 0.5 else -1]


def _mask(tokens: list[int], special: set[int], vocab_size: int, mask_id: int, prob: float,
          max_pred: int, rng: random.Random) -> tuple[list[int], list[int], list[int]]:
    candidates = [i for i, t in enumerate(tokens) if t not in special]
    rng.shuffle(candidates)
    n = min(max_pred, max(1, round(len(tokens) * prob)))
    chosen = sorted(candidates[:n])
    out = list(tokens)
    for i in chosen:
        r = rng.random()
        if r < 0.8:
            out[i] = mask_id
        elif r < 0.9:
            out[i] = rng.randint(0, vocab_size - 1)
    return out, chosen, [tokens[i] for i in chosen]


def create_instances(docs: list[list[list[int]]], ids: dict[str, int], vocab_size: int,
                     max_seq: int, max_pred: int, masked_lm_prob: float, short_seq_prob: float,
                     dupe_factor: int, rng: random.Random) -> list[dict]:
    """The reference's instance generation over tokenised documents (lists of sentences)."""
    cls_id, sep_id, mask_id = ids["[CLS]"], ids["[SEP]"], ids["[MASK]"]
    special = {cls_id, sep_id}
    max_tokens = max_seq - 3
    out = []
    for _ in range(dupe_factor):
        for d, doc in enumerate(docs):
            target = max_tokens if rng.random() >= short_seq_prob else rng.randint(2, max_tokens)
            chunk, length, i = [], 0, 0
            while i < len(doc):
                chunk.append(doc[i])
                length += len(doc[i])
                if i == len(doc) - 1 or length >= target:
                    a_end = 1 if len(chunk) < 2 else rng.randint(1, len(chunk) - 1)
                    a = [t for s in chunk[:a_end] for t in s]
                    if len(chunk) == 1 or rng.random() < 0.5:
                        is_random = True
                        others = [j for j in range(len(docs)) if j != d]
                        other = docs[rng.choice(others)] if others else doc
                        b = []
                        for s in other[rng.randint(0, len(other) - 1):]:
                            b.extend(s)
                            if len(b) >= target - len(a):
                                break
                        i -= len(chunk) - a_end  # the unused sentences go back to the queue
                    else:
                        is_random = False
                        b = [t for s in chunk[a_end:] for t in s]
                    _truncate_pair(a, b, max_tokens, rng)
                    if a and b:
                        tokens = [cls_id, *a, sep_id, *b, sep_id]
                        segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
                        masked, pos, labels = _mask(tokens, special, vocab_size, mask_id,
                                                    masked_lm_prob, max_pred, rng)
                        out.append(dict(tokens=masked, segments=segments, positions=pos,
                                        labels=labels, is_random=is_random))
                    chunk, length = [], 0
                i += 1
    rng.shuffle(out)
    return out


def write_shard(path: Path, instances: list[dict], max_seq: int, max_pred: int) -> None:
    n = len(instances)
    ids, mask, seg = (np.zeros((n, max_seq), dtype) for dtype in (np.int32, np.int8, np.int8))
    pos, lab = np.zeros((n, max_pred), np.int32), np.zeros((n, max_pred), np.int32)
    nsp = np.zeros(n, np.int8)
    for r, inst in enumerate(instances):
        t, p = len(inst["tokens"]), len(inst["positions"])
        ids[r, :t], mask[r, :t], seg[r, :t] = inst["tokens"], 1, inst["segments"]
        pos[r, :p], lab[r, :p] = inst["positions"], inst["labels"]
        nsp[r] = inst["is_random"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for key, a in zip(KEYS, (ids, mask, seg, pos, lab, nsp)):
            f.create_dataset(key, data=a, compression="gzip")   # int32, or int8 where it fits


def prepare(inputs: list[Path], vocab: Path, output_dir: Path, max_seq: int = 512,
            max_pred: int = 76, shards: int = 1, dupe_factor: int = 10,
            masked_lm_prob: float = 0.15, short_seq_prob: float = 0.1, seed: int = 12345,
            prefix: str = "part") -> list[Path]:
    """Writes ``output_dir/{prefix}_{i:05d}_of_{shards:05d}.hdf5``; returns the paths."""
    if not inputs:
        raise UserError("no input text files given")
    tok = load_tokenizer(vocab)
    docs_text = read_documents(inputs)
    if len(docs_text) < 2:
        raise UserError(f"{', '.join(map(str, inputs))}: need at least 2 documents "
                        "(separated by blank lines) for next-sentence pairs")
    flat = [s for d in docs_text for s in d]
    enc = tok.encode_batch(flat, add_special_tokens=False)
    it = iter(e.ids for e in enc)
    docs = [[s for s in (next(it) for _ in d) if s] for d in docs_text]
    docs = [d for d in docs if d]
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    rng = random.Random(seed)
    inst = create_instances(docs, ids, tok.get_vocab_size(), max_seq, max_pred, masked_lm_prob,
                            short_seq_prob, dupe_factor, rng)
    if len(inst) < shards:
        raise UserError(f"only {len(inst)} sequences for {shards} shards: add text or "
                        "lower --shards")
    paths = []
    for i in range(shards):
        path = Path(output_dir) / f"{prefix}_{i:05d}_of_{shards:05d}.hdf5"
        write_shard(path, inst[i::shards], max_seq, max_pred)
        paths.append(path)
    return paths


@one_line_errors
def main(argv=None) -> int:
    p = OneLineParser(prog="python -m benchmarks.bert.prepare_data",
                      description=__doc__.splitlines()[0])
    p.add_argument("--input", type=Path, nargs="+", required=True, help="raw text files")
    p.add_argument("--vocab", type=Path, required=True, help="WordPiece vocab.txt")
    p.add_argument("--output-dir", type=Path, required=True)
    p.add_argument("--max-seq-length", type=int, default=512)
    p.add_argument("--max-predictions", type=int, default=76)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--dupe-factor", type=int, default=10)
    p.add_argument("--masked-lm-prob", type=float, default=0.15)
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--prefix", default="part")
    a = p.parse_args(argv)
    paths = prepare(a.input, a.vocab, a.output_dir, a.max_seq_length, a.max_predictions,
                    a.shards, a.dupe_factor, a.masked_lm_prob, a.short_seq_prob, a.seed,
                    a.prefix)
    print(f"wrote {len(paths)} shard(s) to {a.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
