"""The trainer's SIGINT/SIGTERM handling (``common.training``): a stop that Python drops
(raised inside a garbage-collector callback) is raised again at the next check, and a loader
process forked from the trainer ignores the signal instead of failing."""

import gc
import os
import signal

import pytest

from common import training


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
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
