"""A submission tree's layout, and what the MLCommons tools take on trust, refused before they run.

    results/<system>/<benchmark>/result_<i>.txt    systems/<system>.json

The tools trust a tree's system descriptions and logs: a count they cannot
read stops the result summarizer with a traceback, a missing log key stops
the RCP checker with a bare ``KeyError``, an open division in the system
description skips their seed and RCP checks, one RCP bypass covers a whole
benchmark folder, and a run_stop status of success is believed whatever the
last evaluation says. Each is bad input here (``UserError``), named with its fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from common.errors import UserError
from compliance import mlperf_tools, system
from compliance.logs import RunSummary, missing_key, summarize


def result_files(folder: Path) -> list[Path]:
    """``result_<i>.txt`` of a folder, in the order of i."""
    logs = [p for p in folder.glob("result_*.txt") if re.fullmatch(r"result_\d+\.txt", p.name)]
    return sorted(logs, key=lambda p: int(p.stem.split("_")[1]))


def check_runs(logs: list[Path], benchmark: str, ruleset: str) -> tuple[str | None, bool]:
    """Refuse runs the checkers would misread; return their division (None: no runs) and
    whether they trained on fixture data."""
    for log in logs:
        gap = missing_key(log)
        if gap:
            raise UserError(f"{log}: {gap}, which the checkers need: rerun the benchmark or "
                            f"leave this log out")
    runs = {log: summarize(log) for log in logs}
    division = next((run.division for run in runs.values()), None)
    for log, run in runs.items():
        if run.benchmark != benchmark:
            raise UserError(f"{log} is a {run.benchmark!r} log, not {benchmark!r}: package "
                            f"each benchmark's logs on their own")
        if run.division != division:
            raise UserError(f"{log}: submission_division {run.division!r}, but {logs[0].name}'s "
                            f"is {division!r}: package open and closed runs separately")
        check_target(log, run, ruleset)
    fixture = sorted(log.name for log, run in runs.items() if run.fixture)
    if fixture and len(fixture) < len(runs):
        real = sorted(log.name for log, run in runs.items() if not run.fixture)
        raise UserError(f"{logs[0].parent}: fixture runs ({', '.join(fixture)}) mixed with "
                        f"real-data runs ({', '.join(real)}): the fixture's RCP bypass would "
                        f"cover the real runs too; package them separately")
    return division, bool(fixture)


def check_target(log: Path, run: RunSummary, ruleset: str) -> None:
    """Refuse a run that says success without ending on an evaluation that meets the target.

    The checker asks only that some evaluation met it (in the open division, not even that);
    the training program stops at the first that does, so another last value is an edit."""
    rule = mlperf_tools.target_rule(run.benchmark, ruleset)
    if not run.success or rule is None or mlperf_tools.meets_target(rule[0], run.last_quality):
        return
    raise UserError(f"{log}: run_stop says success, but its last eval_accuracy "
                    f"{json.dumps(run.last_quality)} does not meet the {run.benchmark} target "
                    f"({rule[0]}, {rule[1]}): the run did not converge; rerun it or leave this "
                    f"log out")


def check_division(desc: dict, division: str, where: str, fix: str) -> None:
    """Refuse a system description whose division is not its logs' (``division``)."""
    if desc.get("division") != division:
        raise UserError(f"{where}: division {desc.get('division')!r}, but the logs' "
                        f"submission_division is {division!r} (the checkers skip seeds and "
                        f"RCPs for open): {fix}")


REPACKAGE = "package it again with python -m compliance.package"


def read_description(json_file: Path) -> dict:
    """A system description, its fields validated (``system.validate``)."""
    try:
        desc = json.loads(json_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{json_file}: unreadable system description ({exc}): "
                        f"{REPACKAGE}") from exc
    if not isinstance(desc, dict):
        raise UserError(f"{json_file}: not a JSON object of system-description fields: "
                        f"{REPACKAGE}")
    system.validate(desc, json_file.stem, str(json_file), "correct it in that file")
    return desc


def validate(tree: Path, ruleset: str) -> dict[Path, bool]:
    """Refuse a tree the tools would misread; map each benchmark folder to fixture or not."""
    results = tree / "results"
    if not results.is_dir():
        raise UserError(f"{tree}: no results/ folder: not a submission tree")
    descs = {p.stem: read_description(p) for p in sorted((tree / "systems").glob("*.json"))}
    fixture = {}
    for system_dir in sorted(p for p in results.iterdir() if p.is_dir()):
        json_file = tree / "systems" / f"{system_dir.name}.json"
        if system_dir.name not in descs:
            raise UserError(f"{system_dir} has no system description {json_file}: "
                            f"{REPACKAGE}")
        for bench_dir in sorted(p for p in system_dir.iterdir() if p.is_dir()):
            division, fixture[bench_dir] = check_runs(result_files(bench_dir), bench_dir.name,
                                                       ruleset)
            if division is not None:
                check_division(descs[system_dir.name], division, str(json_file),
                               f"set it to {division!r} there")
    return fixture
