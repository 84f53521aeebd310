"""MLPerf log over the real ``mlperf_logging.mllog`` package.

One log file per run, written by rank 0 only; the other ranks get a logger
that drops every event. Keys come from ``mlperf_logging.mllog.constants``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mlperf_logging.mllog import constants
from mlperf_logging.mllog.mllog import MLLogger

__all__ = ["MLLog", "constants"]

_REPO_ROOT = str(Path(__file__).resolve().parent.parent)


class MLLog:
    """Writes ``:::MLLOG`` lines for one run to ``path`` (and optionally stdout)."""

    def __init__(self, path: str | os.PathLike | None, rank: int = 0, echo: bool = False):
        self.enabled = rank == 0 and path is not None
        self.path = Path(path) if path is not None else None
        self._logger = None
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A private logging.Logger per run, so two runs in one process never mix files.
        py_logger = logging.getLogger(f"mlperf_suite.{id(self)}")
        py_logger.propagate = False
        py_logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(self.path, mode="w")
        py_logger.addHandler(self._handler)
        if echo:
            py_logger.addHandler(logging.StreamHandler())
        self._py_logger = py_logger
        self._logger = MLLogger(logger=py_logger, root_dir=_REPO_ROOT, default_stack_offset=2)

    def event(self, key: str, value=None, metadata: dict | None = None) -> None:
        if self._logger is not None:
            self._logger.event(key=key, value=value, metadata=metadata)

    def start(self, key: str, value=None, metadata: dict | None = None) -> None:
        if self._logger is not None:
            self._logger.start(key=key, value=value, metadata=metadata)

    def end(self, key: str, value=None, metadata: dict | None = None) -> None:
        if self._logger is not None:
            self._logger.end(key=key, value=value, metadata=metadata)

    def close(self) -> None:
        if self._logger is not None:
            self._handler.flush()
            self._handler.close()
            self._py_logger.removeHandler(self._handler)
            self._logger = None
