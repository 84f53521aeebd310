"""torchrun, with its workers' verdict as its exit status.

``python -m common.launch <torchrun arguments>`` is torchrun (``torch.distributed.run``: the
same arguments, rendezvous and workers). torchrun itself exits 1 with a traceback whenever a
worker fails or a signal stops it, so ``run_and_time.sh`` could not tell bad input from a
stop or a crash. Here the first failure decides: a worker's bad input (exit 2, its one-line
message left in the error file torchrun gives each worker, ``common.training``) is printed
once and exits 2; a stop signal, to this launcher or to the workers, exits 128 + its number
quietly (the workers report it, unless a peer's failure caused it: they find the file named
by ``dist.FAILED_MARK_VARIABLE``, which a failing worker leaves); a crash exits with the
worker's status after one line naming the rank (the worker printed its traceback).
torchrun's own log lines (its OMP_NUM_THREADS notice, each signal it sends, each failure)
are left out unless ``LOGLEVEL`` asks for them, as torchrun's ``LOGLEVEL`` does.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from common.dist import FAILED_MARK_VARIABLE
from common.errors import one_line


def _message(failure) -> str:
    """The failure's message as the worker recorded it, '' without one."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    return one_line(RuntimeError(message)) if message else ""


def _quiet_torchrun() -> None:
    if "LOGLEVEL" not in os.environ:
        for name, logger in logging.root.manager.loggerDict.items():
            if name.startswith("torch.distributed") and isinstance(logger, logging.Logger):
                logger.setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    _quiet_torchrun()
    args = torchrun.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="launch-") as folder:
        os.environ[FAILED_MARK_VARIABLE] = os.path.join(folder, "failed")
        return _run(args)


def _run(args) -> int:
    try:
        torchrun.run(args)
    except SignalException as exc:
        return 128 + exc.sigval
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode < 0:   # killed by a signal it did not handle
            name = signal.Signals(-failure.exitcode).name
            print(f"error: rank {rank} was killed by {name}", file=sys.stderr)
            return 128 - failure.exitcode
        if failure.exitcode == 2:
            print(f"error: {_message(failure)}", file=sys.stderr)
        elif failure.exitcode not in (128 + signal.SIGINT, 128 + signal.SIGTERM):
            print(f"error: rank {rank} failed (exit {failure.exitcode})", file=sys.stderr)
        return failure.exitcode
    return 0


if __name__ == "__main__":
    sys.exit(main())
