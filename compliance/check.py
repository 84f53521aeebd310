"""Run the MLCommons compliance checker on a log and print a one-line verdict.

    python -m compliance.check LOG [LOG ...] [--ruleset 1.1.0] [--verbose]

Exit status 0 when every log is compliant, 1 when one is not, 2 on bad input.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from mlperf_logging.compliance_checker import mlp_compliance

from common.cli import OneLineParser
from common.dry_run import DRY_RUN_KEY
from common.errors import UserError
from compliance.logs import read_events

DEFAULT_RULESET = "1.1.0"


@dataclass(frozen=True)
class Verdict:
    path: Path
    ruleset: str
    compliant: bool
    problems: tuple[str, ...]     # every message of the checker, in full

    def line(self) -> str:
        if self.compliant:
            return f"compliance PASS: {self.path} (training {self.ruleset})"
        first = self.problems[0].splitlines()[0] if self.problems else "unknown failure"
        more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        return f"compliance FAIL: {self.path} (training {self.ruleset}): {first}{more}"


def is_dry_run(path: Path) -> bool:
    """Whether the log is a dry run's (``--dry-run``): a measurement, never a result."""
    try:
        return any(e.get("key") == DRY_RUN_KEY for e in read_events(path))
    except UserError:   # the checker names what is wrong with the log
        return False


def check_log(path: str | Path, ruleset: str = DEFAULT_RULESET) -> Verdict:
    """Run the ``mlperf_logging`` compliance checker in-process on one log; a dry run's log
    fails without it."""
    path = Path(path)
    if ruleset not in mlp_compliance.rule_choices():
        raise ValueError(f"unknown ruleset {ruleset!r}: choose from "
                         f"{', '.join(sorted(mlp_compliance.rule_choices()))}")
    if is_dry_run(path):
        return Verdict(path, ruleset, False, (
            "a dry run's log (--dry-run, DRY_RUN): a measurement, never a result; python -m "
            "compliance.projection projects its time-to-train",))
    checker = mlp_compliance.make_checker("training", ruleset, quiet=True, werror=False)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.CRITICAL)  # the checker narrates through the root logger
    # The checker queues the rule files still to apply in a module-level list. A check that
    # raises (a rule evaluated on a value of the wrong type, a benchmark without rules) leaves
    # the rest queued, and the next log would be checked against them: empty it around each log.
    mlp_compliance.enqueued_configs.clear()
    try:
        valid = checker.check_file(str(path), f"training_{ruleset}/common.yaml")
    except Exception as exc:  # e.g. a benchmark name the ruleset has no rules for
        return Verdict(path, ruleset, False, (f"checker stopped: {type(exc).__name__}: {exc}",))
    finally:
        mlp_compliance.enqueued_configs.clear()
        root.setLevel(level)
    problems = (*checker.overwritable.values(), *checker.not_overwritable)
    return Verdict(path, ruleset, bool(valid), tuple(problems))


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m compliance.check",
                      description="Check MLPerf training logs with the MLCommons checker.")
    p.add_argument("logs", nargs="+", type=Path)
    p.add_argument("--ruleset", default=DEFAULT_RULESET,
                   choices=sorted(mlp_compliance.rule_choices()))
    p.add_argument("--verbose", action="store_true", help="print every checker message")
    args = p.parse_args(argv)
    missing = [str(x) for x in args.logs if not x.is_file()]
    if missing:
        print(f"error: no such log file: {', '.join(missing)}", file=sys.stderr)
        return 2
    ok = True
    for path in args.logs:
        verdict = check_log(path, args.ruleset)
        print(verdict.line())
        if args.verbose:
            for msg in verdict.problems:
                print(msg)
        ok &= verdict.compliant
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
