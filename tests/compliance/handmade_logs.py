"""Small mllog files written by hand, for checks that need no training run."""

import json
from pathlib import Path

T0 = 1_700_000_000_000   # time_ms of the first event


def event(key: str, value=None, t: int = 0, **metadata) -> dict:
    kind = ("INTERVAL_START" if key.endswith("_start") else
            "INTERVAL_END" if key.endswith("_stop") else "POINT_IN_TIME")
    return {"namespace": "", "time_ms": T0 + t, "event_type": kind, "key": key, "value": value,
            "metadata": {"file": "handmade.py", "lineno": 1, **metadata}}


def write(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(f":::MLLOG {json.dumps(e)}\n" for e in events))
    return path


def open_run(benchmark: str = "resnet", accuracy=0.8, start_ms: int = 100,
             stop_ms: int = 5000, seed: int = 42) -> list[dict]:
    """A whole open-division run that the 1.1.0 checker passes: one epoch, one evaluation."""
    return [
        event("submission_org", "TestOrg"), event("submission_platform", "cpu"),
        event("submission_division", "open"), event("submission_status", "onprem"),
        event("submission_benchmark", benchmark), event("cache_clear", True),
        event("init_start"), event("seed", seed), event("dataset", "fixture: handmade"),
        event("global_batch_size", 16), event("train_samples", 96), event("eval_samples", 100),
        event("init_stop", t=50),
        event("run_start", t=start_ms),
        event("epoch_start", t=start_ms + 1, epoch_num=1),
        event("epoch_stop", t=start_ms + 2, epoch_num=1),
        event("eval_start", t=start_ms + 3, epoch_num=1),
        event("eval_stop", t=start_ms + 4, epoch_num=1),
        event("eval_accuracy", accuracy, t=start_ms + 4, epoch_num=1),
        event("run_stop", t=stop_ms, status="success"),
    ]


def write_logdir(folder: Path, seeds=(1, 2, 3, 4, 5)) -> Path:
    """A LOGDIR of ResNet ``open_run``s, one per seed, as run_and_time.sh names them."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds):
        write(folder / f"result_{i}.txt", open_run(seed=seed, stop_ms=5000 + 1000 * i))
    return folder


def edit(log: Path, change) -> None:
    """Rewrite each mllog event of a log as ``change(event)`` returns it: an event, None (it
    is dropped) or a list of events in its place."""
    events = [json.loads(line[len(":::MLLOG "):]) for line in log.read_text().splitlines()]
    changed = [change(e) for e in events]
    write(log, [e for c in changed for e in (c if isinstance(c, list) else [c]) if e is not None])
