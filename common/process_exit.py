"""The training program's last act: end the process now, its helper processes with it.

Python's exit handlers can wait minutes on helpers a finished run no longer needs: Inductor
registers one that waits up to 300 s for its compile-worker process (and that process for the
compilations still queued). The run's log, its closing lines and its process group are closed
before this runs (``common.training.main``), so nothing is lost by skipping those handlers.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children, ...), read from ``/proc``;
    none where there is no ``/proc``."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:   # ended meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def end(code: int | None) -> NoReturn:
    """Exit with ``code`` (``sys.exit``'s meaning of None and of an int) at once: output
    flushed, every descendant process killed, Python's exit handlers skipped."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe or stream: nothing more to say
            pass
    # the helper threads' errors about the processes killed now are no news (multiprocessing's
    # fd server, serving a loader process, reports a broken pipe through sys.excepthook)
    sys.excepthook = threading.excepthook = _quiet
    for child in descendants(os.getpid()):
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:   # ended meanwhile
            pass
    os._exit(code or 0)


def _quiet(*args) -> None:
    """An exception hook that prints nothing."""
