"""The LibriSpeech layout of the fixture, the reference's manifests, bucketing, the loaders, and
each bad-input error."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from benchmarks.rnnt import data
from benchmarks.rnnt.features import AudioFeatures, nonsilent_region
from benchmarks.rnnt.fixture import TRAIN_SPLIT, WORDS, flac
from benchmarks.rnnt.prepare_data import main as prepare_main
from benchmarks.rnnt.tokenizer import Tokenizer
from common.errors import UserError, one_line
from tests.benchmarks.rnnt.conftest import SMALL

REPO = Path(__file__).resolve().parents[3]
FILE_KEYS = {"channels", "sample_rate", "bitdepth", "duration", "num_samples", "encoding",
             "fname", "speed"}


def _tokenizer(root):
    return Tokenizer(data.tokenizer_path(root, SMALL["vocab_size"]))


def test_fixture_is_librispeech_layout(speech_fixture):
    speakers = {}
    for split, count in ((TRAIN_SPLIT, SMALL["train"]), (data.EVAL_SPLIT, SMALL["eval"])):
        trans = sorted((speech_fixture / split).glob("*/*/*.trans.txt"))
        lines = [line for t in trans for line in t.read_text().splitlines()]
        assert len(lines) == count
        speakers[split] = {t.parent.parent.name for t in trans}
        for t in trans:
            speaker, chapter = t.parent.parent.name, t.parent.name
            assert t.name == f"{speaker}-{chapter}.trans.txt"
            for line in t.read_text().splitlines():
                uid, text = line.split(" ", 1)
                assert uid.startswith(f"{speaker}-{chapter}-") and len(uid.split("-")[2]) == 4
                assert text == text.upper() and 2 <= len(text.split()) <= 4
                assert set(text.lower().split()) <= set(WORDS)
                info = sf.info(str(t.parent / f"{uid}.flac"))
                assert (info.format, info.subtype, info.samplerate, info.channels) == (
                    "FLAC", "PCM_16", 16000, 1)
    assert len(speakers[TRAIN_SPLIT]) == SMALL["train_speakers"]
    assert len(speakers[data.EVAL_SPLIT]) == SMALL["eval_speakers"]
    assert not speakers[TRAIN_SPLIT] & speakers[data.EVAL_SPLIT]


def test_fixture_speech_sits_in_trimmable_silence(speech_fixture):
    utts = data.read_manifest(speech_fixture, data.manifest_path(speech_fixture, "dev-clean"))
    audio = [torch.from_numpy(data.load_audio(u.path)) for u in utts[:8]]
    lens = torch.tensor([len(a) for a in audio])
    padded = torch.nn.utils.rnn.pad_sequence(audio, batch_first=True)
    first, count = nonsilent_region(padded, lens)
    assert (first >= 0.03 * 16000 - 1).all()  # the leading 30-150 ms of near-silence goes
    assert (count < lens).all() and (count > 0.3 * 16000).all()
    assert 0.05 < max(a.abs().max() for a in audio) < 1


def test_manifest_has_the_references_fields(speech_fixture):
    path = data.manifest_path(speech_fixture, "dev-clean")
    assert path.name == "librispeech-dev-clean.json"
    entries = json.loads(path.read_text())
    assert len(entries) == SMALL["eval"]
    for e in entries:
        assert set(e) == {"transcript", "files", "original_duration", "original_num_samples"}
        (file,) = e["files"]
        assert set(file) == FILE_KEYS and file["speed"] == 1
        audio = speech_fixture / file["fname"]
        assert file["fname"].startswith("dev-clean/") and audio.suffix == ".flac"
        info = sf.info(str(audio))
        assert file["num_samples"] == e["original_num_samples"] == info.frames
        assert file["duration"] == e["original_duration"] == info.frames / 16000
        assert (file["sample_rate"], file["channels"], file["bitdepth"], file["encoding"]) == (
            16000.0, 1, 16, "FLAC")
        uid = audio.stem
        trans = audio.parent / f"{audio.parent.parent.name}-{audio.parent.name}.trans.txt"
        line = next(ln for ln in trans.read_text().splitlines() if ln.startswith(uid + " "))
        assert e["transcript"] == line.split(" ", 1)[1].lower()


def test_read_manifest_drops_long_training_utterances(speech_fixture):
    path = data.manifest_path(speech_fixture, TRAIN_SPLIT)
    utts = data.read_manifest(speech_fixture, path)
    assert len(utts) == SMALL["train"]
    cut = float(np.median([u.duration for u in utts]))
    kept = data.read_manifest(speech_fixture, path, max_duration=cut)
    assert 0 < len(kept) < len(utts) and max(u.duration for u in kept) <= cut
    assert data.MAX_TRAIN_DURATION == 16.7


def test_tokenizer_model_is_trained_on_the_training_transcripts(speech_fixture):
    tok = _tokenizer(speech_fixture)
    assert tok.num_labels == SMALL["vocab_size"]
    for u in data.read_manifest(speech_fixture, data.manifest_path(speech_fixture, "dev-clean")):
        assert tok.decode(tok.encode(u.transcript)) == u.transcript


def test_bucketing_keeps_batches_full_disjoint_and_even():
    rng = np.random.default_rng(0)
    durations = rng.uniform(1, 16, 1003)
    batches = data.bucket_batches(durations, 64, 6, np.random.default_rng(1))
    assert batches.shape == (1003 // 64, 64)
    assert len(np.unique(batches)) == batches.size
    spread = np.ptp(durations[batches], axis=1).mean()
    random = np.ptp(durations[rng.permutation(1003)[:960].reshape(-1, 64)], axis=1).mean()
    # batches mostly stay inside one of six duration buckets (each 2.5 s wide here), drawn at
    # random within it (sorted runs of 64 would span about 1 s)
    assert 1.5 < spread < random / 3
    again = data.bucket_batches(durations, 64, 6, np.random.default_rng(1))
    assert np.array_equal(batches, again)
    # the batches come in random order, not bucket after bucket
    assert abs(np.corrcoef(np.arange(len(batches)), durations[batches].mean(1))[0, 1]) < 0.8


def test_sampler_splits_each_global_batch_over_ranks():
    durations = np.random.default_rng(0).uniform(1, 16, 100)
    samplers = [data.BucketingSampler(durations, 8, rank, 4, seed=5) for rank in range(4)]
    for s in samplers:
        s.set_epoch(3)
    per_rank = [list(s) for s in samplers]
    assert all(len(r) == len(samplers[0]) == 12 for r in per_rank)
    whole = data.bucket_batches(durations, 8, 6, np.random.default_rng([5, 3]))
    for step in range(12):
        shares = [per_rank[r][step] for r in range(4)]
        assert all(len(s) == 2 for s in shares)
        assert sorted(sum(shares, [])) == sorted(whole[step].tolist())
    samplers[0].set_epoch(4)
    assert list(samplers[0]) != per_rank[0]
    with pytest.raises(UserError, match="does not divide"):
        data.BucketingSampler(durations, 10, 0, 4)
    with pytest.raises(UserError, match="fewer than one global batch"):
        data.BucketingSampler(durations[:5], 8)


def test_eval_sampler_covers_every_utterance_once():
    durations = np.random.default_rng(0).uniform(1, 16, 103)
    seen = []
    for rank in range(3):
        batches = list(data.EvalSampler(durations, 10, rank, 3))
        flat = sum(batches, [])
        assert np.all(np.diff(durations[flat]) >= 0)  # sorted: little padding
        seen += flat
    assert sorted(seen) == list(range(103))


def test_the_training_loader_runs_on_from_one_epoch_into_the_next(speech_fixture):
    """Epochs taken as the trainer takes them (their count of batches, no more) from loader
    processes that serve the run: each batch is the sampler's batch of that epoch."""
    utts = data.read_manifest(speech_fixture, data.manifest_path(speech_fixture, TRAIN_SPLIT),
                              data.MAX_TRAIN_DURATION)
    dataset = data.SpeechDataset(utts, _tokenizer(speech_fixture))
    loader = data.TrainLoader(dataset, global_batch=8, seed=5, workers=2)
    try:
        for epoch in (1, 2, 3):
            expected = loader.sampler.batches(epoch)
            got = list(loader.epoch(epoch))
            assert len(got) == len(expected) == len(loader)
            for (_, audio_lens, _, token_lens), indices in zip(got, expected, strict=True):
                assert audio_lens.tolist() == [len(data.load_audio(utts[i].path))
                                               for i in indices]
                assert token_lens.tolist() == [len(dataset.tokens[i]) for i in indices]
    finally:
        loader.close()


def test_loaders_yield_padded_audio_and_tokens(speech_fixture):
    tok = _tokenizer(speech_fixture)
    utts = data.read_manifest(speech_fixture, data.manifest_path(speech_fixture, TRAIN_SPLIT),
                              data.MAX_TRAIN_DURATION)
    dataset = data.SpeechDataset(utts, tok)
    loader = data.TrainLoader(dataset, global_batch=8, rank=1, world=2, seed=0)
    batches = list(loader.epoch(0))
    loader.close()
    assert len(batches) == len(loader) == SMALL["train"] // 8
    audio, audio_lens, tokens, token_lens = batches[0]
    assert audio.dtype == torch.float32 and audio.shape == (4, audio_lens.max())
    assert tokens.dtype == torch.int64 and tokens.shape == (4, token_lens.max())
    transcripts = {str(u.path): u.transcript for u in utts}
    for b in range(4):
        assert audio[b, audio_lens[b]:].abs().sum() == 0
        assert (tokens[b, token_lens[b]:] == 0).all()
        text = tok.decode(tokens[b, :token_lens[b]].tolist())
        match = [p for p, t in transcripts.items() if t == text]
        assert any(np.array_equal(data.load_audio(Path(p)), audio[b, :audio_lens[b]].numpy())
                   for p in match)
    feats, steps = AudioFeatures()(audio, audio_lens, train=True)
    assert feats.shape == (4, steps.max(), 240)
    evals = list(data.eval_loader(data.SpeechDataset(utts, tok), batch=16))
    assert sum(len(b[1]) for b in evals) == len(utts)


@pytest.fixture
def tiny_tree(speech_fixture, tmp_path):
    """One dev-clean chapter of the fixture copied into a fresh LibriSpeech tree."""
    chapter = sorted((speech_fixture / "dev-clean").glob("*/*"))[0]
    dest = tmp_path / "dev-clean" / chapter.parent.name / chapter.name
    shutil.copytree(chapter, dest)
    trans = next(dest.glob("*.trans.txt"))
    return tmp_path, trans, sorted(dest.glob("*.flac"))


def _prepare_error(root, capsys) -> str:
    assert prepare_main([str(root), "--train-splits", "dev-clean", "--eval-splits",
                         "--vocab-size", "30"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    return err


def test_prepare_data_on_a_good_tree(tiny_tree, capsys):
    root, _, flacs = tiny_tree
    assert prepare_main([str(root), "--train-splits", "dev-clean", "--eval-splits",
                         "--vocab-size", "30"]) == 0
    assert len(json.loads(data.manifest_path(root, "dev-clean").read_text())) == len(flacs)
    assert data.tokenizer_path(root, 30).is_file()


def test_transcript_line_for_a_missing_audio_file(tiny_tree, capsys):
    root, trans, flacs = tiny_tree
    flacs[1].unlink()
    err = _prepare_error(root, capsys)
    assert f"{trans}:2: no audio file {flacs[1]}" in err


def test_audio_at_another_sample_rate(tiny_tree, capsys):
    root, _, flacs = tiny_tree
    sf.write(flacs[0], np.zeros(8000, np.int16), 8000, subtype="PCM_16")
    assert f"{flacs[0]}: sample rate 8000 Hz" in _prepare_error(root, capsys)
    with pytest.raises(UserError, match="sample rate 8000 Hz"):
        data.load_audio(flacs[0])


def test_empty_transcript(tiny_tree, capsys):
    root, trans, _ = tiny_tree
    lines = trans.read_text().splitlines()
    trans.write_text("\n".join([lines[0], lines[1].split(" ")[0] + " ", *lines[2:]]) + "\n")
    assert f"{trans}:2: empty transcript for {lines[1].split(' ')[0]}" in _prepare_error(
        root, capsys)


def test_unreadable_flac(tiny_tree, capsys):
    root, _, flacs = tiny_tree
    flacs[2].write_bytes(b"fLaC but not really a FLAC stream")
    assert f"{flacs[2]}: not a readable audio file" in _prepare_error(root, capsys)
    with pytest.raises(UserError, match="not a readable audio file"):
        data.load_audio(flacs[2])
    good = flac(np.zeros(1600, np.int16))
    flacs[3].write_bytes(good[:len(good) // 2])  # header intact, stream cut
    with pytest.raises(UserError, match=f"{flacs[3]}: not a readable audio file"):
        data.load_audio(flacs[3])


def test_transcript_that_is_not_utf8(tiny_tree, capsys):
    root, trans, _ = tiny_tree
    lines = trans.read_bytes().splitlines()
    lines[2] = lines[2].replace(b" ", b" \xe9", 1)  # Latin-1, not UTF-8
    trans.write_bytes(b"\n".join(lines) + b"\n")
    err = _prepare_error(root, capsys)
    assert f"{trans}:3: not UTF-8 text (byte 0xe9 at column " in err


@pytest.mark.parametrize("key", ["original_duration", "duration"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", -1.0, 0.0])
def test_manifest_duration_that_is_not_a_positive_number(tiny_tree, tmp_path, key, value):
    root, _, flacs = tiny_tree
    entries = [data.manifest_entry(root, f, "a b") for f in flacs[:3]]
    target = entries[1] if key == "original_duration" else entries[1]["files"][-1]
    target[key] = value
    path = tmp_path / "m.json"
    path.write_text(json.dumps(entries))  # NaN and Infinity as json writes them
    shown = "files[-1].duration" if key == "duration" else key
    fname = entries[1]["files"][-1]["fname"]
    for max_duration in (None, data.MAX_TRAIN_DURATION):
        with pytest.raises(UserError) as caught:
            data.read_manifest(root, path, max_duration)
        assert str(caught.value).startswith(f"{path}: entry 1 ({fname}): {shown} {float(value)} "
                                            "is not a positive number of seconds")


def test_audio_shorter_than_its_manifest_says(tiny_tree, tmp_path, monkeypatch):
    root, _, flacs = tiny_tree
    entries = [data.manifest_entry(root, f, "a b") for f in flacs[:2]]
    path = data.write_manifest(tmp_path / "m.json", entries)
    sf.write(flacs[1], np.array([0, 100, -100], np.int16), data.SAMPLE_RATE, subtype="PCM_16")
    dataset = data.SpeechDataset(data.read_manifest(root, path), _tokenizer_stub())
    assert dataset[0][0].numel() == entries[0]["original_num_samples"]
    said = entries[1]["original_duration"]
    with pytest.raises(UserError) as caught:
        dataset[1]
    assert str(caught.value).startswith(
        f"{flacs[1]}: 3 samples (0.000 s), but {path} entry 1 says {said} s; ")
    # and through a loader worker, still one line naming the file
    loader = data.eval_loader(dataset, 2, workers=1)
    with pytest.raises(Exception) as caught:
        next(iter(loader))
    assert one_line(caught.value).startswith(f"{flacs[1]}: 3 samples")


def _tokenizer_stub():
    class Stub:
        def encode(self, text):
            return [1] * len(text.split())
    return Stub()


def test_bad_manifests(tiny_tree, tmp_path):
    root, _, flacs = tiny_tree
    path = tmp_path / "m.json"
    entry = data.manifest_entry(root, flacs[0], "a b")
    for entries, message in (([dict(entry, transcript=" ")], f"{flacs[0]}: empty transcript"),
                             ([{"transcript": "x"}], "entry 0 lacks"),
                             ([dict(entry, files=[dict(entry["files"][0], fname="no.flac")])],
                              "entry 0: no audio file"),
                             ([dict(entry, files=[dict(entry["files"][0], fname=3)])],
                              "entry 0 lacks"), ([entry, 5], "entry 1 lacks")):
        path.write_text(json.dumps(entries))
        with pytest.raises(UserError, match=message):
            data.read_manifest(root, path)
    with pytest.raises(UserError, match="no such manifest"):
        data.read_manifest(root, tmp_path / "none.json")


def test_prepare_data_exit_code_and_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "benchmarks.rnnt.prepare_data", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'train-clean-100'}: no such LibriSpeech split folder (expected "
        f"train-clean-100/<speaker>/<chapter>/*.flac under {tmp_path})"]


@pytest.mark.parametrize("value", ["0", "-5", "x"])
def test_prepare_data_refuses_a_bad_vocab_size_before_scanning(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exc:
        prepare_main([str(tmp_path), "--vocab-size", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "--vocab-size" in err[0], err


def test_unreadable_manifest_is_one_line(tiny_tree, tmp_path, monkeypatch):
    """Tests run as root, whom chmod 000 does not stop: the read fails as it would."""
    root, _, flacs = tiny_tree
    path = tmp_path / "m.json"
    path.write_text(json.dumps([data.manifest_entry(root, flacs[0], "a b")]))

    def denied(self, *a, **kw):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(UserError, match=r"m.json: cannot be read \(Permission denied\)"):
        data.read_manifest(root, path)
