"""common/run_and_time.sh: stopping runs with SIGTERM/SIGINT, bad NEXP, GPUS and LOGDIR, old logs.

The signal tests run the real ResNet-50 ``cpu_tiny`` config (the cheapest to reach
``run_start``: about 5 s on 2 CPU cores, the fixture cached under ``.fixtures/resnet``)
and stop it mid-training.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.errors import UserError
from compliance.package import result_logs
from tests.entry_points import REPO, error_lines, group_alive, group_gone, run_script

SCRIPT = REPO / "benchmarks/resnet/run_and_time.sh"
WAIT_S = 45   # for run_start, and again for the script's exit after the signal


def start(tmp_path: Path, env_extra: dict, sigint=signal.SIG_DFL) -> subprocess.Popen:
    """run_and_time.sh in a session of its own (as a terminal's job), output to files, with
    SIGINT's disposition ``sigint`` at its start (a terminal's job: the default; whatever
    started this test may have left it ignored)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.update(env_extra)
    env.pop("DATADIR", None)
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        return subprocess.Popen(["bash", str(SCRIPT)], cwd=REPO, env=env, stdout=out,
                                stderr=err, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


@pytest.fixture(params=[signal.SIG_DFL], ids=["sigint-default"])
def training(tmp_path, request):
    """run_and_time.sh with NEXP=3, once its first run has logged run_start (SIGINT's
    disposition at its start: ``request.param``)."""
    # no evaluation before epoch 40: the run cannot reach its target before the signal (it
    # did once, when the test was slow to send it); an offset must stay below the period, or
    # the run fails at once instead of training
    proc = start(tmp_path, {"CONFIG": "cpu_tiny", "NEXP": "3", "SEED": "7",
                            "LOGDIR": str(tmp_path / "logs"),
                            "EXTRA_ARGS": "--epochs 40 --eval-period 40 --eval-offset 39"},
                 request.param)
    try:
        wait_for_run_start(proc, tmp_path)
        yield proc
    finally:   # whatever the test left running
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for_run_start(proc: subprocess.Popen, tmp_path: Path) -> None:
    log = tmp_path / "logs/result_0.txt"
    deadline = time.monotonic() + WAIT_S
    while not (log.is_file() and '"key": "run_start"' in log.read_text()):
        assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        assert time.monotonic() < deadline, f"no run_start in {log} after {WAIT_S} s"
        time.sleep(0.2)


def finished(proc: subprocess.Popen, tmp_path: Path) -> tuple[int, str, str]:
    """The script's exit status, stdout and stderr, once it has exited."""
    try:
        rc = proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"run_and_time.sh still running {WAIT_S} s after the signal")
    return rc, (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()


def last_event(log: Path) -> dict:
    lines = [x for x in log.read_text().splitlines() if x.startswith(":::MLLOG ")]
    return json.loads(lines[-1][len(":::MLLOG "):])


def assert_stopped_after_first_run(proc: subprocess.Popen, tmp_path: Path, signum: int):
    rc, out, err = finished(proc, tmp_path)
    assert "run failed" not in err, err[-3000:]   # the signal, not an error, ended the run
    assert rc == 128 + signum, out[-2000:] + err[-3000:]
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.glob("result_*.txt")) == ["result_0.txt"]
    assert "run 1/3" in out and "run 2/3" not in out
    assert "compliance " in out   # the checker's verdict on the stopped run's log
    # The script waited for the program, which closed its log before the check read it.
    stop = last_event(logs / "result_0.txt")
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "aborted", stop
    result = [x for x in out.splitlines() if x.startswith("RESULT,")]
    assert len(result) == 1 and result[0].split(",")[4] == "aborted", out[-2000:]
    assert group_gone(proc.pid, 10), "processes of the run outlived run_and_time.sh"


def test_sigterm_to_the_script_ends_the_run_and_starts_no_other(training, tmp_path):
    os.kill(training.pid, signal.SIGTERM)   # the script alone, as a batch system's stop does
    assert_stopped_after_first_run(training, tmp_path, signal.SIGTERM)


def test_ctrl_c_to_the_process_group_ends_the_run_and_starts_no_other(training, tmp_path):
    os.killpg(training.pid, signal.SIGINT)   # what a terminal's Ctrl-C sends
    assert_stopped_after_first_run(training, tmp_path, signal.SIGINT)


@pytest.mark.parametrize("training", [signal.SIG_IGN], ids=["sigint-ignored"], indirect=True)
def test_a_script_that_cannot_trap_sigint_still_stops_when_the_program_was_stopped(
        training, tmp_path):
    """Started with SIGINT ignored (a background job of a non-interactive shell), bash cannot
    trap it; the program still can, and its exit status 130 stops the script."""
    os.killpg(training.pid, signal.SIGINT)
    assert_stopped_after_first_run(training, tmp_path, signal.SIGINT)
    assert "the run was stopped by SIGINT: no further runs" in (tmp_path / "stderr").read_text()


# Loaded by every Python process of the script (sitecustomize): the program never ends on
# SIGTERM, as one stuck in native code (a compiler, a device call) cannot run its handler.
DEAF_TO_SIGTERM = """import signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
_install = signal.signal
signal.signal = lambda s, h: signal.SIG_IGN if s == signal.SIGTERM else _install(s, h)
"""


def test_a_stopped_run_that_does_not_end_is_killed_after_the_grace(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(DEAF_TO_SIGTERM)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    proc = start(tmp_path, {"CONFIG": "cpu_tiny", "SEED": "7", "LOGDIR": str(tmp_path / "logs"),
                            "STOP_GRACE_S": "2", "PYTHONPATH": path,
                            "EXTRA_ARGS": "--epochs 40 --eval-period 40 --eval-offset 39"})
    try:
        wait_for_run_start(proc, tmp_path)
        os.kill(proc.pid, signal.SIGTERM)
        rc, out, err = finished(proc, tmp_path)
        assert rc == 143, err[-3000:]
        assert "did not end within STOP_GRACE_S=2 s of SIGTERM: killed" in err, err[-3000:]
        assert "Killed" not in err.replace("killed", ""), err[-3000:]   # no bash job notice
        result = [x for x in out.splitlines() if x.startswith("RESULT,")]
        assert len(result) == 1 and result[0].split(",")[3] == "nan", out[-2000:]
        assert group_gone(proc.pid, 10), "processes of the run outlived run_and_time.sh"
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


# Loaded by every Python process of the script: the training program crashes in native code
# once it has run a few seconds.
CRASHES = """import os, signal, sys, threading
if "common.entry" in sys.orig_argv:
    threading.Timer(4, os.kill, (os.getpid(), signal.SIGSEGV)).start()
"""


def test_a_run_that_crashes_says_where_and_by_which_signal(tmp_path):
    """A run killed by a signal this script did not send (a crash; the out-of-memory killer's
    KILL) ends without run_stop: its Python stack is printed and the script names the
    signal, instead of ending with status 1 and no word."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CRASHES)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    proc = start(tmp_path, {"CONFIG": "cpu_tiny", "SEED": "7", "LOGDIR": str(tmp_path / "logs"),
                            "PYTHONPATH": path,
                            "EXTRA_ARGS": "--epochs 40 --eval-period 40 --eval-offset 39"})
    try:
        rc, out, err = finished(proc, tmp_path)
        assert rc == 1, err[-3000:]
        assert "Fatal Python error: Segmentation fault" in err, err[-3000:]
        assert "run 1 ended by SIGSEGV (exit 139) before it could log run_stop" in err, \
            err[-3000:]
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("name, value", [("NEXP", "0"), ("NEXP", "abc"), ("NEXP", "-1"),
                                         ("NEXP", "2x"), ("GPUS", "0"), ("GPUS", "two"),
                                         ("GPUS", "-2")])
def test_run_and_process_counts_must_be_positive_integers(tmp_path, name, value):
    proc = run_script("resnet", {name: value, "LOGDIR": str(tmp_path)}, timeout=60)
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and f"{name}={value}" in lines[0] and "positive integer" in lines[0]
    assert "== resnet run" not in proc.stdout


def unwritable_logdir(kind: str, tmp_path: Path) -> Path:
    if kind == "file":
        (tmp_path / "logs").write_text("")
        return tmp_path / "logs"
    if kind == "under a file":
        (tmp_path / "file").write_text("")
        return tmp_path / "file/logs"
    if os.geteuid() != 0:
        (tmp_path / "logs").mkdir(mode=0o555)
        return tmp_path / "logs"
    # root writes through any mode bits; sysfs passes root's -w test yet refuses new files
    if not Path("/sys").is_dir():
        pytest.skip("running as root without /sys: no directory that refuses root's writes")
    return Path("/sys")


@pytest.mark.parametrize("kind", ["file", "under a file", "read-only directory"])
def test_unwritable_logdir_is_one_line(tmp_path, kind):
    logdir = unwritable_logdir(kind, tmp_path)
    proc = run_script("resnet", {"LOGDIR": str(logdir)}, timeout=120)
    try:
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        lines = error_lines(proc)
        assert len(lines) == 1 and f"LOGDIR={logdir}" in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr and "== resnet run" not in proc.stdout
    finally:
        if kind == "read-only directory" and logdir.is_relative_to(tmp_path):
            logdir.chmod(0o755)   # so that pytest can remove tmp_path


def test_earlier_logs_are_moved_aside_before_the_first_run(tmp_path):
    logdir = tmp_path / "logs"
    logdir.mkdir()
    for i in range(5):   # an earlier NEXP=5
        (logdir / f"result_{i}.txt").write_text(f"earlier run {i}\n")
    data = tmp_path / "data"   # not a dataset: the run stops at once with exit 2
    data.mkdir()
    (data / "README").write_text("")
    env = {"LOGDIR": str(logdir), "DATADIR": str(data), "NEXP": "2"}

    proc = run_script("resnet", env, timeout=120)
    assert proc.returncode == 2 and "== resnet run 1/2" in proc.stdout
    moved = [x for x in proc.stdout.splitlines() if "earlier result_*.txt" in x]
    assert len(moved) == 1 and "moved 5" in moved[0]
    (aside,) = logdir.glob("previous-*")
    assert str(aside) in moved[0]
    assert [(aside / f"result_{i}.txt").read_text() for i in range(5)] == [
        f"earlier run {i}\n" for i in range(5)]
    run_log = logdir / "result_0.txt"
    run_log.write_text("this invocation's log\n")
    proc = run_script("resnet", env, timeout=120)   # within the same second, often
    assert proc.returncode == 2
    asides = sorted(logdir.glob("previous-*"))
    assert len(asides) == 2 and aside in asides
    (second,) = set(asides) - {aside}
    assert (second / "result_0.txt").read_text() == "this invocation's log\n"
    assert len(list(aside.iterdir())) == 5


def test_package_reads_no_log_in_the_folders_aside(tmp_path):
    aside = tmp_path / "previous-20250101T000000Z"
    aside.mkdir()
    for i in range(3):
        (aside / f"result_{i}.txt").write_text("")
    with pytest.raises(UserError, match="no result_<i>.txt logs"):
        result_logs(tmp_path)
    (tmp_path / "result_0.txt").write_text("")
    assert result_logs(tmp_path) == [tmp_path / "result_0.txt"]


@pytest.mark.parametrize("env_extra, name", [
    ({"SEED": "1.5"}, "SEED=1.5"), ({"SEED": "abc"}, "SEED=abc"), ({"SEED": "-3"}, "SEED=-3"),
    ({"SEED": "2147483647", "NEXP": "2"}, "SEED=2147483647"),
    ({"NNODES": "abc"}, "NNODES=abc"), ({"NNODES": "0"}, "NNODES=0"),
    ({"NNODES": "2", "MASTER_ADDR": "127.0.0.1"}, "NODE_RANK"),
    ({"NNODES": "2", "NODE_RANK": "0"}, "MASTER_ADDR"),
    ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "127.0.0.1"}, "NODE_RANK=2"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
    ({"NEXP": "12345678901234567890123"}, "NEXP=12345678901234567890123"),
    ({"RULESET": "9.9.9"}, "RULESET=9.9.9"), ({"DATADIR": ""}, "DATADIR"),
    ({"FIXTURE_DIR": ""}, "FIXTURE_DIR"), ({"COLLECTIVE_TIMEOUT_S": "0"}, "COLLECTIVE_TIMEOUT_S"),
    ({"DRY_RUN": "0"}, "DRY_RUN=0"), ({"DRY_RUN": "all"}, "DRY_RUN=all"),
    ({"STOP_GRACE_S": "0"}, "STOP_GRACE_S=0"), ({"STOP_GRACE_S": "1m"}, "STOP_GRACE_S=1m"),
    ({"SLURM_NNODES": "2", "SLURM_NTASKS": "4"}, "SLURM_NTASKS=4"),
    ({"SLURM_NNODES": "two", "SLURM_NODEID": "0"}, "SLURM_NNODES=two"),
    ({"SLURM_NNODES": "08", "SLURM_NODEID": "0"}, "needs MASTER_ADDR"),   # 8 nodes
    ({"SLURM_NNODES": "2", "SLURM_NODEID": "x", "MASTER_ADDR": "127.0.0.1"}, "SLURM_NODEID=x"),
    ({"SLURM_NNODES": "2", "MASTER_ADDR": "127.0.0.1"}, "SLURM_NODEID"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_every_variable_is_checked_before_anything_runs(tmp_path, env_extra, name):
    """One line and exit 2 at once: no fixture written, no run, no compliance check (SEED=1.5
    exited 0 having run nothing; RULESET=9.9.9 was refused only after the run)."""
    env = {"LOGDIR": str(tmp_path / "logs"), "FIXTURE_DIR": str(tmp_path / "fixture")}
    env.update(env_extra)
    proc = run_script("resnet", env, timeout=30)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = error_lines(proc)
    assert len(lines) == 1 and name in lines[0], proc.stderr
    assert proc.stdout == "" and not (tmp_path / "fixture").exists()


@pytest.mark.parametrize("sig, delay, sigint", [
    (signal.SIGINT, 0.3, signal.SIG_DFL), (signal.SIGINT, 1.5, signal.SIG_DFL),
    (signal.SIGINT, 3.0, signal.SIG_DFL), (signal.SIGINT, 0.5, signal.SIG_IGN),
    (signal.SIGTERM, 0.3, signal.SIG_DFL), (signal.SIGTERM, 3.0, signal.SIG_DFL)],
    ids=["int-0.3", "int-1.5", "int-3", "int-0.5-script-ignoring-it", "term-0.3", "term-3"])
def test_a_signal_in_the_first_seconds_of_a_run_ends_it(tmp_path, sig, delay, sigint):
    """``delay`` s after the run's launch (importing, parsing, building): Ctrl-C to the group
    (bash had started the program with SIGINT ignored: lost; Python's KeyboardInterrupt inside
    an import was swallowed) or SIGTERM to the script (no log and no RESULT line). The run ends
    with a RESULT line, run_stop aborted where a log began, and nothing left; also where the
    script itself started with SIGINT ignored (``sigint``)."""
    proc = start(tmp_path, {"CONFIG": "cpu_tiny", "SEED": "7", "LOGDIR": str(tmp_path / "logs")},
                 sigint)
    try:
        deadline = time.monotonic() + WAIT_S
        while "== resnet run 1/1" not in (tmp_path / "stdout").read_text():
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.05)
        time.sleep(delay)
        stop_early(proc, tmp_path, sig)
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def stop_early(proc: subprocess.Popen, tmp_path: Path, sig: int, status: str = "aborted") -> str:
    """Send ``sig`` (SIGINT to the group, as a Ctrl-C; SIGTERM to the script alone, as a batch
    system's stop) to a script started with SEED=7; it ends with 128 + sig, one RESULT line
    and run_stop (where a log began) saying ``status``, no traceback and nothing left. Its
    stderr."""
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    rc, out, err = finished(proc, tmp_path)
    assert rc == 128 + sig, out[-2000:] + err[-3000:]
    result = [x for x in out.splitlines() if x.startswith("RESULT,")]
    assert len(result) == 1 and result[0].split(",")[1:3] == ["resnet", "7"], out + err
    assert result[0].split(",")[4] == status
    log = tmp_path / "logs/result_0.txt"
    if log.is_file() and log.stat().st_size:
        stop = last_event(log)
        assert stop["key"] == "run_stop" and stop["metadata"]["status"] == status
    assert group_gone(proc.pid, 10), "processes of the run outlived run_and_time.sh"
    assert "Traceback" not in err, err[-3000:]
    return err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
@pytest.mark.parametrize("phase", ["checking variables", "writing the fixture"])
def test_a_signal_before_the_run_starts_ends_the_script(tmp_path, sig, phase):
    """While the script checks its variables (its trap was not yet installed: a SIGTERM ended
    it silently, the ruleset lister left with a BrokenPipeError traceback) or writes the
    fixture (no RESULT line): no run starts, the RESULT line says aborted, nothing is left."""
    env = {"CONFIG": "cpu_tiny", "SEED": "7", "LOGDIR": str(tmp_path / "logs"),
           "FIXTURE_DIR": str(tmp_path / "fixture")}
    if phase == "checking variables":   # a python that lingers over the ruleset list
        stub = tmp_path / "bin"
        stub.mkdir()
        (stub / "python").write_text(
            f'#!/bin/sh\ncase "$*" in *rule_choices*) touch "{tmp_path}/listing"; sleep 3;; '
            f'esac\nexec "{sys.executable}" "$@"\n')
        (stub / "python").chmod(0o755)
        env["PATH"] = f"{stub}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}" \
                      f"{os.environ['PATH']}"
        ready = lambda: (tmp_path / "listing").exists()  # noqa: E731
    else:   # the writer has begun its partial copy beside FIXTURE_DIR
        ready = lambda: any(tmp_path.glob(".fixture.partial-*/*"))  # noqa: E731
    proc = start(tmp_path, env)
    try:
        deadline = time.monotonic() + WAIT_S
        while not ready():
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, f"the script never reached {phase}"
            time.sleep(0.02)
        err = stop_early(proc, tmp_path, sig)
        assert signal.Signals(sig).name in err   # the script said why it stopped
        assert "== resnet run" not in (tmp_path / "stdout").read_text()
        assert not (tmp_path / "logs/result_0.txt").exists()
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_bad_input_under_torchrun_is_one_line_and_exit_2(tmp_path):
    """GPUS=2: each rank printed the error, torchrun its traceback, then a compliance check of
    a log that never started and RESULT,...,aborted, exit 1."""
    data = tmp_path / "data"   # not a dataset: every rank stops with a UserError
    data.mkdir()
    (data / "README").write_text("")
    proc = run_script("resnet", {"GPUS": "2", "DATADIR": str(data), "OMP_NUM_THREADS": "1",
                                 "LOGDIR": str(tmp_path / "logs")}, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = error_lines(proc)
    assert len(lines) == 1 and str(data) in lines[0], proc.stderr[-3000:]
    assert "compliance" not in proc.stdout and "RESULT," not in proc.stdout


def test_an_unreadable_datadir_is_one_line_naming_the_fix(tmp_path):
    """Not called empty. Root reads through any mode bits: there an ``ls`` that is refused
    that folder stands in for the kernel's refusal."""
    data = tmp_path / "data"
    data.mkdir(mode=0o000)
    env = {"DATADIR": str(data), "LOGDIR": str(tmp_path / "logs")}
    if os.geteuid() == 0:
        stub = tmp_path / "bin"
        stub.mkdir()
        (stub / "ls").write_text(
            '#!/bin/sh\nfor a; do [ "$a" = "$UNREADABLE" ] && { echo "ls: cannot open '
            'directory $a: Permission denied" >&2; exit 2; }; done\nexec /bin/ls "$@"\n')
        (stub / "ls").chmod(0o755)
        env.update(UNREADABLE=str(data), PATH=f"{stub}{os.pathsep}{Path(sys.executable).parent}"
                   f"{os.pathsep}{os.environ['PATH']}")
    try:
        proc = run_script("resnet", env, timeout=60)
    finally:
        data.chmod(0o755)
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "cannot be read" in lines[0] and "chmod u+rx" in lines[0] and "empty" not in lines[0]


def test_ctrl_c_while_a_finished_run_is_checked_lets_the_check_finish(tmp_path):
    """NEXP=2: a Ctrl-C while run 1's log is checked (seconds after each run) ended the checker
    with a KeyboardInterrupt traceback and no verdict. The check finishes, RESULT is printed,
    run 2 never starts. A stub python stands for the run (it writes a whole handmade log) and
    lingers in Python before the checker, so that the signal lands there."""
    from tests.compliance.handmade_logs import open_run, write
    made = write(tmp_path / "made.txt", open_run(seed=7))
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python").write_text(f"""#!{sys.executable}
import os, pathlib, shutil, sys, time
args = sys.argv[1:]
if args[:3] == ["-m", "common.entry", "benchmarks.resnet"]:
    shutil.copy("{made}", args[args.index("--log-file") + 1])
    sys.exit(0)
if args[:2] == ["-m", "compliance.check"]:
    pathlib.Path("{tmp_path}/checking").touch()
    time.sleep(3)
os.execv("{sys.executable}", ["{sys.executable}", *args])
""")
    (stub / "python").chmod(0o755)
    proc = start(tmp_path, {"SEED": "7", "NEXP": "2", "LOGDIR": str(tmp_path / "logs"),
                            "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"})
    try:
        deadline = time.monotonic() + WAIT_S
        while not (tmp_path / "checking").exists():
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "run 1's log was never checked"
            time.sleep(0.02)
        err = stop_early(proc, tmp_path, signal.SIGINT, status="success")
        out = (tmp_path / "stdout").read_text()
        assert "compliance PASS" in out and "run 2/2" not in out, out + err
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
