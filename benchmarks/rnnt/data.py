"""LibriSpeech for RNN-T: the on-disk layout, the reference's JSON manifests, and loaders.

Layout (as the OpenSLR tarballs unpack): ``ROOT/<split>/<speaker>/<chapter>/`` holds
``<speaker>-<chapter>-<nnnn>.flac`` (16 kHz, mono) and ``<speaker>-<chapter>.trans.txt``,
one ``<utterance id> <TRANSCRIPT>`` line per file. Training uses train-clean-100,
train-clean-360 and train-other-500, evaluation dev-clean (2,703 utterances).

Manifests (``ROOT/librispeech-<split>.json``) keep the fields of the reference's
``utils/convert_librispeech.py``: a list of ``{"transcript": lower-cased text, "files":
[{"fname": path under ROOT, "speed": 1, "channels", "sample_rate", "bitdepth", "duration",
"num_samples", "encoding"}], "original_duration": s, "original_num_samples": n}``. The
reference converts to WAV first and records soxi's fields; here the FLAC files are listed as
they are (soxi's ``bitrate`` and ``silent`` are left out). Its reader takes
``files[-1].fname`` and ``original_duration``, and so does ``read_manifest``, which therefore
reads the reference's WAV manifests too.

Training drops utterances longer than 16.7 s and batches them with the reference's bucketing
(``BucketingSampler``); the loaders yield raw audio, and ``features.AudioFeatures`` turns it
into features on the device. A duration that is not a positive number refuses the manifest
(the reference's ``<=`` filter would silently drop a NaN), and an audio file whose length
differs from its manifest's duration by more than ``DURATION_TOLERANCE`` is refused when read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import soundfile as sf
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from benchmarks.rnnt.features import SAMPLE_RATE
from benchmarks.rnnt.tokenizer import Tokenizer, model_name
from common import loaders
from common.errors import UserError

TRAIN_SPLITS = ("train-clean-100", "train-clean-360", "train-other-500")
EVAL_SPLIT = "dev-clean"
MAX_TRAIN_DURATION = 16.7
NUM_BUCKETS = 6
PREPARE = "python -m benchmarks.rnnt.prepare_data"
DURATION_TOLERANCE = 0.01  # s; manifests record samples / rate, so any real mismatch is larger


@dataclass(frozen=True)
class Utterance:
    path: Path
    transcript: str
    duration: float        # original_duration: what the filter and the buckets use
    file_duration: float   # files[-1].duration (original_duration when absent): its length
    source: str            # "<manifest> entry <i>", for errors


def manifest_path(root: Path, split: str) -> Path:
    return Path(root) / f"librispeech-{split}.json"


def tokenizer_path(root: Path, vocab_size: int) -> Path:
    return Path(root) / "sentencepieces" / model_name(vocab_size)


class AudioInfo(NamedTuple):
    frames: int
    channels: int
    bitdepth: int | None
    encoding: str


def audio_info(path: Path) -> AudioInfo:
    """The header of a 16 kHz audio file; unreadable files and other rates are ``UserError``."""
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError, OSError) as exc:
        raise UserError(f"{path}: not a readable audio file ({exc})") from exc
    if info.samplerate != SAMPLE_RATE:
        raise UserError(f"{path}: sample rate {info.samplerate} Hz; LibriSpeech audio must be "
                        f"{SAMPLE_RATE} Hz (resample it, e.g. sox IN -r {SAMPLE_RATE} OUT)")
    bits = "".join(c for c in info.subtype if c.isdigit())
    return AudioInfo(info.frames, info.channels, int(bits) if bits else None, info.format)


def load_audio(path: Path) -> np.ndarray:
    """The samples of a 16 kHz file as float32 in [-1, 1], channels averaged."""
    try:
        with sf.SoundFile(str(path)) as f:
            rate = f.samplerate
            samples = f.read(dtype="float32")
    except (sf.LibsndfileError, RuntimeError, OSError) as exc:
        raise UserError(f"{path}: not a readable audio file ({exc})") from exc
    if rate != SAMPLE_RATE:
        raise UserError(f"{path}: sample rate {rate} Hz; LibriSpeech audio must be "
                        f"{SAMPLE_RATE} Hz")
    return samples.mean(1) if samples.ndim == 2 else samples


def manifest_entry(root: Path, audio: Path, transcript: str) -> dict:
    """One utterance in the reference's manifest format (its header read and checked)."""
    info = audio_info(audio)
    duration = info.frames / SAMPLE_RATE
    file = dict(channels=info.channels, sample_rate=float(SAMPLE_RATE), bitdepth=info.bitdepth,
                duration=duration, num_samples=info.frames, encoding=info.encoding,
                fname=audio.relative_to(root).as_posix(), speed=1)
    return dict(transcript=transcript.lower().strip(), files=[file], original_duration=duration,
                original_num_samples=info.frames)


def scan_split(root: Path, split: str) -> list[dict]:
    """The manifest entries of every utterance of ``ROOT/split`` in LibriSpeech layout."""
    root = Path(root)
    folder = root / split
    if not folder.is_dir():
        raise UserError(f"{folder}: no such LibriSpeech split folder "
                        f"(expected {split}/<speaker>/<chapter>/*.flac under {root})")
    transcripts = sorted(folder.glob("*/*/*.trans.txt"))
    if not transcripts:
        raise UserError(f"{folder}: no <speaker>/<chapter>/*.trans.txt transcript files")
    entries = []
    for trans in transcripts:
        for no, line in enumerate(_transcript_lines(trans), 1):
            if not line.strip():
                continue
            uid, _, text = line.strip().partition(" ")
            audio = trans.parent / f"{uid}.flac"
            if not text.strip():
                raise UserError(f"{trans}:{no}: empty transcript for {uid}")
            if not audio.is_file():
                raise UserError(f"{trans}:{no}: no audio file {audio} for utterance {uid}")
            entries.append(manifest_entry(root, audio, text))
    return entries


def _transcript_lines(trans: Path) -> list[str]:
    """The lines of a ``trans.txt`` file; one that is unreadable or not UTF-8 (LibriSpeech's
    are ASCII) is a ``UserError`` naming the file and the line."""
    try:
        raw = trans.read_bytes()
    except OSError as exc:
        raise UserError(f"{trans}: cannot be read ({exc.strerror}); make it readable") from None
    lines = raw.splitlines()
    for no, line in enumerate(lines, 1):
        try:
            lines[no - 1] = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{trans}:{no}: not UTF-8 text (byte {line[exc.start]:#04x} at "
                            f"column {exc.start + 1}); re-extract the LibriSpeech tarball or "
                            "fix the line") from None
    return lines


def write_manifest(path: Path, entries: list[dict]) -> Path:
    Path(path).write_text(json.dumps(entries, indent=2) + "\n")
    return Path(path)


def read_manifest(root: Path, path: Path, max_duration: float | None = None) -> list[Utterance]:
    """The utterances of a manifest (paths under ``root``), those over ``max_duration`` s
    dropped (the reference keeps ``original_duration <= max_duration``)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such manifest (write it with {PREPARE} {root})")
    try:
        entries = json.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror}); make it readable") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a JSON manifest ({exc})") from exc
    if not isinstance(entries, list):
        raise UserError(f"{path}: a manifest is a JSON list of utterances")
    out = []
    for i, e in enumerate(entries):
        try:
            fname, duration = e["files"][-1]["fname"], float(e["original_duration"])
            file_duration = float(e["files"][-1].get("duration", duration))
            transcript = e["transcript"]
            audio = Path(root) / fname
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"{path}: entry {i} lacks transcript, files[-1].fname or "
                            f"original_duration ({exc!r})") from exc
        if not str(transcript).strip():
            raise UserError(f"{audio}: empty transcript (entry {i} of {path})")
        for key, value in (("original_duration", duration), ("files[-1].duration",
                                                             file_duration)):
            if not (math.isfinite(value) and value > 0):
                raise UserError(f"{path}: entry {i} ({fname}): {key} {value} is not a positive "
                                f"number of seconds; rewrite the manifest ({PREPARE} {root})")
        if not audio.is_file():
            raise UserError(f"{path}: entry {i}: no audio file {audio}")
        if max_duration is None or duration <= max_duration:
            out.append(Utterance(audio, str(transcript).strip(), duration, file_duration,
                                 f"{path} entry {i}"))
    if not out:
        raise UserError(f"{path}: no utterances"
                        + (f" of at most {max_duration} s" if max_duration else ""))
    return out


class SpeechDataset(Dataset):
    """Utterances as ``(audio float32 [samples], piece ids int64 [pieces])``; transcripts are
    encoded once, up front."""

    def __init__(self, utterances: list[Utterance], tokenizer: Tokenizer):
        self.utterances = utterances
        self.tokens = []
        for u in utterances:
            try:
                self.tokens.append(torch.tensor(tokenizer.encode(u.transcript)))
            except UserError as exc:
                raise UserError(f"{u.path}: {exc}") from exc
        self.durations = np.array([u.duration for u in utterances])

    def __len__(self) -> int:
        return len(self.utterances)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        u = self.utterances[i]
        audio = load_audio(u.path)
        if abs(len(audio) / SAMPLE_RATE - u.file_duration) > DURATION_TOLERANCE:
            raise UserError(f"{u.path}: {len(audio)} samples ({len(audio) / SAMPLE_RATE:.3f} s), "
                            f"but {u.source} says {u.file_duration} s; re-extract the file or "
                            f"rewrite the manifest ({PREPARE} ROOT)")
        return torch.from_numpy(audio), self.tokens[i]


def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """``(audio [B, samples] zero-padded, audio_lens [B], tokens [B, pieces] 0-padded,
    token_lens [B])``, lengths int64."""
    audio, tokens = zip(*items)
    pad = torch.nn.utils.rnn.pad_sequence
    return (pad(list(audio), batch_first=True), torch.tensor([len(a) for a in audio]),
            pad(list(tokens), batch_first=True), torch.tensor([len(t) for t in tokens]))


def bucket_batches(durations: np.ndarray, global_batch: int, num_buckets: int,
                   rng: np.random.Generator) -> np.ndarray:
    """One epoch of global batches ``[steps, global_batch]`` by the reference's bucketing
    (its ``BucketingSampler``): sort by duration, split into ``num_buckets`` equal buckets,
    shuffle within each, concatenate, drop random utterances until the count divides by the
    global batch, cut into batches, shuffle the batches."""
    buckets = np.array_split(np.argsort(durations, kind="stable"), num_buckets)
    order = np.concatenate([rng.permutation(b) for b in buckets])
    drop = len(order) % global_batch
    if drop:
        order = np.delete(order, rng.choice(len(order), drop, replace=False))
    batches = order.reshape(-1, global_batch)
    rng.shuffle(batches, axis=0)
    return batches


class BucketingSampler(Sampler[list[int]]):
    """This rank's share (every ``world``-th utterance) of each global batch of
    ``bucket_batches``; the epoch's draw comes from ``(seed, epoch)``, the same on every rank.
    Call ``set_epoch`` before each epoch."""

    def __init__(self, durations: np.ndarray, global_batch: int, rank: int = 0, world: int = 1,
                 num_buckets: int = NUM_BUCKETS, seed: int = 0):
        if global_batch % world:
            raise UserError(f"global batch {global_batch} does not divide by {world} ranks")
        if len(durations) < global_batch:
            raise UserError(f"{len(durations)} training utterances are fewer than one global "
                            f"batch of {global_batch}")
        self.durations = np.asarray(durations)
        self.global_batch, self.rank, self.world = global_batch, rank, world
        self.num_buckets, self.seed, self.epoch = num_buckets, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.durations) // self.global_batch

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches(self.epoch))

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``."""
        rng = np.random.default_rng([self.seed, epoch])
        return [batch[self.rank::self.world].tolist() for batch in
                bucket_batches(self.durations, self.global_batch, self.num_buckets, rng)]


class EvalSampler(Sampler[list[int]]):
    """This rank's share (every ``world``-th utterance) in batches of ``batch``, sorted by
    duration so batches carry little padding (WER sums over all utterances, so the order does
    not change it)."""

    def __init__(self, durations: np.ndarray, batch: int, rank: int = 0, world: int = 1):
        mine = np.arange(rank, len(durations), world)
        mine = mine[np.argsort(np.asarray(durations)[mine], kind="stable")]
        self.batches = [mine[i:i + batch].tolist() for i in range(0, len(mine), batch)]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)


class TrainLoader:
    """This rank's training batches (``collate``'s tuple, pinned where a GPU is), epoch by
    epoch, from ``workers`` loader processes that serve the whole run in one stream of keys
    running on into the next epoch (``common.loaders.EpochStream``): the next epoch's first
    batches load during this one's last steps. A batch is one process's work, so a loader
    started afresh each epoch made every epoch's first step wait for one (3.3-5.8 s for 1024
    utterances in a dry run on an H200 host). Each process has one batch queued, which keeps
    the stream a dozen steps ahead with 12 processes: a global batch's padded audio is up to
    1.1 GB (1024 utterances of up to 16.7 s as float32), and with the default four a process
    the dry run's peak host memory was 63.28 GiB (9.85 GiB when each epoch started afresh)."""

    def __init__(self, dataset: SpeechDataset, global_batch: int, rank: int = 0, world: int = 1,
                 seed: int = 0, num_buckets: int = NUM_BUCKETS, workers: int = 0):
        self.sampler = BucketingSampler(dataset.durations, global_batch, rank, world,
                                        num_buckets, seed)
        self.stream = loaders.EpochStream(loaders.Batches(dataset, collate),
                                          self.sampler.batches, workers,
                                          pin=torch.cuda.is_available(), prefetch=1)

    def __len__(self) -> int:
        return len(self.sampler)

    def epoch(self, epoch: int):
        """``epoch``'s batches (a trainer takes ``len(self)`` of them)."""
        return self.stream.epoch(epoch)

    def close(self) -> None:
        self.stream.close()


def eval_loader(dataset: SpeechDataset, batch: int, rank: int = 0, world: int = 1,
                workers: int = 0) -> DataLoader:
    """Every utterance of this rank once, in batches of ``collate``'s tuple."""
    sampler = EvalSampler(dataset.durations, batch, rank, world)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=workers,
                      pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
                      worker_init_fn=loaders.quiet_on_stop)
