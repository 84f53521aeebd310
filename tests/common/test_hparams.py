"""The shared checks of numeric flags (common/hparams.py): a bad number is the parser's
one-line error (exit 2) naming the flag, whichever workload or run flag it is."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from common.cli import OneLineParser
from common.hparams import (
    add_args,
    checked,
    from_args,
    hparam,
    non_negative,
    positive,
    positive_or_inf,
)


@dataclass
class Toy:
    lr: float = hparam(0.1, "base learning rate", check=positive)
    warmup_epochs: float = hparam(1.0, "epochs of warm-up", check=non_negative)
    clip_norm: float = hparam(1.0, "gradient norm clipping (inf: none)", check=positive_or_inf)
    epochs: int = hparam(3, "epoch cap", check=positive)


def _parse(*argv: str):
    p = OneLineParser(prog="toy")
    add_args(p.add_argument_group("hyper-parameters"), Toy)
    return from_args(Toy, p.parse_args(list(argv)))


@pytest.mark.parametrize("flag, value, shown", [
    ("--lr", "inf", "inf"), ("--lr", "1e400", "inf"), ("--lr", "nan", "nan"),
    ("--lr", "-1", "-1"), ("--warmup-epochs", "inf", "inf"),
    ("--warmup-epochs", "nan", "nan"), ("--clip-norm", "nan", "nan"), ("--clip-norm", "0", "0"),
    ("--epochs", "0", "0"), ("--epochs", "1.5", "1.5")])
def test_a_number_out_of_range_or_not_finite_is_one_line(flag, value, shown, capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(flag, value)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and flag in err[0] and shown in err[0], err


def test_inf_is_taken_where_it_means_none():
    assert _parse("--clip-norm", "inf").clip_norm == float("inf")
    assert _parse("--lr", "2.5", "--warmup-epochs", "0").lr == 2.5


def test_a_checked_type_names_the_rule():
    with pytest.raises(argparse.ArgumentTypeError, match="finite"):
        checked(float, positive)("inf")
    with pytest.raises(argparse.ArgumentTypeError, match="more than 0"):
        checked(float, positive_or_inf)("nan")
    assert checked(int, non_negative)("0") == 0
