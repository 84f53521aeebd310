"""Print the time-to-train line of a run from its log.

    python -m compliance.result LOG
    -> RESULT,<benchmark>,<seed>,<seconds>,<status>,<dataset>

Exit status 0 for a run that reached its target, 1 otherwise.
"""

from __future__ import annotations

import sys

from common.cli import OneLineParser, one_line_errors
from compliance.logs import summarize


def result_line(summary) -> str:
    seconds = f"{summary.seconds:.3f}" if summary.seconds is not None else "nan"
    return (f"RESULT,{summary.benchmark},{summary.seed},{seconds},{summary.status},"
            f"{summary.dataset.replace(',', ';')}")


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m compliance.result", description=__doc__.splitlines()[0])
    p.add_argument("log")
    args = p.parse_args(argv)
    summary = summarize(args.log)
    print(result_line(summary))
    return 0 if summary.success else 1


if __name__ == "__main__":
    sys.exit(main())
