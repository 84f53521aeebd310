"""Package run logs as an MLCommons training submission tree and check it with the real tools.

    python -m compliance.package --submitter ORG --system SYSTEM --benchmark resnet LOGDIR OUTDIR
        [--field KEY=VALUE ...] [--system-desc FILE] [--ruleset 1.1.0]
    python -m compliance.package --check OUTDIR

Writes ``OUTDIR/results/<system>/<benchmark>/result_<i>.txt`` (the logs of
LOGDIR, renumbered), ``OUTDIR/systems/<system>.json`` (detected from this
machine, completed by ``--field``/``--system-desc``) and
``OUTDIR/benchmarks/<benchmark>/implementations/pytorch/`` (the code, with
its git commit in ``CODE_REFERENCE.json``). Then runs the run count, the
system-description checker, the compliance checker on each log, a seed
check, the RCP checker, the package checker and the result summarizer, one
verdict line each, and prints the score table. Runs on fixture data get
``rcp-bypass`` and are labelled as such; the RCP verdict says BYPASSED. A run
that did not converge counts as infinitely slow (``compliance.summarize``).
What the tools take on trust is refused first (``compliance.tree``), and so
is an OUTDIR that holds an input (LOGDIR, a file a log links to, ``--system-desc``,
the code it copies) or lies in one: packaging replaces what it writes and never writes
over what it reads.

Exit status 0 when every check passes, 1 when one fails, 2 on bad input.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from common.cli import OneLineParser, one_line_errors
from common.errors import UserError
from compliance import mlperf_tools, system, tree
from compliance.check import check_log
from compliance.logs import read_events, summarize
from compliance.summarize import print_and_write, score_table

REPO = Path(__file__).resolve().parents[1]
IMPLEMENTATION = "pytorch"
CODE_SUFFIXES = {".py", ".sh", ".toml", ".md"}


def result_logs(logdir: Path) -> list[Path]:
    if not logdir.is_dir():
        raise UserError(f"{logdir}: no such log directory (run_and_time.sh writes "
                        f"LOGDIR/result_<i>.txt)")
    logs = tree.result_files(logdir)
    if not logs:
        raise UserError(f"{logdir}: no result_<i>.txt logs (run run_and_time.sh with "
                        f"LOGDIR={logdir} NEXP=N first)")
    return logs


def first_value(log: Path, key: str):
    return next((e.get("value") for e in read_events(log) if e.get("key") == key), None)


def parse_fields(pairs: list[str]) -> dict:
    fields = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--field {pair!r}: expected KEY=VALUE, e.g. --field cooling=air")
        if key not in system.REQUIRED_FIELDS:
            raise UserError(f"--field {key}: not a system-description field; fields are "
                            f"{', '.join(system.REQUIRED_FIELDS)}")
        fields[key] = value
    return fields


def system_description(args, logs: list[Path], division: str) -> dict:
    """The description of ``args.system``; ``division`` is the logs'."""
    given = {}
    if args.system_desc:
        try:
            given = json.loads(Path(args.system_desc).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"--system-desc {args.system_desc}: {exc}") from exc
    status = first_value(logs[0], "submission_status") or "onprem"
    given.update({"submitter": args.submitter, "system_name": args.system,
                  "division": given.get("division", division),
                  "status": given.get("status", system.STATUS.get(status, status))})
    given.update(parse_fields(args.field))
    desc = system.describe(given)
    missing = system.missing_fields(desc)
    if missing:
        raise UserError("cannot detect " + ", ".join(missing) + ": give each with "
                        "--field NAME=VALUE (or all in --system-desc FILE)")
    fix = "correct it with --field NAME=VALUE (or in --system-desc FILE)"
    system.validate(desc, args.system, "system description", fix)
    tree.check_division(desc, division, "system description", fix)
    return desc


def git_reference() -> dict:
    def git(*cmd):
        try:
            return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True,
                                  timeout=30, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain")),
            "remote": git("config", "--get", "remote.origin.url")}


def code_sources(benchmark: str) -> list[Path]:
    """The files and folders of this checkout that a tree's implementation copies."""
    return [REPO / "pyproject.toml", REPO / "benchmarks" / "__init__.py", REPO / "common",
            REPO / "compliance", REPO / "benchmarks" / benchmark]


def copy_code(benchmark: str, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    files = []
    for src in code_sources(benchmark):
        files += [src] if src.is_file() else [
            p for p in src.rglob("*") if p.is_file() and p.suffix in CODE_SUFFIXES
            and "__pycache__" not in p.parts]
    for src in files:
        target = dest / src.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    (dest / "CODE_REFERENCE.json").write_text(json.dumps(git_reference(), indent=2) + "\n")


def refuse_overlap(args) -> None:
    """The packager replaces what it writes under OUTDIR: an input there (LOGDIR, a log that
    links there, ``--system-desc``, the code it copies) would be deleted or overwritten, and an
    OUTDIR inside an input mixes the tree into it."""
    again = "name a new OUTDIR (a tree is packaged again from a copy of its logs elsewhere)"
    inputs = [(f"LOGDIR {args.logdir}", args.logdir, again)]
    if args.logdir.is_dir():
        inputs += [(f"LOGDIR's {log.name} (a link to {log.resolve()})", log, again)
                   for log in tree.result_files(args.logdir) if log.is_symlink()]
    if args.system_desc is not None:
        inputs.append((f"--system-desc {args.system_desc}", args.system_desc, again))
    inputs += [(f"the code it packages ({src})", src, "name a new OUTDIR away from the code")
               for src in code_sources(args.benchmark)]
    out = args.outdir.resolve()
    for name, given, fix in inputs:
        src = Path(given).resolve()
        if src == out or out in src.parents:
            raise UserError(f"{name} lies in OUTDIR {args.outdir}, which packaging rewrites: "
                            f"{fix}")
        if src in out.parents:
            raise UserError(f"OUTDIR {args.outdir} lies in {name}: name an OUTDIR "
                            f"outside it")


def build_tree(args) -> Path:
    refuse_overlap(args)
    logs = result_logs(args.logdir)
    division, fixture = tree.check_runs(logs, args.benchmark, args.ruleset)
    desc = system_description(args, logs, division)
    out: Path = args.outdir
    results = out / "results" / args.system / args.benchmark
    if results.exists():
        shutil.rmtree(results)
    results.mkdir(parents=True)
    for i, log in enumerate(logs):
        shutil.copy2(log, results / f"result_{i}.txt")
    if fixture:
        # The checker compares whole lines without their newline: no trailing newline.
        (results / mlperf_tools.RCP_BYPASS_FILE).write_text("rcp-bypass")
    (out / "systems").mkdir(parents=True, exist_ok=True)
    (out / "systems" / f"{args.system}.json").write_text(json.dumps(desc, indent=2) + "\n")
    copy_code(args.benchmark, out / "benchmarks" / args.benchmark / "implementations" /
              IMPLEMENTATION)
    print(f"packaged {len(logs)} run(s) of {args.benchmark} on {args.system} into {out}"
          + (" (on fixture data: not MLPerf results)" if fixture else ""))
    return out


def check_logs(logs: list[Path], ruleset: str) -> mlperf_tools.Verdict:
    """Every log on its own: the package checker lets one bad run pass under olympic scoring."""
    bad = [v for v in (check_log(log, ruleset) for log in logs) if not v.compliant]
    if not bad:
        return mlperf_tools.Verdict("compliance checker", mlperf_tools.PASS,
                                    "every log is compliant")
    first = bad[0].problems[0].splitlines()[0] if bad[0].problems else "not compliant"
    names = ", ".join(v.path.name for v in bad)
    return mlperf_tools.Verdict("compliance checker", mlperf_tools.FAIL,
                                f"{names} not compliant ({first})")


def check_seeds(logs: list[Path]) -> mlperf_tools.Verdict:
    """A seed per run, none repeated, in any division (the package checker checks closed only)."""
    runs: dict[object, list[str]] = {}
    for log in logs:
        runs.setdefault(summarize(log).seed, []).append(log.name)
    unseeded = runs.pop(None, [])
    if unseeded:
        return mlperf_tools.Verdict("seeds", mlperf_tools.FAIL,
                                    f"{', '.join(unseeded)} log no seed: rerun with a seed")
    for seed, names in runs.items():
        if len(names) > 1:
            return mlperf_tools.Verdict(
                "seeds", mlperf_tools.FAIL, f"{' and '.join(names)} share seed {seed}: rerun "
                f"all but one (run_and_time.sh seeds run i with SEED+i, or afresh)")
    return mlperf_tools.Verdict("seeds", mlperf_tools.PASS, f"{len(logs)} distinct seeds")


def check_tree(path: Path, ruleset: str) -> list[mlperf_tools.Verdict]:
    """Every check on a submission tree, one verdict each, once ``tree.validate`` accepts it."""
    fixture = tree.validate(path, ruleset)
    verdicts = [mlperf_tools.check_system_desc(json_file, ruleset)
                for json_file in sorted((path / "systems").glob("*.json"))]
    for bench_dir, on_fixture in fixture.items():
        logs = tree.result_files(bench_dir)
        verdicts += [mlperf_tools.check_run_count(bench_dir, bench_dir.name, ruleset),
                     check_logs(logs, ruleset), check_seeds(logs),
                     mlperf_tools.rcp_verdict(bench_dir, ruleset, on_fixture)]
    verdicts.append(mlperf_tools.check_package(path, ruleset))
    return verdicts


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m compliance.package", description=__doc__.splitlines()[0])
    p.add_argument("--submitter")
    p.add_argument("--system", help="system name: results/<system>, systems/<system>.json")
    p.add_argument("--benchmark")
    p.add_argument("--ruleset", default="1.1.0")
    p.add_argument("--field", action="append", default=[], metavar="KEY=VALUE",
                   help="a system-description field this machine cannot tell (repeatable)")
    p.add_argument("--system-desc", help="JSON with system-description fields")
    p.add_argument("--check", action="store_true", help="only check the tree OUTDIR")
    p.add_argument("paths", nargs="+", type=Path, metavar="LOGDIR OUTDIR")
    args = p.parse_args(argv)
    if args.check:
        if len(args.paths) != 1:
            p.error("--check takes one path: the submission tree")
        path = args.paths[0]
    else:
        if len(args.paths) != 2 or not (args.submitter and args.system and args.benchmark):
            p.error("packaging needs --submitter, --system, --benchmark, LOGDIR and OUTDIR")
        args.logdir, args.outdir = args.paths
        path = build_tree(args)
    verdicts = check_tree(path, args.ruleset)
    for v in verdicts:
        print(v.line())
    rows = score_table(path, args.ruleset)
    verdicts.append(mlperf_tools.Verdict(
        "result summarizer", mlperf_tools.outcome(all(r.score_minutes is not None for r in rows)),
        "; ".join(f"{r.benchmark} on {r.system}: {r.score_text()}" for r in rows)))
    print(verdicts[-1].line())
    print_and_write(rows, path)
    return 1 if any(v.failed for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
