"""Progress output: a tqdm bar on a terminal (rank 0), plain periodic lines otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, desc: str, enabled: bool = True, every_seconds: float = 30.0):
        self.enabled = enabled
        self.total, self.desc = total, desc
        self.n = 0
        self._bar = None
        self._every = every_seconds
        self._last = time.monotonic()
        self._postfix = ""
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)

    def update(self, n: int = 1, **postfix) -> None:
        if not self.enabled:
            return
        self.n += n
        if postfix:
            self._postfix = " ".join(f"{k}={v}" for k, v in postfix.items())
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix_str(self._postfix, refresh=False)
        elif time.monotonic() - self._last >= self._every:
            self._last = time.monotonic()
            print(f"{self.desc}: {self.n}/{self.total} {self._postfix}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def say(msg: str, enabled: bool = True) -> None:
    """One line on stdout from the main rank."""
    if enabled:
        print(msg, flush=True)
