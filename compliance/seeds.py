"""How many seeds of a workload's config reach the target: N runs through its
``run_and_time.sh``, one line per run and the success rate.

    python -m compliance.seeds resnet [-n 10] [--seed 1000] [--config cpu_tiny] [--logdir DIR] \
        [--extra-args "--device cuda --opt channels-last"]

The runs are ``NEXP=N SEED=S`` (seeds S, S+1, ...), as a submission's are; each log is read
back for its status, the epoch of its last evaluation, the time to train and the last
quality. Exit status 0 only when every run reached the target. A tool for people, not CI: a
closed submission needs every one of 5-40 runs to converge, so a fixture config should pass
10 of 10 here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common.cli import OneLineParser
from compliance.logs import read_events, summarize

REPO = Path(__file__).resolve().parents[1]


def last_epoch(log: Path) -> int | None:
    """The ``epoch_num`` of the log's last ``eval_accuracy``."""
    epoch = None
    for ev in read_events(log):
        if ev["key"] == "eval_accuracy":
            epoch = ev.get("metadata", {}).get("epoch_num", epoch)
    return epoch


def run_seeds(workload: str, runs: int, seed: int, config: str, logdir: Path,
              extra_args: str = "") -> list[dict]:
    """Run ``runs`` seeds through the workload's entry point; one dict per log."""
    script = REPO / "benchmarks" / workload / "run_and_time.sh"
    if not script.is_file():
        raise SystemExit(f"{script}: no such entry point; name a workload under benchmarks/")
    env = dict(os.environ, CONFIG=config, NEXP=str(runs), SEED=str(seed), LOGDIR=str(logdir),
               EXTRA_ARGS=extra_args)
    subprocess.run(["bash", str(script)], env=env, cwd=REPO, check=False)
    rows = []
    for i in range(runs):
        log = logdir / f"result_{i}.txt"
        if not log.is_file() or not log.stat().st_size:
            rows.append({"seed": seed + i, "status": "no log", "epoch": None, "seconds": None,
                         "quality": None})
            continue
        s = summarize(log)
        rows.append({"seed": s.seed, "status": s.status, "epoch": last_epoch(log),
                      "seconds": s.seconds, "quality": s.last_quality})
    return rows


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m compliance.seeds", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload")
    p.add_argument("-n", "--runs", type=int, default=10)
    p.add_argument("--seed", type=int, default=1000, help="first seed")
    p.add_argument("--config", default="cpu_tiny")
    p.add_argument("--logdir", type=Path, help="default: a new temporary folder")
    p.add_argument("--extra-args", default="", help="EXTRA_ARGS for run_and_time.sh")
    a = p.parse_args(argv)
    if a.runs < 1:
        p.error("-n must be at least 1")
    logdir = a.logdir or Path(tempfile.mkdtemp(prefix=f"seeds-{a.workload}-"))
    logdir.mkdir(parents=True, exist_ok=True)
    rows = run_seeds(a.workload, a.runs, a.seed, a.config, logdir, a.extra_args)
    print(f"\n{a.workload} CONFIG={a.config} EXTRA_ARGS={a.extra_args!r} (logs: {logdir})")
    for r in rows:
        seconds = f"{r['seconds']:.1f} s" if r["seconds"] is not None else "-"
        print(f"  seed {r['seed']}: {r['status']}, last evaluation at epoch {r['epoch']}, "
              f"{seconds}, quality {r['quality']}")
    ok = sum(r["status"] == "success" for r in rows)
    print(f"{a.workload}: {ok} of {len(rows)} seeds reached the target")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
