"""A LibriSpeech tree -> the reference's JSON manifests and SentencePiece model.

    python -m benchmarks.rnnt.prepare_data ROOT [--train-splits train-clean-100 ...]
        [--eval-splits dev-clean] [--vocab-size 1023]

For each split ``ROOT/<split>/<speaker>/<chapter>/`` writes ``ROOT/librispeech-<split>.json``
(see ``benchmarks.rnnt.data``), then trains the unigram model on the training transcripts
(as the reference's ``scripts/create_sentencepieces.sh``) into
``ROOT/sentencepieces/librispeech<vocab>.model``. Only FLAC headers are read. A missing audio
file, audio at another sample rate, an empty transcript, a transcript line that is not
UTF-8 or an unreadable file stops it with one line naming the file (and the line).
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.rnnt.data import (
    EVAL_SPLIT,
    TRAIN_SPLITS,
    manifest_path,
    scan_split,
    tokenizer_path,
    write_manifest,
)
from benchmarks.rnnt.tokenizer import VOCAB_SIZE, train_tokenizer
from common.cli import OneLineParser, one_line_errors
from common.hparams import checked, positive


def prepare(root: Path, train_splits: list[str], eval_splits: list[str],
            vocab_size: int = VOCAB_SIZE) -> tuple[list[Path], Path]:
    """Write every split's manifest and the tokenizer model; returns their paths."""
    root = Path(root)
    manifests, train_text = [], []
    for split in [*train_splits, *eval_splits]:
        entries = scan_split(root, split)
        manifests.append(write_manifest(manifest_path(root, split), entries))
        if split in train_splits:
            train_text += [e["transcript"] for e in entries]
    model = train_tokenizer(train_text, tokenizer_path(root, vocab_size), vocab_size)
    return manifests, model


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m benchmarks.rnnt.prepare_data",
                      description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="the LibriSpeech folder holding the split folders")
    p.add_argument("--train-splits", nargs="+", default=list(TRAIN_SPLITS))
    p.add_argument("--eval-splits", nargs="*", default=[EVAL_SPLIT])
    p.add_argument("--vocab-size", type=checked(int, positive), default=VOCAB_SIZE,
                   help="SentencePiece pieces (checked before the tree is scanned)")
    a = p.parse_args(argv)
    manifests, model = prepare(a.root, a.train_splits, a.eval_splits, a.vocab_size)
    print(f"wrote {', '.join(m.name for m in manifests)} and {model.relative_to(a.root)} "
          f"in {a.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
