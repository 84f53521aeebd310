"""Print the time-to-train line of a run from its log.

    python -m compliance.result [--seed S] LOG
    -> RESULT,<benchmark>,<seed>,<seconds>,<status>,<dataset>,<quality>

<seed> is the log's; ``--seed``: the seed the run was launched with, for a log that stopped
(a signal, a crash) before it recorded its own.

<quality> is the log's last eval_accuracy: ``eval_accuracy=0.7612``, a dict
value (Mask R-CNN) as ``BBOX=0.38;SEGM=0.34`` in the log's key order, or
``eval_accuracy=none`` when the run logged none.

Exit status 0 for a run that reached its target, 1 otherwise, 2 on bad input
(no log, unreadable lines, run_stop before run_start).
"""

from __future__ import annotations

import sys

from common.cli import OneLineParser, one_line_errors
from compliance.logs import summarize


def quality_field(value) -> str:
    """The last eval_accuracy as logged (no rounding near the target), without commas."""
    if value is None:
        text = "eval_accuracy=none"
    elif isinstance(value, dict):
        text = ";".join(f"{k}={v}" for k, v in value.items())
    else:
        text = f"eval_accuracy={value}"
    return text.replace(",", ";")


def result_line(summary, seed: int | None = None) -> str:
    seconds = f"{summary.seconds:.3f}" if summary.seconds is not None else "nan"
    seed = summary.seed if summary.seed is not None else seed
    return (f"RESULT,{summary.benchmark},{seed},{seconds},{summary.status},"
            f"{summary.dataset.replace(',', ';')},{quality_field(summary.last_quality)}")


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m compliance.result", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, help="the launched seed, where the log has none")
    p.add_argument("log")
    args = p.parse_args(argv)
    summary = summarize(args.log)
    print(result_line(summary, args.seed))
    return 0 if summary.success else 1


if __name__ == "__main__":
    sys.exit(main())
