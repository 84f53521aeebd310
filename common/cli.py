"""Argument parsing that reports bad flags in one line."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable

from common.errors import UserError, one_line


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` with one-line errors (``prog: error: ...``) and exit code 2."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def one_line_errors(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a command's ``main(argv)``: a ``UserError`` becomes one ``error: ...`` line on
    stderr and exit code 2."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except UserError as exc:
            print(f"error: {one_line(exc)}", file=sys.stderr)
            return 2
    return run
