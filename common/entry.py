"""``python -m common.entry MODULE [ARGS]``: ``python -m MODULE ARGS`` with SIGINT's default
action (the process ends) until the program installs its own handlers.

Python's own SIGINT handler raises ``KeyboardInterrupt`` wherever the program is; while it
imports torch and numpy (a run's first seconds), a library can swallow that exception or turn
it into another error (a half-imported numpy then failed with a RecursionError), so a Ctrl-C
there was lost or misreported. ``run_and_time.sh`` starts the training program through this.
A crash in native code (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL) prints every thread's Python
stack first (``faulthandler``), so that the run's output says where it was.
"""

import faulthandler
import runpy
import signal
import sys

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    faulthandler.enable()
    module = sys.argv.pop(1)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
