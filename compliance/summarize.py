"""The score table of a submission tree: time to train per run, olympic score, RCP verdict.

    python -m compliance.summarize OUTDIR [--ruleset 1.1.0]

The score is the MLCommons result summarizer's (``mlperf_logging``): the mean
of the run times in minutes after dropping the fastest and the slowest run.
Runs on fixture data are labelled ``fixture`` and are not MLPerf results; their
RCP verdict is BYPASSED. A run the compliance checker rejects is marked
``(non-compliant)``. Writes ``OUTDIR/summary.csv`` and ``OUTDIR/summary.md``.

Exit status 0, 1 when a run is not compliant (its verdict printed), 2 on bad input.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from common.cli import OneLineParser, one_line_errors
from compliance import check, mlperf_tools, tree
from compliance.logs import summarize

COLUMNS = ("system", "benchmark", "runs", "minutes_per_run", "score_minutes", "rcp", "data")


@dataclass(frozen=True)
class Row:
    system: str
    benchmark: str
    runs: int
    minutes: tuple[float | None, ...]   # per result_<i>.txt, in index order
    statuses: tuple[str, ...]
    compliance: tuple[check.Verdict, ...]
    score_minutes: float | None
    rcp: str
    data: str

    def cells(self) -> list[str]:
        per_run = " ".join(
            ("nan" if m is None else f"{m:.3f}") + _marks(s, v.compliant)
            for m, s, v in zip(self.minutes, self.statuses, self.compliance))
        score = "n/a" if self.score_minutes is None else f"{self.score_minutes:.3f}"
        return [self.system, self.benchmark, str(self.runs), per_run, score, self.rcp, self.data]


def _marks(status: str, compliant: bool) -> str:
    marks = ([] if status == "success" else [status]) + ([] if compliant else ["non-compliant"])
    return f"({', '.join(marks)})" if marks else ""


def score_table(path: Path, ruleset: str = "1.1.0") -> list[Row]:
    """One row per benchmark folder, once ``tree.validate`` accepts the tree."""
    fixture = tree.validate(path)
    scores, _ = mlperf_tools.olympic_scores(path, ruleset)
    rows = []
    for bench_dir, on_fixture in fixture.items():
        logs = tree.result_files(bench_dir)
        runs = [summarize(log) for log in logs]
        system = bench_dir.parent.name
        rows.append(Row(
            system=system, benchmark=bench_dir.name, runs=len(runs),
            minutes=tuple(None if r.seconds is None else r.seconds / 60 for r in runs),
            statuses=tuple(r.status for r in runs),
            compliance=tuple(check.check_log(log, ruleset) for log in logs),
            score_minutes=scores.get((system, bench_dir.name)),
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
    return 1 if rejected else 0


if __name__ == "__main__":
    sys.exit(main())
