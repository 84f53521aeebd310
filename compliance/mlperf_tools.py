"""The MLCommons checkers and summarizer (``mlperf_logging``) called in-process, with verdicts.

The tools narrate through the root logger and stdout; each call here runs
them with both captured and returns a one-line verdict plus every message.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import yaml
from mlperf_logging.benchmark_meta import get_allowed_benchmarks, get_result_file_counts
from mlperf_logging.compliance_checker import mlp_compliance
from mlperf_logging.package_checker import package_checker
from mlperf_logging.rcp_checker import rcp_checker
from mlperf_logging.result_summarizer import result_summarizer
from mlperf_logging.system_desc_checker import system_desc_checker

USAGE = "training"
RCP_BYPASS_FILE = "package_checker_params"
# RCP outcomes the package checker lets a submitter bypass (rcp_checker.check_directory).
BYPASSABLE_RCP = ("RCP found", "RCP Interpolation", "Missing RCP")
# The RCP checker reads a submission's run count from a table of its own that lacks DLRM (later
# rulesets renamed it dlrm_dcnv2), and stopped with KeyError 'dlrm' on every DLRM submission:
# complete it from benchmark_meta's, which the package checker uses (DLRM: 5).
for _name, _runs in get_result_file_counts(USAGE).items():
    rcp_checker.submission_runs[USAGE].setdefault(_name, _runs)


PASS, FAIL = "PASS", "FAIL"
# Neither a pass nor a failure: RCPs describe convergence on the real dataset.
BYPASSED = "BYPASSED (fixture data: RCPs describe the real dataset)"


def outcome(ok: bool) -> str:
    return PASS if ok else FAIL


@dataclass(frozen=True)
class Verdict:
    check: str
    outcome: str    # PASS, FAIL or BYPASSED
    detail: str
    messages: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.outcome == FAIL

    def result(self) -> str:
        return f"{self.outcome}: {self.detail}" if self.detail else self.outcome

    def line(self) -> str:
        return f"{self.check}: {self.result()}"


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def messages(self, level: int = logging.INFO) -> list[str]:
        return [r.getMessage().strip() for r in self.records if r.levelno >= level]


@contextlib.contextmanager
def captured():
    """Collect the root logger's records and silence stdout/stderr of the tools."""
    root, handler = logging.getLogger(), _Records()
    level, handlers = root.level, root.handlers[:]
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out, \
                contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield handler, out
    finally:
        root.handlers, root.level = handlers, level


def required_runs(benchmark: str) -> int | None:
    return get_result_file_counts(USAGE).get(benchmark)


def check_run_count(bench_dir: Path, benchmark: str, ruleset: str) -> Verdict:
    found = len(list(bench_dir.glob("result_*.txt")))
    need = required_runs(benchmark)
    if need is None:
        return Verdict("run count", FAIL, f"{benchmark} is no MLPerf training benchmark")
    detail = f"{found} result files, the {ruleset} rules need {need} for {benchmark}"
    return Verdict("run count", outcome(found == need), detail)


def check_system_desc(json_file: Path, ruleset: str) -> Verdict:
    try:
        with captured() as (log, _):
            valid, *_ = system_desc_checker.check_system_desc(str(json_file), USAGE, ruleset)
    except Exception as exc:  # unreadable, not JSON, or values of the wrong type
        return Verdict("system description", FAIL,
                       f"{json_file}: the checker stopped: {type(exc).__name__}: {exc}")
    errors = log.messages(logging.ERROR)
    detail = f"{json_file.name} complete" if valid else (errors[0] if errors else "invalid")
    return Verdict("system description", outcome(valid), detail, tuple(log.messages()))


def check_package(tree: Path, ruleset: str) -> Verdict:
    """The package checker; its exit status means nothing, its last verdict line does."""
    try:
        with captured() as (log, _):
            package_checker.check_training_package(
                str(tree), USAGE, ruleset, quiet=True, werror=False, rcp_bypass=False,
                rcp_bert_train_samples=False, seed_checker_bypass=False,
                log_output=str(tree / "package_checker.log"))
    except Exception as exc:  # the checker raises on trees it cannot read
        return Verdict("package checker", FAIL, f"stopped: {type(exc).__name__}: {exc}")
    messages = log.messages()
    ok = any("PACKAGE CHECKER FOUND NO ERRORS" in m for m in messages)
    errors = [m for m in log.messages(logging.ERROR) if m]
    detail = ("no errors" if ok else
              "; ".join(dict.fromkeys(e.splitlines()[0] for e in errors[:3])) or "errors")
    return Verdict("package checker", outcome(ok), detail, tuple(messages))


def rcp_verdict(bench_dir: Path, ruleset: str, fixture: bool) -> Verdict:
    """The RCP checker's own verdict; on fixture data a pass or a bypassable failure is BYPASSED.

    RCPs describe convergence on the real dataset, so a fixture run can neither
    pass nor fail them: the tree carries ``rcp-bypass``, the verdict says why and
    keeps the checker's own result among its messages. A failure no bypass covers
    (no batch size, too few converged runs) still fails.
    """
    try:
        with captured() as (log, _):
            ok, msg, _ = rcp_checker.check_directory(
                str(bench_dir), USAGE, ruleset, verbose=False, bert_train_samples=False,
                rcp_pass="pruned_rcps", rcp_bypass=False, set_scaling=False)
    except Exception as exc:
        return Verdict("RCP checker", FAIL, f"stopped: {type(exc).__name__}: {exc}")
    if fixture and (ok or msg.startswith(BYPASSABLE_RCP)):
        return Verdict("RCP checker", BYPASSED, "", (msg, *log.messages()))
    return Verdict("RCP checker", outcome(ok), msg, tuple(log.messages()))


# The result summarizer (_compute_strong_score_standalone) and the RCP checker count a run that
# did not converge as infinitely slow: olympic scoring drops it as the slowest run. Beyond this
# many such runs a benchmark has no score.
MAX_NON_CONVERGED = {"unet3d": 4}


def max_non_converged(benchmark: str) -> int:
    return MAX_NON_CONVERGED.get(benchmark, 1)


def olympic_score(benchmark: str, minutes: list[float | None]) -> float | None:
    """The result summarizer's score of a benchmark's runs, in minutes; ``None`` in
    ``minutes`` is a run that did not converge. None when too many did not converge."""
    converged = [m for m in minutes if m is not None]
    dropped, most = len(minutes) - len(converged), max_non_converged(benchmark)
    if dropped > most:
        return None
    return result_summarizer._compute_olympic_average(converged, dropped, most)


def target_rule(benchmark: str, ruleset: str) -> tuple[str, str] | None:
    """The closed division's quality target of ``benchmark``: the compliance checker's
    ``eval_accuracy`` expression (``v`` the event) and its rule file; None without one."""
    name = f"{USAGE}_{ruleset}/closed_{benchmark}.yaml"
    path = Path(mlp_compliance.__file__).parent / name
    if not path.is_file():
        return None
    for record in yaml.safe_load(path.read_text()) or []:
        key = record.get("KEY") if isinstance(record, dict) else None
        if key and key.get("NAME") == "eval_accuracy" and key.get("ATLEAST_ONE_CHECK"):
            return key["ATLEAST_ONE_CHECK"].strip(), name
    return None


def meets_target(rule: str, value) -> bool:
    """Whether an ``eval_accuracy`` value passes a ``target_rule`` expression, evaluated as
    the checker evaluates it."""
    try:
        return bool(eval(rule, {}, {"v": {"value": value}}))  # the checker's own rule text
    except (TypeError, KeyError, IndexError):   # a value of another shape (a dict, None)
        return False


def required_benchmarks(ruleset: str) -> list[str]:
    return list(get_allowed_benchmarks(USAGE, ruleset))
