"""A thread pinning host memory during a CUDA graph capture, as a loader's does."""

import threading
from collections.abc import Callable

import torch


class PinningThread:
    """``with PinningThread() as p:`` starts a thread that, once the wrapped function
    (``p.during_capture(fn)``) is called inside a capture, allocates 50 new page-locked blocks
    (a ``cudaHostAlloc`` each) while the capture waits for it. ``p.errors``: what the
    allocations raised; ``p.pinned``: set once they ran."""

    def __init__(self):
        self.capturing, self.pinned, self.errors = threading.Event(), threading.Event(), []
        self.thread = threading.Thread(target=self._pin)

    def _pin(self) -> None:
        self.capturing.wait()
        try:
            blocks = [torch.empty(1 << 16, dtype=torch.uint8, pin_memory=True)
                      for _ in range(50)]
            blocks.clear()
        except RuntimeError as exc:
            self.errors.append(exc)
        self.pinned.set()

    def during_capture(self, fn: Callable) -> Callable:
        def wrapped(*args):
            if torch.cuda.is_current_stream_capturing() and not self.capturing.is_set():
                self.capturing.set()
                assert self.pinned.wait(30)
            return fn(*args)
        return wrapped

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.capturing.set()
        self.thread.join()
