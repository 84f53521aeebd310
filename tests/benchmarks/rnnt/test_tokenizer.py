"""SentencePiece as the reference trains it: options, round trip, and its errors."""

import random

import pytest

from benchmarks.rnnt.tokenizer import UNK_ID, Tokenizer, model_name, train_tokenizer
from common.errors import UserError

WORDS = "zero one two three four five six seven eight nine red green blue cat dog".split()


def _corpus(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(2, 5))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("sp") / model_name(30)
    return Tokenizer(train_tokenizer(_corpus(300), path, 30))


def test_model_has_the_references_options(tokenizer):
    sp = tokenizer.sp
    assert tokenizer.path.name == "librispeech30.model"
    assert tokenizer.path.with_suffix(".vocab").is_file()
    assert tokenizer.num_labels == len(sp) == 30 and tokenizer.blank == 30
    assert sp.id_to_piece(UNK_ID) == "<unk>" and sp.unk_id() == UNK_ID
    assert sp.bos_id() == -1 and sp.eos_id() == -1  # no sentence markers
    # character_coverage=1.0: every character of the corpus is a piece of its own
    pieces = {sp.id_to_piece(i) for i in range(len(sp))}
    assert set("".join(WORDS)) <= pieces | {p.lstrip("\u2581") for p in pieces}


def test_round_trip_on_new_sentences(tokenizer):
    for text in _corpus(50, seed=1) + ["nine", "cat cat cat dog"]:
        ids = tokenizer.encode(text)
        assert ids and all(0 < i < tokenizer.num_labels for i in ids)
        assert tokenizer.decode(ids) == text
    assert tokenizer.decode([]) == ""


def test_unknown_characters_are_refused(tokenizer):
    with pytest.raises(UserError, match="'cat q' has characters outside"):
        tokenizer.encode("cat q")


def test_too_many_pieces_for_the_corpus_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"vocab size 1023.*Vocabulary size too high") as err:
        train_tokenizer(_corpus(20), tmp_path / model_name(1023), 1023)
    assert "\n" not in str(err.value) and model_name(1023) in str(err.value)


def test_bad_model_paths(tmp_path):
    with pytest.raises(UserError, match="no such SentencePiece model"):
        Tokenizer(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(UserError, match="not a SentencePiece model"):
        Tokenizer(tmp_path / "junk.model")
    with pytest.raises(UserError, match="no transcripts"):
        train_tokenizer(["", " "], tmp_path / "empty.model", 10)
