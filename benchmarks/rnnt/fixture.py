"""A tiny synthesized speech corpus in LibriSpeech's on-disk format (not LibriSpeech).

    python -m benchmarks.rnnt.fixture OUTDIR [--train 2000] [--eval 2703] [--vocab-size 48] ...

Writes ``OUTDIR/train-clean-100`` and ``OUTDIR/dev-clean`` as LibriSpeech lays them out
(``<speaker>/<chapter>/<speaker>-<chapter>-<nnnn>.flac``, 16 kHz 16-bit mono, and
``<speaker>-<chapter>.trans.txt`` in capitals), then the manifests and the SentencePiece
model through ``benchmarks.rnnt.prepare_data``. Each utterance is 2-4 words drawn uniformly
from ``WORDS`` and spoken by espeak-ng (the library bundled by the ``espeakng-loader``
wheel). A speaker is an espeak voice and variant with its own speaking rate, pitch and
pitch range; each utterance varies rate and pitch a little around them, has its own gain,
and sits between 30-150 ms of near-silence (a noise floor about 100 dB below full scale), which
silence trimming removes. The dev-clean speakers are drawn apart from the training
speakers, so evaluation hears unseen voices. There is no grammar: every word must be heard.
The 2,703 evaluation utterances match dev-clean's count, which the 1.1.0 rules fix. A
``FIXTURE_COMPLETE`` file records the parameters; a folder holding the same fixture is reused.
"""

from __future__ import annotations

import argparse
import ctypes
import io
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

from benchmarks.rnnt.data import EVAL_SPLIT
from benchmarks.rnnt.features import SAMPLE_RATE
from benchmarks.rnnt.prepare_data import prepare
from common.errors import UserError
from common.fixture_cache import cached_fixture, fixture_command, stop_signals_held

TRAIN_SPLIT = "train-clean-100"
EVAL_UTTERANCES = 2703
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
         "red", "green", "blue", "yellow", "black", "white", "brown",
         "cat", "dog", "bird", "fish", "horse", "mouse",
         "big", "small", "hot", "cold", "up", "down", "left", "right", "stop", "yes", "no")
VOICES = tuple(f"{lang}+{variant}" for lang in ("en", "en-us")
               for variant in ("m1", "m2", "m3", "m4", "m5", "m7", "f1", "f2", "f3", "f4",
                               "klatt", "klatt2"))
RATE_WPM = (140, 220)
PITCH = (25, 75)
PITCH_RANGE = (30, 80)
CHAPTERS_PER_SPEAKER = 2
NOISE_FLOOR = 2**-17  # std of the noise floor under everything: about -100 dBFS

_ESPEAK_RATE, _ESPEAK_PITCH, _ESPEAK_RANGE = 1, 3, 4  # espeak_PARAMETER values
_SYNCHRONOUS, _POS_CHARACTER = 2, 1
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                             ctypes.c_void_p)


class Espeak:
    """libespeak-ng from the ``espeakng-loader`` wheel, synthesizing synchronously in-process
    (one instance per process: the library keeps global state)."""

    _instance: Espeak | None = None

    def __init__(self):
        try:
            import espeakng_loader
        except ImportError as exc:
            raise UserError("the RNN-T fixture speaks with espeak-ng: pip install "
                            "espeakng-loader (see pyproject.toml)") from exc
        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self.rate = self.lib.espeak_Initialize(_SYNCHRONOUS, 0,
                                               espeakng_loader.get_data_path().encode(), 0)
        if self.rate <= 0:
            raise UserError(f"espeak-ng failed to start (data in "
                            f"{espeakng_loader.get_data_path()})")
        self.chunks: list[np.ndarray] = []
        self.callback = _CALLBACK(self._collect)  # kept referenced while the library holds it
        self.lib.espeak_SetSynthCallback(self.callback)

    @classmethod
    def get(cls) -> Espeak:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _collect(self, wav, n: int, events) -> int:
        if n > 0:
            self.chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0

    def say(self, text: str, voice: str, rate: int, pitch: int, pitch_range: int) -> np.ndarray:
        """int16 samples at ``self.rate`` Hz."""
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise UserError(f"espeak-ng has no voice {voice!r}")
        for param, value in ((_ESPEAK_RATE, rate), (_ESPEAK_PITCH, pitch),
                             (_ESPEAK_RANGE, pitch_range)):
            self.lib.espeak_SetParameter(param, int(value), 0)
        self.chunks = []
        data = text.encode()
        with stop_signals_held():   # the library calls _collect
            failed = self.lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, 0, None,
                                           None)
            self.lib.espeak_Synchronize()
        if failed:
            raise UserError(f"espeak-ng could not synthesize {text!r}")
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int16)


def _speakers(n: int, rng: np.random.Generator) -> list[dict]:
    return [dict(voice=str(rng.choice(VOICES)), rate=int(rng.integers(*RATE_WPM)),
                 pitch=int(rng.integers(*PITCH)), pitch_range=int(rng.integers(*PITCH_RANGE)))
            for _ in range(n)]


def utterance(espeak: Espeak, words: list[str], speaker: dict,
              rng: np.random.Generator) -> np.ndarray:
    """One spoken utterance as int16 at 16 kHz."""
    raw = espeak.say(" ".join(words), speaker["voice"],
                     round(speaker["rate"] * rng.uniform(0.9, 1.1)),
                     speaker["pitch"] + int(rng.integers(-5, 6)), speaker["pitch_range"])
    loud = np.flatnonzero(np.abs(raw) > 64)
    if not len(loud):
        raise UserError(f"espeak-ng produced silence for {' '.join(words)!r}")
    speech = raw[loud[0]:loud[-1] + 1].astype(np.float64) / 32768
    speech = resample_poly(speech, SAMPLE_RATE // 50, espeak.rate // 50) * rng.uniform(0.3, 0.8)
    lead, tail = (int(rng.uniform(0.03, 0.15) * SAMPLE_RATE) for _ in range(2))
    audio = np.concatenate([np.zeros(lead), speech, np.zeros(tail)])
    audio += rng.normal(0, NOISE_FLOOR, len(audio))
    return np.clip(np.round(audio * 32768), -32768, 32767).astype(np.int16)


def flac(samples: np.ndarray) -> bytes:
    """16 kHz 16-bit mono FLAC, encoded in memory (faster than libsndfile writing a file)."""
    out = io.BytesIO()
    sf.write(out, samples, SAMPLE_RATE, format="FLAC", subtype="PCM_16", compression_level=0.5)
    return out.getvalue()


def _write_split(folder: Path, count: int, speakers: list[dict], ids: list[int],
                 rng: np.random.Generator, espeak: Espeak) -> None:
    """``count`` utterances over the speakers, each speaker's split in chapters."""
    per_speaker = np.array_split(np.arange(count), len(speakers))
    for speaker, spk_id, utts in zip(speakers, ids, per_speaker):
        for chapter_utts in np.array_split(utts, CHAPTERS_PER_SPEAKER):
            chapter = int(rng.integers(10_000, 400_000))
            where = folder / str(spk_id) / str(chapter)
            where.mkdir(parents=True)
            lines = []
            for n in range(len(chapter_utts)):
                words = [str(w) for w in rng.choice(WORDS, int(rng.integers(2, 5)))]
                uid = f"{spk_id}-{chapter}-{n:04d}"
                (where / f"{uid}.flac").write_bytes(flac(utterance(espeak, words, speaker, rng)))
                lines.append(f"{uid} {' '.join(words).upper()}\n")
            (where / f"{spk_id}-{chapter}.trans.txt").write_text("".join(lines))


def write_fixture(root: Path, train: int = 2000, eval: int = EVAL_UTTERANCES,
                  train_speakers: int = 30, eval_speakers: int = 10, vocab_size: int = 48,
                  seed: int = 0) -> Path:
    """Write the fixture under ``root`` (reused when the same one is already there)."""
    params = dict(train=train, eval=eval, train_speakers=train_speakers,
                  eval_speakers=eval_speakers, vocab_size=vocab_size, seed=seed, version=1)

    def write(tmp: Path) -> None:
        espeak = Espeak.get()
        rng = np.random.default_rng(seed)
        ids = rng.choice(np.arange(100, 10_000), train_speakers + eval_speakers, replace=False)
        _write_split(tmp / TRAIN_SPLIT, train, _speakers(train_speakers, rng),
                     ids[:train_speakers].tolist(), rng, espeak)
        _write_split(tmp / EVAL_SPLIT, eval, _speakers(eval_speakers, rng),
                     ids[train_speakers:].tolist(), rng, espeak)
        prepare(tmp, [TRAIN_SPLIT], [EVAL_SPLIT], vocab_size)
    return cached_fixture(root, params, write)


@fixture_command
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rnnt.fixture",
                                description="Write the LibriSpeech-format RNN-T fixture.")
    p.add_argument("outdir", type=Path)
    p.add_argument("--train", type=int, default=2000, help="training utterances")
    p.add_argument("--eval", type=int, default=EVAL_UTTERANCES, help="dev-clean utterances")
    p.add_argument("--train-speakers", type=int, default=30)
    p.add_argument("--eval-speakers", type=int, default=10)
    p.add_argument("--vocab-size", type=int, default=48, help="SentencePiece pieces")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    path = write_fixture(a.outdir, a.train, a.eval, a.train_speakers, a.eval_speakers,
                         a.vocab_size, a.seed)
    print(f"RNN-T fixture ready in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
