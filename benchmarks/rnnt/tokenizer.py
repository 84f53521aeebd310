"""SentencePiece word pieces for RNN-T transcripts, as the MLPerf reference makes them.

The reference (``scripts/create_sentencepieces.sh``) trains a unigram model on every
training transcript (lower-cased) with ``vocab_size=1023, character_coverage=1.0,
bos_id=-1, eos_id=-1``: piece 0 is ``<unk>`` and there are no sentence markers, so the ids
are 0..vocab_size-1 and the transducer's blank is ``vocab_size``. Its tokenizer refuses a
transcript that encodes to ``<unk>``. The real run uses 1023 pieces; a small corpus cannot
hold that many, so the size is a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from common.errors import UserError

VOCAB_SIZE = 1023
UNK_ID = 0


def model_name(vocab_size: int) -> str:
    """The reference's file name for a model of ``vocab_size`` pieces."""
    return f"librispeech{vocab_size}.model"


def train_tokenizer(transcripts: Iterable[str], model_path: Path,
                    vocab_size: int = VOCAB_SIZE) -> Path:
    """Train the unigram model on ``transcripts`` and write ``model_path`` (``*.model``) and
    the matching ``*.vocab``."""
    model_path = Path(model_path)
    if model_path.suffix != ".model":
        raise UserError(f"{model_path}: a SentencePiece model file name must end in .model")
    lines = [t for t in transcripts if t.strip()]
    if not lines:
        raise UserError(f"{model_path}: no transcripts to train the SentencePiece model on")
    model_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_prefix=str(model_path.with_suffix("")),
            vocab_size=vocab_size, character_coverage=1.0, bos_id=-1, eos_id=-1,
            unk_id=UNK_ID, model_type="unigram", num_threads=1, minloglevel=2)
    except RuntimeError as exc:
        # e.g. "Vocabulary size is too high (1023). Please set it to a value <= 97."
        raise UserError(f"{model_path}: SentencePiece training failed on {len(lines)} "
                        f"transcripts with vocab size {vocab_size}: {exc}") from exc
    return model_path


class Tokenizer:
    """Transcripts <-> piece ids with a trained model; ``num_labels`` pieces, blank excluded."""

    def __init__(self, model_path: Path):
        model_path = Path(model_path)
        if not model_path.is_file():
            raise UserError(f"{model_path}: no such SentencePiece model (write it with "
                            "python -m benchmarks.rnnt.prepare_data)")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(model_path))
        except (RuntimeError, OSError) as exc:
            raise UserError(f"{model_path}: not a SentencePiece model ({exc})") from exc
        self.path = model_path
        self.num_labels = len(self.sp)

    @property
    def blank(self) -> int:
        """The transducer's blank index: one past the last piece."""
        return self.num_labels

    def encode(self, transcript: str) -> list[int]:
        """Piece ids of ``transcript``; a character the model never saw is a ``UserError``."""
        ids = self.sp.encode(transcript, out_type=int)
        if UNK_ID in ids:
            raise UserError(f"{self.path}: transcript {transcript!r} has characters outside "
                            "the SentencePiece model (<unk>)")
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of piece ids (the blank must be removed first)."""
        return self.sp.decode([int(i) for i in ids])
