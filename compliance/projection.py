"""A projected time-to-train from a dry run's log (``--dry-run STEPS``, or ``DRY_RUN=STEPS``
for ``run_and_time.sh``): a projection with its inputs shown, never a result.

    python -m compliance.projection LOG [--ruleset 1.1.0]

The ruleset's reference convergence points (RCPs, ``mlperf_logging``'s files) give the mean
epochs to converge at the run's global batch (samples for BERT; interpolated between the
RCPs around it, as the RCP checker does). A run stops at the first evaluation of its schedule
at or past that mean: the projection is that evaluation's optimizer steps times the measured
step p50, plus the evaluations up to it times the measured evaluation (the later ones at the
second evaluation's time where the workload keeps its batches; initialization is outside
MLPerf's time-to-train). The same at the timed steps' mean is printed beside it: where the
steps' times have a long tail (an input pipeline that falls behind), the p50 understates.
A dry run on a fraction of the dataset (a stand-in) is scaled to the real one: its optimizer
steps by the real dataset's steps per epoch over the run's, its evaluation by the real
evaluation set's samples over the run's (the workload's ``full_dataset``). Exit status 0
with a projection, 2 on bad input.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from mlperf_logging.mllog import constants
from mlperf_logging.rcp_checker import rcp_checker

from common.cli import OneLineParser
from common.dry_run import DRY_RUN_KEY, REPORT_KEY, Report
from common.errors import UserError
from compliance.check import DEFAULT_RULESET
from compliance.logs import read_events
from compliance.mlperf_tools import USAGE


@dataclass(frozen=True)
class Projection:
    benchmark: str
    global_batch_size: int
    rcp: str                   # which RCP, or how it was made
    mean_epochs: float         # in the schedule's units (BERT: samples)
    eval_epoch: float          # the evaluation that would end the run
    steps: int                 # on the real dataset
    evaluations: int
    report: Report

    @property
    def eval_s(self) -> float:
        """One evaluation of the real evaluation set."""
        return self.report.eval_s * self.report.eval_scale

    @property
    def later_eval_s(self) -> float:
        """An evaluation after the first: the second's time where the workload keeps its
        batches, else the first's."""
        again = self.report.eval_again_s
        return self.eval_s if again is None else again * self.report.eval_scale

    @property
    def seconds(self) -> float:
        return self.steps * self.report.step_p50_s + self.evals_s

    @property
    def evals_s(self) -> float:
        return self.eval_s + (self.evaluations - 1) * self.later_eval_s

    @property
    def step_mean_s(self) -> float:
        """The timed steps' mean, their one-off costs (compilation, graph recording, the
        loader's first reads) spread over the window: an upper bound where they recur less
        often over a whole run."""
        return self.report.train_s / self.report.steps

    @property
    def seconds_at_mean(self) -> float:
        return self.steps * self.step_mean_s + self.evals_s

    def line(self) -> str:
        r = self.report
        evaluations = f"{self.evaluations} evaluations x {self.eval_s:.2f} s"
        if r.eval_again_s is not None:
            evaluations = (f"the first evaluation {self.eval_s:.2f} s + {self.evaluations - 1} "
                           f"x {self.later_eval_s:.2f} s (from the batches it kept)")
        # BERT's RCPs and epoch_num count training samples (the ruleset's "epochs" for it)
        unit = "training samples" if self.benchmark == "bert" else "epochs"
        scaled = ""
        if r.step_scale != 1 or r.eval_scale != 1:
            scaled = (f"; scaled to the real dataset's {r.full_dataset[0]} training and "
                      f"{r.full_dataset[1]} evaluation samples from the run's {r.train_samples} "
                      f"and {r.eval_samples}")
        return (f"projected time-to-train (a projection, not a result): {self.seconds / 60:.1f} "
                f"min ({self.seconds:.1f} s) = {self.steps} steps x {r.step_p50_s * 1e3:.2f} ms "
                f"(step p50) + {evaluations}; {self.benchmark} at global "
                f"batch {self.global_batch_size} converges in {self.mean_epochs:g} {unit} on "
                f"average ({self.rcp}), so the run would stop at the evaluation at epoch_num "
                f"{self.eval_epoch:g}{scaled}; at the timed steps' mean "
                f"({self.step_mean_s * 1e3:.2f} ms, their one-off costs included): "
                f"{self.seconds_at_mean / 60:.1f} min")


def rcp_mean(benchmark: str, batch: int, ruleset: str) -> tuple[float, str]:
    """The RCP mean epochs at ``batch`` and where it came from; ValueError without one."""
    try:
        checker = rcp_checker.RCP_Checker(USAGE, ruleset, benchmark, verbose=False)
    except (OSError, KeyError) as exc:
        raise ValueError(f"no RCPs for {benchmark} in ruleset {ruleset}") from exc
    record = checker._find_rcp(batch, "pruned_rcps")
    if record is not None:
        return float(record["RCP Mean"]), f"the RCP of batch {batch}"
    low = checker._find_top_min_rcp(batch, "pruned_rcps")
    high = checker._find_bottom_max_rcp(batch, "pruned_rcps")
    if low is not None and high is not None:
        _, record = checker._create_interp_rcp(batch, low, high)
        return (float(record["RCP Mean"]),
                f"interpolated between the RCPs of batches {low['BS']} and {high['BS']}")
    if high is not None:   # below the smallest: the checker holds the run to that RCP
        return float(high["RCP Mean"]), f"the smallest RCP's, batch {high['BS']}"
    raise ValueError(f"no RCP of {benchmark} covers global batch {batch} (the largest is "
                     f"{low['BS']}): the ruleset does not allow it")


def project(path: str | Path, ruleset: str = DEFAULT_RULESET) -> Projection:
    """The projection of a dry run's log; ValueError naming what is missing."""
    found = {e["key"]: e for e in read_events(path)}
    if DRY_RUN_KEY not in found or REPORT_KEY not in found:
        raise ValueError(f"{path} is not a dry run's log: run with --dry-run STEPS "
                         f"(run_and_time.sh: DRY_RUN=STEPS)")
    try:
        report = Report(**found[REPORT_KEY]["value"])
    except TypeError as exc:
        raise ValueError(f"{path}: its {REPORT_KEY} is not one this suite writes ({exc}): "
                         f"run the dry run again") from None
    benchmark = found[constants.SUBMISSION_BENCHMARK]["value"]
    mean, rcp = rcp_mean(benchmark, report.global_batch_size, ruleset)
    for n, (step, epoch) in enumerate(report.eval_points, 1):
        if epoch >= mean:
            return Projection(benchmark, report.global_batch_size, rcp, mean, epoch,
                              round(step * report.step_scale), n, report)
    raise ValueError(f"the schedule's last evaluation (epoch_num {report.eval_points[-1][1]:g}) "
                     f"comes before the {mean:g} the RCP needs: raise the schedule's cap "
                     f"(--epochs; BERT: --max-steps)")


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m compliance.projection",
                      description="Project a time-to-train from a dry run's log.")
    p.add_argument("log", type=Path)
    p.add_argument("--ruleset", default=DEFAULT_RULESET)
    p.add_argument("--json", action="store_true", help="print the projection as JSON too")
    args = p.parse_args(argv)
    if not args.log.is_file():
        print(f"error: no such log file: {args.log}", file=sys.stderr)
        return 2
    try:
        projection = project(args.log, args.ruleset)
    except (ValueError, UserError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(projection.line())
    if args.json:
        print(json.dumps({"seconds": projection.seconds,
                          "seconds_at_mean": projection.seconds_at_mean, "rcp": projection.rcp,
                          "mean_epochs": projection.mean_epochs, "steps": projection.steps,
                          "evaluations": projection.evaluations,
                          "report": projection.report.as_dict()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
