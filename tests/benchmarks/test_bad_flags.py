"""Bad numbers in every workload's flags are the parser's one-line error (exit 2), checked
when the flags are read, not a traceback after training started."""

from __future__ import annotations

import pytest

from common.bench.worker import workload_class
from common.training import build_parser
from tests.benchmarks.test_contract import WORKLOADS

BAD = [("--batch-size", "0"), ("--batch-size", "-8"), ("--eval-batch-size", "0"),
       ("--eval-batch-size", "-2"), ("--epochs", "0"), ("--epochs", "-2"), ("--workers", "-1"),
       ("--warmup-epochs", "-1"), ("--width", "0"), ("--min-size", "0"), ("--enc-hidden", "0"),
       ("--batch-size", "x"), ("--overlap", "1"), ("--filters", "0"), ("--lr", "inf"),
       ("--warmup-epochs", "inf"), ("--lr", "nan")]
CASES = [(name, flag, value) for name in WORKLOADS for flag, value in BAD
         if any(flag in a.option_strings for a in build_parser(workload_class(name))._actions)]


@pytest.mark.parametrize("name, flag, value", CASES,
                         ids=[f"{n}{f}={v}" for n, f, v in CASES])
def test_a_bad_number_is_one_line_naming_the_flag(name, flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser(workload_class(name)).parse_args([flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and flag in err[0] and value in err[0]


def test_every_workload_has_its_batch_checked():
    assert {n for n, f, _ in CASES if f == "--batch-size"} == set(WORKLOADS)
