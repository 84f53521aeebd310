"""One small RNN-T fixture per test session, shared by the rnnt tests."""

import pytest

SMALL = dict(train=60, eval=40, train_speakers=4, eval_speakers=2, vocab_size=40)


@pytest.fixture(scope="session")
def speech_fixture(tmp_path_factory):
    from benchmarks.rnnt.fixture import write_fixture  # soundfile and espeak only where used
    return write_fixture(tmp_path_factory.mktemp("rnnt") / "librispeech", **SMALL)
