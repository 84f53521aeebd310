"""Reading ``:::MLLOG`` lines: the facts of one run (benchmark, seed, status, time to train)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from mlperf_logging.mllog import constants

from common.errors import UserError

PREFIX = ":::MLLOG "
# How the suite's fixtures name themselves in the ``dataset`` key.
FIXTURE_PREFIX = "fixture:"
# What the RCP checker reads without looking (rcp_checker.read_submission_file): without it, it
# stops with a bare ``KeyError``. submission_division: the run's division, which its system
# description must state.
REQUIRED_EVENTS = (constants.SUBMISSION_BENCHMARK, constants.SUBMISSION_DIVISION)
REQUIRED_METADATA = {constants.RUN_STOP: constants.STATUS,
                     constants.EVAL_ACCURACY: constants.EPOCH_NUM}


def malformed(event) -> str | None:
    """What keeps a parsed line from being an mllog event the tools can read (they take its
    key, time and metadata without looking), or None."""
    if not isinstance(event, dict):
        return "not a JSON object"
    key = event.get("key")
    if not isinstance(key, str) or not key:
        return f"key {json.dumps(key)} is not a name"
    time_ms = event.get("time_ms")
    if isinstance(time_ms, bool) or not isinstance(time_ms, (int, float)) \
            or not math.isfinite(time_ms):
        return f"{key}: time_ms {json.dumps(time_ms)} is not a number of milliseconds"
    if not isinstance(event.get("metadata", {}), dict):
        return f"{key}: metadata {json.dumps(event['metadata'])} is not a JSON object"
    return None


def read_events(path: str | Path) -> list[dict]:
    """Every mllog event of a log file, in order; other lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such log file")
    events = []
    for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.startswith(PREFIX):
            continue
        try:
            event = json.loads(line[len(PREFIX):])
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{lineno}: unreadable mllog line ({exc.msg})") from exc
        problem = malformed(event)
        if problem:
            raise UserError(f"{path}:{lineno}: {problem}: the log was edited or damaged; rerun "
                            f"the benchmark")
        events.append(event)
    if not events:
        raise UserError(f"{path}: no :::MLLOG lines (is this an MLPerf log?)")
    return events


@dataclass(frozen=True)
class RunSummary:
    benchmark: str
    division: str | None
    seed: int | None
    status: str
    seconds: float | None      # run_start to run_stop
    dataset: str
    last_quality: object       # the last eval_accuracy value: a number, a dict (maskrcnn), None

    @property
    def success(self) -> bool:
        return self.status == constants.SUCCESS

    @property
    def fixture(self) -> bool:
        """Trained on a fixture, which RCPs (convergence on the real dataset) do not describe."""
        return self.dataset.startswith(FIXTURE_PREFIX)


def missing_key(path: str | Path) -> str | None:
    """The first key of ``REQUIRED_EVENTS``/``REQUIRED_METADATA`` the log lacks, or None."""
    events = read_events(path)
    keys = {ev.get("key") for ev in events}
    absent = next((k for k in REQUIRED_EVENTS if k not in keys), None)
    if absent:
        return f"no {absent} event"
    for ev in events:
        need = REQUIRED_METADATA.get(ev.get("key"))
        if need and need not in (ev.get("metadata") or {}):
            return f"{ev['key']} without metadata {need}"
    return None


def summarize(path: str | Path) -> RunSummary:
    """Benchmark, seed, status, time to train and last quality of one log.

    Bad input (``UserError``): a run_stop before run_start, a success whose run_stop is at
    the instant of its run_start (no run trains and evaluates in no time), a seed that is not
    an integer (``"1"`` would not be seen as repeating seed ``1``).
    """
    first: dict[str, dict] = {}
    last: dict[str, dict] = {}
    for ev in read_events(path):
        first.setdefault(ev["key"], ev)
        last[ev["key"]] = ev
    start, stop = first.get(constants.RUN_START), last.get(constants.RUN_STOP)
    seconds = (stop["time_ms"] - start["time_ms"]) / 1000.0 if start and stop else None
    if seconds is not None and seconds < 0:
        raise UserError(f"{path}: run_stop (time_ms {stop['time_ms']}) precedes run_start "
                        f"(time_ms {start['time_ms']}): the log gives no time to train; "
                        f"rerun the benchmark (was the clock set back during the run?)")
    status = (stop or {}).get("metadata", {}).get(constants.STATUS, "missing")
    if not isinstance(status, str):
        raise UserError(f"{path}: run_stop status {json.dumps(status)} is not a word (the "
                        f"training program logs success or aborted): rerun the benchmark")
    if seconds == 0 and status == constants.SUCCESS:
        raise UserError(f"{path}: run_stop with status success at the instant of run_start "
                        f"(time_ms {start['time_ms']}): no run trains and evaluates in no time; "
                        f"rerun the benchmark")
    seed = first.get(constants.SEED, {}).get("value")
    if seed is not None and type(seed) is not int:
        raise UserError(f"{path}: seed {json.dumps(seed)} is not an integer (the training "
                        f"program logs an int): rerun the benchmark")
    return RunSummary(
        benchmark=first.get(constants.SUBMISSION_BENCHMARK, {}).get("value", "unknown"),
        division=first.get(constants.SUBMISSION_DIVISION, {}).get("value"),
        seed=seed,
        status=status,
        seconds=seconds,
        dataset=first.get("dataset", {}).get("value", "unknown"),
        last_quality=last.get(constants.EVAL_ACCURACY, {}).get("value"),
    )
