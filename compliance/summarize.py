"""The score table of a submission tree: time to train per run, olympic score, RCP verdict.

    python -m compliance.summarize OUTDIR [--ruleset 1.1.0]

The score is the MLCommons result summarizer's (``mlperf_logging``): the mean
of the run times in minutes after dropping the fastest and the slowest run.
Runs on fixture data are labelled ``fixture`` and are not MLPerf results.
Writes ``OUTDIR/summary.csv`` and ``OUTDIR/summary.md``.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from common.cli import OneLineParser, one_line_errors
from common.errors import UserError
from compliance import mlperf_tools
from compliance.logs import summarize

COLUMNS = ("system", "benchmark", "runs", "minutes_per_run", "score_minutes", "rcp", "data")


@dataclass(frozen=True)
class Row:
    system: str
    benchmark: str
    runs: int
    minutes: tuple[float | None, ...]   # per result_<i>.txt, in index order
    statuses: tuple[str, ...]
    score_minutes: float | None
    rcp: str
    data: str

    def cells(self) -> list[str]:
        per_run = " ".join(
            ("nan" if m is None else f"{m:.3f}") + ("" if s == "success" else f"({s})")
            for m, s in zip(self.minutes, self.statuses))
        score = "n/a" if self.score_minutes is None else f"{self.score_minutes:.3f}"
        return [self.system, self.benchmark, str(self.runs), per_run, score, self.rcp, self.data]


def _data_label(datasets: set[str]) -> str:
    if any(d.startswith("fixture") for d in datasets):
        return "fixture (not an MLPerf result)"
    return "; ".join(sorted(datasets))


def score_table(tree: Path, ruleset: str = "1.1.0") -> list[Row]:
    results = tree / "results"
    if not results.is_dir():
        raise UserError(f"{tree}: no results/ folder: not a submission tree")
    scores, _ = mlperf_tools.olympic_scores(tree, ruleset)
    rows = []
    for system_dir in sorted(p for p in results.iterdir() if p.is_dir()):
        for bench_dir in sorted(p for p in system_dir.iterdir() if p.is_dir()):
            logs = sorted(bench_dir.glob("result_*.txt"), key=lambda p: int(p.stem.split("_")[1]))
            runs = [summarize(log) for log in logs]
            datasets = {r.dataset for r in runs}
            fixture = any(d.startswith("fixture") for d in datasets)
            rcp = mlperf_tools.rcp_verdict(bench_dir, ruleset, fixture)
            rows.append(Row(
                system=system_dir.name, benchmark=bench_dir.name, runs=len(runs),
                minutes=tuple(None if r.seconds is None else r.seconds / 60 for r in runs),
                statuses=tuple(r.status for r in runs),
                score_minutes=scores.get((system_dir.name, bench_dir.name)),
                rcp=("PASS: " if rcp.ok else "FAIL: ") + rcp.detail,
                data=_data_label(datasets)))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
