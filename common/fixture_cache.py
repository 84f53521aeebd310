"""Fixture folders written whole or not at all, and never over files the suite did not write.

``cached_fixture`` writes a fixture into a hidden folder beside its destination and renames it
into place with a ``FIXTURE_COMPLETE`` marker recording the parameters (and what the writer
reports, e.g. DLRM's planted AUC). A folder whose marker records the same parameters is
reused; one with another marker (a fixture of this suite) is replaced; any other folder that
holds files is refused in one line. ``fixture_command`` wraps a writer's ``main``: refusals
are one line with exit status 2, and Ctrl-C or SIGTERM while writing removes the partial copy
and says so in one line, with exit status 128 + the signal's number. ``stop_signals_held``
keeps such a stop from being lost in a C call that calls back into Python.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from common import hparams
from common.cli import one_line_errors
from common.errors import UserError

MARKER = "FIXTURE_COMPLETE"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A stop signal while writing: a ``BaseException``, so that no writer's
    ``except Exception`` takes it for a failure of its own."""

    def __init__(self, signum: int, what: str = "no fixture was written"):
        super().__init__(signum, what)
        self.signum, self.what = signum, what

    def __str__(self) -> str:
        return f"{signal.Signals(self.signum).name} {self.what}"


def recorded(root: Path) -> dict | None:
    """What the marker of ``root`` records; None when ``root`` has no marker (not a fixture
    this suite wrote), ``{}`` when the marker is unreadable."""
    marker = root / MARKER
    if not marker.is_file():
        return None
    try:
        record = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def kind(root: Path) -> str | None:
    """The kind of stand-in the marker of ``root`` records (``"coco-standin"``, ...); None for a
    fixture, which records none, and for a folder this suite did not write."""
    params = (recorded(Path(root)) or {}).get("params")
    return params.get("kind") if isinstance(params, dict) else None


def _refuse_foreign(root: Path) -> None:
    """Refuse a destination that is not a folder, or holds files without a marker."""
    if root.exists() and not root.is_dir():
        raise UserError(f"{root} is not a folder: name a new or empty folder for the fixture")
    try:
        foreign = recorded(root) is None and root.is_dir() and any(root.iterdir())
    except OSError as exc:
        raise UserError(f"{root}: cannot read it ({exc.strerror}): name a new or empty folder "
                        f"for the fixture") from exc
    if foreign:
        raise UserError(f"{root} holds files and is no fixture of this suite (no {MARKER}): "
                        f"the fixture writer replaces only its own fixtures; name a new or "
                        f"empty folder (FIXTURE_DIR, or the writer's OUTDIR)")


def cached_fixture(root, params: dict, write: Callable[[Path], dict | None]) -> Path:
    """``root`` as it is when its marker records ``params``; otherwise ``write(folder)`` fills a
    fresh folder (and may return facts for the marker) that then takes ``root``'s place."""
    root = Path(root)
    if (recorded(root) or {}).get("params") == params:
        return root
    _refuse_foreign(root)
    # A link (a FIXTURE_DIR on scratch space) stays: the fixture takes the place it points to.
    place = root.resolve()
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{place.name}.partial-", dir=place.parent))
    except OSError as exc:
        raise UserError(f"cannot write the fixture {root} ({exc.strerror}): name a folder in "
                        f"a writable place") from exc
    try:
        facts = write(tmp) or {}
        (tmp / MARKER).write_text(json.dumps({"params": params, **facts}) + "\n")
        if (recorded(root) or {}).get("params") == params:
            return root   # another process wrote the same fixture meanwhile
        _refuse_foreign(root)
        if place.exists():
            shutil.rmtree(place)
        tmp.rename(place)
    except Interrupted as exc:
        raise Interrupted(exc.signum, f"while writing the fixture {root}: stopped and the "
                          f"partial copy removed; run the writer again") from None
    except OSError as exc:
        raise UserError(f"writing the fixture {root} failed ({exc}): the partial copy is "
                        f"removed") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _stop(signum, frame):
    # The first signal starts the clean-up; later ones would interrupt it.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def ignore_stop_signals() -> None:
    """For a writer's worker processes (an ``initializer``): the writer stops them."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


FRACTION = hparams.checked(float, hparams.positive_fraction)   # a stand-in's --fraction


def standin_parser(prog: str, description: str, fraction: float, of: str,
                   workers: bool = True) -> argparse.ArgumentParser:
    """The arguments of every stand-in writer (a dataset's scale and shapes for dry runs), named
    as its ``write_standin``'s: OUTDIR, ``--fraction`` (of ``of``), ``--workers``, ``--seed``."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("root", type=Path, metavar="OUTDIR")
    p.add_argument("--fraction", type=FRACTION, default=fraction, help=f"of {of}")
    if workers:
        p.add_argument("--workers", type=int, default=os.cpu_count(), help="writer processes")
    p.add_argument("--seed", type=int, default=0)
    return p


def in_processes(fn: Callable, jobs: list, workers: int, chunksize: int = 16) -> list:
    """``[fn(job) for job in jobs]`` over ``workers`` processes, in order. The workers ignore
    SIGINT and SIGTERM: a stop reaches the writer, which waits for no queued job."""
    with ProcessPoolExecutor(workers, initializer=ignore_stop_signals) as pool:
        try:
            return list(pool.map(fn, jobs, chunksize=chunksize))
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM over a C call that calls back into Python (espeak-ng hands its
    audio to a ctypes callback): ctypes prints and drops an exception raised in a callback, so
    a stop whose handler ran there was lost and the writer went on to the end. A signal that
    came meanwhile meets its handler once the call has returned."""
    if threading.current_thread() is not threading.main_thread():
        yield   # Python runs signal handlers in the main thread only
        return
    held = []
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    previous = {sig: handler for sig, handler in previous.items() if handler is not None}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:
            signum, frame = held[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def fixture_command(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a fixture writer's ``main(argv)``: a ``UserError`` is one line with exit status 2;
    SIGINT or SIGTERM raise ``Interrupted`` (the partial copy is removed on the way out), one
    line with exit status 128 + the signal's number."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> int:
        previous = {sig: signal.signal(sig, _stop) for sig in STOP_SIGNALS}
        try:
            return one_line_errors(main)(argv)
        except Interrupted as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 128 + exc.signum
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return run
