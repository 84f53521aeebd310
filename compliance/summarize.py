"""The score table of a submission tree: time to train per run, olympic score, RCP verdict.

    python -m compliance.summarize OUTDIR [--ruleset 1.1.0]

The score follows the MLCommons result summarizer (``mlperf_logging``): the
mean of the run times in minutes after dropping the fastest and the slowest run
(4 of each of unet3d's 40). A run that did not converge (run_stop not
``success``, or rejected by the compliance checker, as the summarizer rejects
it) takes infinite time, shown ``inf``: it is the slowest run, dropped; with
more such runs than are dropped (1; unet3d 4) the benchmark has no score. Runs
on fixture data are labelled ``fixture`` and are not MLPerf results; their RCP
verdict is BYPASSED. Writes ``OUTDIR/summary.csv`` and ``OUTDIR/summary.md``.

Exit status 0, 1 when a run is not compliant or a benchmark has no score (each said in a
line), 2 on bad input.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from mlperf_logging.mllog import constants

from common.cli import OneLineParser, one_line_errors
from compliance import check, mlperf_tools, tree
from compliance.logs import summarize

COLUMNS = ("system", "benchmark", "runs", "minutes_per_run", "score_minutes", "not_converged",
           "rcp", "data")


@dataclass(frozen=True)
class Row:
    system: str
    benchmark: str
    logs: tuple[str, ...]               # result_<i>.txt names, in index order
    minutes: tuple[float | None, ...]   # run_start to run_stop, per log
    statuses: tuple[str, ...]
    compliance: tuple[check.Verdict, ...]
    rcp: str
    data: str

    @property
    def runs(self) -> int:
        return len(self.logs)

    @property
    def converged(self) -> tuple[bool, ...]:
        """Per log: a time to train. The summarizer drops a non-compliant run as not converged."""
        return tuple(s == constants.SUCCESS and v.compliant
                     for s, v in zip(self.statuses, self.compliance))

    @property
    def score_minutes(self) -> float | None:
        return mlperf_tools.olympic_score(
            self.benchmark, [m if ok else None for m, ok in zip(self.minutes, self.converged)])

    def not_converged(self) -> str:
        """The runs that did not converge and how the score treats them ("" when none)."""
        failed = [log for log, ok in zip(self.logs, self.converged) if not ok]
        if not failed:
            return ""
        if self.score_minutes is None:
            return (f"{', '.join(failed)}: no score, at most "
                    f"{mlperf_tools.max_non_converged(self.benchmark)} of {self.runs} may fail")
        return f"{', '.join(failed)}: infinite time, dropped as the slowest by olympic scoring"

    def score_text(self) -> str:
        score = "no score" if self.score_minutes is None else f"{self.score_minutes:.3f} min"
        note = self.not_converged()
        return f"{score} (did not converge: {note})" if note else score

    def cells(self) -> list[str]:
        per_run = " ".join(
            (f"{m:.3f}" if ok else "inf") + _marks(s, v.compliant)
            for m, s, v, ok in zip(self.minutes, self.statuses, self.compliance, self.converged))
        score = "n/a" if self.score_minutes is None else f"{self.score_minutes:.3f}"
        return [self.system, self.benchmark, str(self.runs), per_run, score,
                self.not_converged(), self.rcp, self.data]


def _marks(status: str, compliant: bool) -> str:
    marks = ([] if status == constants.SUCCESS else [status]) + (
        [] if compliant else ["non-compliant"])
    return f"({', '.join(marks)})" if marks else ""


def score_table(path: Path, ruleset: str = "1.1.0") -> list[Row]:
    """One row per benchmark folder, once ``tree.validate`` accepts the tree."""
    fixture = tree.validate(path, ruleset)
    rows = []
    for bench_dir, on_fixture in fixture.items():
        logs = tree.result_files(bench_dir)
        runs = [summarize(log) for log in logs]
        rows.append(Row(
            system=bench_dir.parent.name, benchmark=bench_dir.name,
            logs=tuple(log.name for log in logs),
            minutes=tuple(None if r.seconds is None else r.seconds / 60 for r in runs),
            statuses=tuple(r.status for r in runs),
            compliance=tuple(check.check_log(log, ruleset) for log in logs),
            rcp=mlperf_tools.rcp_verdict(bench_dir, ruleset, on_fixture).result(),
            data=("fixture (not an MLPerf result)" if on_fixture
                  else "; ".join(sorted({r.dataset for r in runs})))))
    return rows


def markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def print_and_write(rows: list[Row], tree: Path) -> None:
    with open(tree / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(r.cells() for r in rows)
    (tree / "summary.md").write_text(markdown(rows))
    widths = [max(len(c), *(len(r.cells()[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    for cells in [list(COLUMNS), *(r.cells() for r in rows)]:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    print(f"wrote {tree / 'summary.csv'} and {tree / 'summary.md'}")


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m compliance.summarize", description=__doc__.splitlines()[0])
    p.add_argument("tree", type=Path)
    p.add_argument("--ruleset", default="1.1.0")
    args = p.parse_args(argv)
    rows = score_table(args.tree, args.ruleset)
    if not rows:
        print(f"error: {args.tree}/results holds no <system>/<benchmark> folder", file=sys.stderr)
        return 2
    print_and_write(rows, args.tree)
    rejected = [v for r in rows for v in r.compliance if not v.compliant]
    for verdict in rejected:
        print(verdict.line())
    unscored = [r for r in rows if r.score_minutes is None]
    for row in unscored:
        print(f"{row.benchmark} on {row.system}: {row.score_text()}")
    return 1 if rejected or unscored else 0


if __name__ == "__main__":
    sys.exit(main())
