"""Word error rate as MLPerf 1.1 RNN-T scores it (mlcommons/training ``common/metrics.py``):
transcripts split on whitespace, the word-level Levenshtein distance (substitutions,
insertions and deletions cost 1) summed over all utterances, divided by the total number of
reference words; infinite when there are no reference words.
"""

from __future__ import annotations

from collections.abc import Sequence


def word_errors(hypothesis: str, reference: str) -> int:
    """Edit distance between the two word sequences."""
    hyp, ref = hypothesis.split(), reference.split()
    row = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, guess in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1,
                                           diagonal + (word != guess))
    return row[-1]


def error_counts(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[int, int]:
    """``(word errors, reference words)`` summed over the pairs (summable across ranks)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    errors = sum(word_errors(h, r) for h, r in zip(hypotheses, references))
    return errors, sum(len(r.split()) for r in references)


def word_error_rate(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Total word errors / total reference words (``inf`` without reference words)."""
    errors, words = error_counts(hypotheses, references)
    return errors / words if words else float("inf")
