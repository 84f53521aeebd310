"""``benchmarks.rnnt.standin``: LibriSpeech's splits at a fraction of their utterance counts,
with its lengths, in its layout and through prepare_data, for dry runs."""

import json
from types import SimpleNamespace

import soundfile as sf

from benchmarks.rnnt import standin
from benchmarks.rnnt.data import EVAL_SPLIT, TRAIN_SPLITS
from benchmarks.rnnt.workload import RNNTWorkload


def test_a_fraction_of_librispeech_in_its_layout(tmp_path):
    root = standin.write_standin(tmp_path / "ls", fraction=0.0005, eval_fraction=0.01,
                                 vocab_size=100, workers=2)
    counts = dict(zip([*TRAIN_SPLITS, EVAL_SPLIT], (14, 52, 74, 27)))
    seconds = []
    for split, count in counts.items():
        entries = json.loads((root / f"librispeech-{split}.json").read_text())
        assert len(entries) == count == len(list((root / split).rglob("*.flac")))
        for e in entries:
            path = root / e["files"][-1]["fname"]
            assert sf.info(path).samplerate == 16000
            seconds.append(e["original_duration"])
            assert 1.5 <= e["original_duration"] <= 35
            assert len(e["transcript"].split()) == max(1, round(e["original_duration"] * 2.7))
    assert 9 < sum(seconds) / len(seconds) < 16          # LibriSpeech: 12.3 s on average
    assert (root / "sentencepieces" / "librispeech100.model").is_file()
    wl = SimpleNamespace(synthetic=False, train_set=range(140), eval_set=range(27),
                         hp=SimpleNamespace(vocab_size=100), args=SimpleNamespace(data_dir=root))
    assert RNNTWorkload.dataset.fget(wl).startswith("stand-in: LibriSpeech's lengths")
