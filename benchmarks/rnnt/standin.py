"""LibriSpeech's 960 training hours at their real scale, for dry runs (``DRY_RUN``) of the RNN-T
configs: the real utterance counts and lengths, not a learnable dataset and not LibriSpeech.

    python -m benchmarks.rnnt.standin OUTDIR [--fraction 0.1] [--workers N] [--seed 0]

LibriSpeech's layout (``<split>/<speaker>/<chapter>/<id>.flac`` at 16 kHz and each chapter's
``trans.txt``) for the three training splits (28,539, 104,014 and 148,688 utterances) and
dev-clean (2,703), ``--fraction`` of each training split and ``--eval-fraction`` of dev-clean
(whole by default: the 1.1.0 rules fix it, and a dry run times its evaluation), then the
manifests and the SentencePiece model (1,023 pieces; fewer for a tiny fraction) through
``benchmarks.rnnt.prepare_data``, as for the real data. Lengths follow LibriSpeech's shape,
approximately: three utterances in four of 10-17 s, one in five of 1.5-10 s, one in twenty of
17-35 s (a mean near its 12.3 s); about 2.7 words a second of made-up words with Zipf
frequencies over 8,000 of them. The audio is quiet noise. Chapters of 40 utterances are
written by ``--workers`` processes, each from its own seeded generator, so the output does
not depend on the worker count.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from benchmarks.rnnt.data import EVAL_SPLIT, TRAIN_SPLITS
from benchmarks.rnnt.features import SAMPLE_RATE
from benchmarks.rnnt.fixture import flac
from benchmarks.rnnt.prepare_data import prepare
from benchmarks.rnnt.tokenizer import VOCAB_SIZE
from common.fixture_cache import (
    FRACTION,
    cached_fixture,
    fixture_command,
    in_processes,
    standin_parser,
)

KIND = "librispeech-standin"
UTTERANCES = dict(zip(TRAIN_SPLITS, (28_539, 104_014, 148_688))) | {EVAL_SPLIT: 2_703}
CHAPTER = 40               # utterances a chapter
WORDS_PER_SECOND = 2.7
VOCABULARY = 8_000
SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "de", "va", "zu", "ren", "tor",
             "bel", "fa", "gi", "hu", "jo", "wen", "sa")
NOISE = 60                 # peak amplitude of the audio, of 32,767


def words() -> list[str]:
    """The made-up vocabulary: 8,000 distinct words of two to four syllables."""
    out, seen, n = [], set(), 0
    while len(out) < VOCABULARY:
        digits, m = [], n
        for _ in range(2 + n % 3):
            digits.append(SYLLABLES[m % len(SYLLABLES)])
            m //= len(SYLLABLES)
        word = "".join(digits).upper()
        if word not in seen:
            seen.add(word)
            out.append(word)
        n += 1
    return out


def duration(rng: np.random.Generator) -> float:
    u = rng.random()
    low, high = (10.0, 17.0) if u < 0.75 else (1.5, 10.0) if u < 0.95 else (17.0, 35.0)
    return float(rng.uniform(low, high))


def _write_chapter(job) -> None:
    """One chapter: ``job`` is its folder, speaker, chapter, utterance count and seed."""
    folder, speaker, chapter, count, seed = job
    rng = np.random.default_rng([seed, speaker, chapter])
    vocabulary = words()
    zipf = 1.0 / np.arange(1, VOCABULARY + 1)
    zipf /= zipf.sum()
    where = Path(folder) / str(speaker) / str(chapter)
    where.mkdir(parents=True)
    lines = []
    for n in range(count):
        seconds = duration(rng)
        audio = rng.integers(-NOISE, NOISE + 1, round(seconds * SAMPLE_RATE), dtype=np.int16)
        spoken = rng.choice(VOCABULARY, max(1, round(seconds * WORDS_PER_SECOND)), p=zipf)
        uid = f"{speaker}-{chapter}-{n:04d}"
        (where / f"{uid}.flac").write_bytes(flac(audio))
        lines.append(f"{uid} {' '.join(vocabulary[i] for i in spoken)}\n")
    (where / f"{speaker}-{chapter}.trans.txt").write_text("".join(lines))


def write_standin(root, fraction: float = 0.1, workers: int = 1, seed: int = 0,
                  eval_fraction: float = 1.0, vocab_size: int = VOCAB_SIZE) -> Path:
    """Write the stand-in under ``root`` (reused when the same one is already there)."""
    counts = {split: max(1, round(n * (eval_fraction if split == EVAL_SPLIT else fraction)))
              for split, n in UTTERANCES.items()}
    params = dict(kind=KIND, utterances=counts, seed=seed, vocab_size=vocab_size, version=1)

    def write(tmp: Path) -> None:
        jobs, speaker = [], 100
        for split, count in counts.items():
            for start in range(0, count, CHAPTER):   # a speaker and a chapter each
                jobs.append((str(tmp / split), speaker, 1000 + speaker,
                             min(CHAPTER, count - start), seed))
                speaker += 1
        in_processes(_write_chapter, jobs, workers, 1)
        prepare(tmp, list(TRAIN_SPLITS), [EVAL_SPLIT], vocab_size)
    return cached_fixture(root, params, write)


@fixture_command
def main(argv=None) -> int:
    p = standin_parser("python -m benchmarks.rnnt.standin",
                       "Write LibriSpeech at its real scale (not LibriSpeech).",
                       0.1, "each training split's utterances")
    p.add_argument("--eval-fraction", type=FRACTION,
                   default=1.0, help="of dev-clean (a dry run times the whole of it)")
    p.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help="SentencePiece pieces")
    write_standin(**vars(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
