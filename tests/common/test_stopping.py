"""A stop signal ends a toy run within seconds whatever is in flight (background scoring, loader
processes, torchrun's workers), with run_stop aborted, exit 128 + the signal and no process
left; bad input under torchrun is one line and exit 2 (``common.training``, ``common.scoring``,
``common.launch``)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.common.test_multinode import wait_gone
from tests.entry_points import group_gone

REPO = Path(__file__).resolve().parents[2]
STOP_S = 15   # the bound on a stopped run's exit: run_stop, the scorer and loaders stopped
START_S = 90  # for a run to reach the state a test signals it in (2 shared cores)
FLAGS = ["--device", "cpu", "--precision", "fp32", "--seed", "3", "--target", "1.01"]


def start(tmp_path: Path, *argv: str) -> subprocess.Popen:
    """``argv`` (a python module and its flags) in a session of its own, output to files."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        return subprocess.Popen([sys.executable, "-m", *argv], cwd=REPO, env=env, stdout=out,
                                stderr=err, start_new_session=True)


def wait_for(proc: subprocess.Popen, tmp_path: Path, ready) -> None:
    deadline = time.monotonic() + START_S
    while not ready():
        assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        assert time.monotonic() < deadline, (tmp_path / "stderr").read_text()[-3000:]
        time.sleep(0.1)


def logged(log: Path, key: str) -> bool:
    return log.is_file() and f'"key": "{key}"' in log.read_text()


def assert_stopped(proc: subprocess.Popen, tmp_path: Path, log: Path, signum: int) -> str:
    """The run ended within STOP_S with run_stop aborted and 128 + signum, quietly, and
    nothing of it is left; its stderr."""
    try:
        rc = proc.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {STOP_S} s after the signal")
    finally:
        # torchrun's workers run in sessions of their own: found by their command line
        left = not group_gone(proc.pid, 5) or not wait_gone(str(log), 5)
        if left:
            os.killpg(proc.pid, signal.SIGKILL)
    err = (tmp_path / "stderr").read_text()
    assert rc == 128 + signum, err[-3000:]
    assert not left, "processes of the run outlived it"
    assert "Traceback" not in err and "run failed" not in err, err[-3000:]
    assert f"stopped by {signal.Signals(signum).name}" in err
    lines = [x for x in log.read_text().splitlines() if x.startswith(":::MLLOG ")]
    last = json.loads(lines[-1][len(":::MLLOG "):])
    assert last["key"] == "run_stop" and last["metadata"]["status"] == "aborted", last
    return err


@pytest.mark.parametrize("score_seconds", ["0.01", "60"], ids=["scorer-idle", "scorer-busy"])
def test_sigterm_to_the_group_during_background_scoring(tmp_path, score_seconds):
    """A scheduler's SIGTERM reaches the scorer process too; killed while idle, a Pool worker
    held the lock its pool's terminate() waits for: the trainer hung for good."""
    log = tmp_path / "log.txt"
    proc = start(tmp_path, "tests.common.toy_program", "BackgroundToy", *FLAGS,
                 "--log-file", str(log), "--epochs", "1000", "--step-sleep", "0.1",
                 "--background-scoring", "--score-seconds", score_seconds)
    idle = score_seconds == "0.01"
    wait_for(proc, tmp_path, lambda: logged(log, "eval_accuracy" if idle else "eval_stop"))
    if idle:   # a result came back: the scorer waits for the next evaluation, 0.8 s apart
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGTERM)
    assert_stopped(proc, tmp_path, log, signal.SIGTERM)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_to_the_group_with_loader_processes_wins(tmp_path, sig):
    """The loader processes get the signal too: they end quietly, and the trainer reports
    its stop, not a loader process that died (a RuntimeError traceback, exit 1)."""
    log = tmp_path / "log.txt"
    proc = start(tmp_path, "tests.common.toy_program", "LoaderToy", *FLAGS,
                 "--log-file", str(log), "--epochs", "1000")
    wait_for(proc, tmp_path, lambda: logged(log, "epoch_stop"))
    os.killpg(proc.pid, sig)
    assert_stopped(proc, tmp_path, log, sig)



def test_a_run_ends_without_waiting_for_its_helpers(tmp_path):
    """An exit handler that waits for a helper process (Inductor's waits up to 300 s for its
    compile workers) neither holds the finished run nor leaves the helper behind."""
    log = tmp_path / "log.txt"
    proc = start(tmp_path, "tests.common.toy_program", "HelperToy", *FLAGS,
                 "--log-file", str(log), "--epochs", "1")
    try:
        rc = proc.wait(timeout=START_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"still running {START_S} s after it began")
    alive = not group_gone(proc.pid, 5)   # a killed helper is reaped by init meanwhile
    if alive:
        os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 1, (tmp_path / "stderr").read_text()[-3000:]   # the toy's target: unreached
    assert logged(log, "run_stop") and not alive


def test_a_stop_ends_the_run_without_waiting_for_its_helpers(tmp_path):
    """SIGTERM to the trainer alone (as run_and_time.sh forwards one): its helpers, which the
    signal did not reach, end with it."""
    log = tmp_path / "log.txt"
    proc = start(tmp_path, "tests.common.toy_program", "HelperToy", *FLAGS,
                 "--log-file", str(log), "--epochs", "1000")
    wait_for(proc, tmp_path, lambda: logged(log, "epoch_stop"))
    os.kill(proc.pid, signal.SIGTERM)
    assert_stopped(proc, tmp_path, log, signal.SIGTERM)

def test_sigterm_to_torchrun_and_its_workers(tmp_path):
    log = tmp_path / "log.txt"
    proc = start(tmp_path, "common.launch", "--standalone", "--nproc_per_node", "2",
                 "-m", "tests.common.toy_program", "LoaderToy", *FLAGS, "--log-file", str(log),
                 "--epochs", "1000")
    wait_for(proc, tmp_path, lambda: logged(log, "epoch_stop"))
    os.killpg(proc.pid, signal.SIGTERM)
    err = assert_stopped(proc, tmp_path, log, signal.SIGTERM)
    assert err.count("stopped by SIGTERM") == 1, err   # rank 0's line only


def test_a_stop_signal_during_the_bad_input_report_is_ignored(monkeypatch, capsys):
    """The report is the way out: torchrun's SIGTERM, once a peer has reported the same input,
    cut a rank's report off inside its import of torch's error handler, with a traceback."""
    from common import training

    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setattr(training.dist, "mark_failed", lambda: None)
    previous = {s: signal.getsignal(s) for s in training.STOP_SIGNALS}
    try:
        assert training._report_user_error("bad input", 0) == 2
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in training.STOP_SIGNALS)
        os.kill(os.getpid(), signal.SIGTERM)   # would end pytest if it were not ignored
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert capsys.readouterr().err == "error: bad input\n"


@pytest.mark.parametrize("workload, flags, message", [
    ("ToyWorkload", ["--log-every", "0"], "--log-every: must be more than 0, not 0"),
    ("ToyWorkload", ["--background-scoring"], "has no scorer"),
    ("RankOneBadInputToy", ["--epochs", "1000"], "planted bad input on rank 1"),
], ids=["bad-flag", "bad-input-after-the-log-began", "bad-input-on-one-rank"])
def test_bad_input_under_torchrun_is_one_line_and_exit_2(tmp_path, workload, flags, message):
    """On one rank only, the others are stopped by torchrun (or see a collective cut short):
    they said so too, a second line ("run stopped by SIGTERM" or a traceback)."""
    proc = subprocess.run(
        [sys.executable, "-m", "common.launch", "--standalone", "--nproc_per_node", "2", "-m",
         "tests.common.toy_program", workload, *FLAGS, "--log-file",
         str(tmp_path / "log.txt"), *flags], cwd=REPO, capture_output=True, text=True,
        timeout=START_S, env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and message in lines[0], proc.stderr[-3000:]


def _coco_loader(dataset):
    import torch

    from common.coco.data import batch_loader
    return batch_loader(dataset, [[0, 1], [2, 3]] * 50, lambda items: items, 1,
                        torch.device("cpu"))


def _persistent_loader(dataset):
    from common import loaders
    return loaders.persistent(dataset, loaders.Keys(list(range(100))), 1, pin=False)


@pytest.mark.parametrize("make", [_coco_loader, _persistent_loader], ids=["coco", "persistent"])
def test_a_loader_process_ends_quietly_on_sigterm(make):
    """Sent by another process than the trainer (a scheduler's, to the whole group), torch's
    handler ended it killed by the signal: the trainer then raised 'DataLoader worker is killed
    by signal: Terminated' over its own stop."""
    loader = make(list(range(4)))
    it = iter(loader)
    next(it)
    (worker,) = it._workers
    subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)
    worker.join(10)
    assert worker.exitcode == 0
    del it


def test_a_loader_process_says_nothing_of_a_dropped_connection():
    """multiprocessing's fd server, in a loader process, printed a ConnectionResetError
    traceback when a stop cut short the trainer's side of a handshake; other errors still
    show."""
    code = ("import sys\nfrom common.loaders import quiet_on_stop\nquiet_on_stop()\n"
            "for e in (ConnectionResetError('reset'), BrokenPipeError('pipe'), "
            "ValueError('shown')):\n    sys.excepthook(type(e), e, None)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ValueError: shown" in proc.stderr
    assert "reset" not in proc.stderr and "pipe" not in proc.stderr
