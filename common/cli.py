"""Argument parsing that reports bad flags in one line."""

from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` with one-line errors (``prog: error: ...``) and exit code 2."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)
