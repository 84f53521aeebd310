"""Running a benchmark's entry points as a user does, for the end-to-end tests."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# For a config whose one compute thread guards a loaded machine (RNN-T's, Mask R-CNN's): the
# suite runs one test at a time, so an end-to-end run has both of CI's cores.
TWO_THREADS = {"OMP_NUM_THREADS": "2"}
# For a config whose loader process (--workers 1) shares CI's 2 cores with the training
# process (SSD's): two compute threads spin-wait against the loader; one thread ran the same
# tiny SSD run in 94 s against 266-326 s with two on a 2-core machine.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# ResNet-50 on 4 classes at 32 px (``benchmarks.resnet.fixture.write_fixture`` arguments, then
# run flags): a run of the real model reaches 0.759 top-1 in a few seconds; the fixture's label
# noise (4 of the 100 validation images) keeps top-1 below 1.0, which the 1.1.0 rules reject.
SMALL_RESNET_FIXTURE = dict(num_classes=4, train_per_class=24, val_per_class=25, image_size=40)
SMALL_RESNET_FLAGS = ("--image-size 32 --batch-size 16 --eval-batch-size 50 --workers 0 "
                      "--epochs 8 --warmup-epochs 0")


def run_script(benchmark: str, env_extra: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    """``benchmarks/<benchmark>/run_and_time.sh`` with this Python first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.update(env_extra)
    # its own process group, so that a timeout stops the training process too, not only bash
    with subprocess.Popen(["bash", str(REPO / f"benchmarks/{benchmark}/run_and_time.sh")],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run_program(benchmark: str, *flags: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m benchmarks.<benchmark>`` on the CPU in fp32 with ``flags``."""
    return subprocess.run([sys.executable, "-m", f"benchmarks.{benchmark}", "--device", "cpu",
                           "--precision", "fp32", *flags], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def ended(alive, seconds: float) -> bool:
    """Whether ``alive()`` turns false within ``seconds``, asked every 0.1 s."""
    deadline = time.monotonic() + seconds
    while alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def group_gone(pgid: int, seconds: float) -> bool:
    """Whether process group ``pgid`` has ended, waiting up to ``seconds`` for it."""
    return ended(lambda: group_alive(pgid), seconds)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """The non-empty stderr lines, Python warnings left out."""
    return [line for line in proc.stderr.splitlines()
            if line.strip() and "Warning" not in line and "warn" not in line]


def assert_needs_cuda(module: str) -> None:
    """``python -m module`` without a visible GPU: exit 2 with one line saying so."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", module], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert len(error_lines(proc)) == 1 and "needs a CUDA device" in proc.stderr
