"""Word error rate on known strings."""

import math

import pytest

from benchmarks.rnnt.wer import error_counts, word_error_rate, word_errors


@pytest.mark.parametrize("hypothesis, reference, errors", [
    ("the cat sat", "the cat sat", 0),
    ("the bat sat", "the cat sat", 1),                 # substitution
    ("the cat sat down", "the cat sat", 1),            # insertion
    ("the sat", "the cat sat", 1),                     # deletion
    ("", "the cat sat", 3),                            # empty hypothesis: all deleted
    ("a b c", "", 3),                                  # empty reference: all inserted
    ("cat the sat", "the cat sat", 2),                 # a swap is two edits
    ("sat the cat on", "the cat sat on the mat", 4),
    ("  the   cat\tsat ", "the cat sat", 0),           # any whitespace splits words
    ("The cat sat", "the cat sat", 1),                 # case matters (transcripts are normalised)
])
def test_word_errors(hypothesis, reference, errors):
    assert word_errors(hypothesis, reference) == errors


def test_rate_is_total_errors_over_total_reference_words():
    """Not the mean of per-utterance rates: (1 + 3 + 0) / (3 + 3 + 2)."""
    hyps = ["the bat sat", "", "hello world"]
    refs = ["the cat sat", "a b c", "hello world"]
    assert error_counts(hyps, refs) == (4, 8)
    assert word_error_rate(hyps, refs) == pytest.approx(0.5)


def test_no_reference_words_is_infinite():
    assert math.isinf(word_error_rate(["a"], [""]))


def test_unequal_lists_are_refused():
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        word_error_rate(["a", "b"], ["a"])
