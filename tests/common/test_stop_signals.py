"""The trainer's SIGINT/SIGTERM handling (``common.training``): a stop that Python drops
(raised inside a garbage-collector callback) is raised again at the next check, without a
traceback on the console, and a loader process forked from the trainer ignores the signal
instead of failing."""

import gc
import os
import signal
import subprocess
import sys

import pytest

from common import training
from tests.entry_points import REPO


def test_a_stop_raised_inside_a_gc_callback_is_raised_again_at_the_next_check():
    def signal_myself(phase, info):
        if phase == "start":
            gc.callbacks.remove(signal_myself)
            os.kill(os.getpid(), signal.SIGTERM)   # the handler runs inside this callback

    with training.handling_signals(training._stop):
        training.raise_if_stopped()                # no signal yet
        gc.callbacks.append(signal_myself)
        gc.collect()                               # Python prints and drops the Stopped
        with pytest.raises(training.Stopped, match="stopped by SIGTERM"):
            training.raise_if_stopped()
    with training.handling_signals(training._stop):
        training.raise_if_stopped()                # a new run starts without the old stop


def test_a_dropped_stop_prints_no_traceback(capsys):
    """Where Python drops the stop (here a collector callback; in a CI run the handlers a
    fork calls in the parent), it is remembered, not printed with a traceback; any other
    exception Python drops still reaches the hook that was there."""
    seen = []

    def signal_myself(phase, info):
        if phase == "start":
            gc.callbacks.remove(signal_myself)
            os.kill(os.getpid(), signal.SIGTERM)

    hook, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        with training.handling_signals(training._stop):
            gc.callbacks.append(signal_myself)
            gc.collect()
            with pytest.raises(training.Stopped):
                training.raise_if_stopped()
            _DropsAnError()
    finally:
        sys.unraisablehook = hook
    assert [type(u.exc_value) for u in seen] == [ValueError]
    assert "Traceback" not in capsys.readouterr().err


class _DropsAnError:
    def __del__(self):
        raise ValueError("dropped by Python")


def test_a_forked_loader_process_ignores_the_stop():
    with training.handling_signals(training._stop):
        pid = os.fork()
        if pid == 0:   # the child: the handler inherited from the trainer must not raise
            code = 0
            try:
                os.kill(os.getpid(), signal.SIGINT)
                training.raise_if_stopped()
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        training.raise_if_stopped()                # the trainer itself was not stopped


# In a fresh interpreter: a signal sent to the process reaches any thread that does not block it,
# and the test process has threads of earlier tests (Inductor's compile workers, ...).
PENDING_CHILD_SIGNAL = """
import os, signal, sys
from common import training
unraisable = []
sys.unraisablehook = unraisable.append
both = {signal.SIGTERM, signal.SIGCHLD}
signal.signal(signal.SIGCHLD, lambda signum, frame: None)   # as torch's loader handler
with training.handling_signals(training._stop):
    signal.pthread_sigmask(signal.SIG_BLOCK, both)
    os.kill(os.getpid(), signal.SIGCHLD)
    os.kill(os.getpid(), signal.SIGTERM)
    try:                                      # SIGTERM's handler runs first (15 < 17)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
        sum(range(1000))
        sys.exit("no Stopped raised")
    except training.Stopped:
        pass
    sum(range(1000))                          # then the pending SIGCHLD's
if unraisable:
    sys.exit("; ".join(str(u.exc_value) for u in unraisable))
"""


def test_a_child_signal_pending_at_the_stop_is_no_error():
    """A scheduler's SIGTERM to the group ends the loader processes as it reaches the trainer:
    their SIGCHLD, caught for torch's loader handler, was still pending when the stop set
    SIGCHLD aside, and Python then printed 'OSError: Signal 17 ignored due to race condition'
    with a traceback (seen under torchrun, SSD)."""
    proc = subprocess.run([sys.executable, "-c", PENDING_CHILD_SIGNAL], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
