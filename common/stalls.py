"""Where a slow step's host time went: a watcher thread samples the stepping thread's Python
stack while a step runs past a limit.

In a data-parallel step a stall on one rank stalls every rank at the next collective, so the
rank that starts it shows it one step earlier than the others, and its stack says whether it
waited on the GPU (a synchronising call), on Python or on a lock. A stepping thread that holds
the GIL for the whole stall (a long C call that does not release it) leaves no sample, and
that is reported too.

The watch also records every subprocess started while it is open (an audit hook), with the
step and the starting thread's frames: a step that starts a compiler (a kernel specialised
anew, its launcher built) shows that way even when no sample lands in it. And it records
every compilation torch runs while it is open (Dynamo's compile callbacks: a frame traced
anew, a backward compiled lazily at its first call, a CUDA graph recorded), with the step
and the seconds it took.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback

FRAMES = 6   # innermost frames kept per sample
_WAITS = ("wait", "_wait_for_tstate_lock")   # threading.py waits: Event, Condition, join
_open: list[StallWatch] = []   # the watches open now; one audit hook serves them all
_hooked = False


def _audit(event: str, args: tuple) -> None:
    if event == "subprocess.Popen" and _open:
        argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        command = " ".join(str(a) for a in argv)[:200]
        where = _frames([f for f in _stack(sys._getframe(1))
                         if not f.filename.endswith("subprocess.py")])
        for watch in _open:
            watch.spawned.append((watch._step, command, where))


def _compile_callbacks():
    from torch._dynamo.callback import callback_handler
    return callback_handler


def _waiting(frame: traceback.FrameSummary) -> bool:
    """A thread parked in one of ``threading``'s waits (not one calling ``Event.is_set``)."""
    return frame.filename.endswith("threading.py") and frame.name in _WAITS


def _stack(frame) -> list[traceback.FrameSummary]:
    """``frame``'s stack, outermost first, without the source lines (``_frames`` prints only
    file, line number and function; reading the sources made a sampler's first samples slow
    enough, beside a thread spinning on the GIL, to miss a 150 ms step)."""
    stack = traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=False)
    stack.reverse()
    return stack


def _frames(stack: list[traceback.FrameSummary]) -> str:
    return " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
                       for f in stack[-FRAMES:][::-1])


class StallWatch:
    """``with StallWatch() as w:`` then ``w.begin(step, limit_s)`` / ``w.end()`` around each
    step; ``w.samples[step]`` is the last sample taken after that step passed its limit: one
    line per busy thread of its innermost frames ("file:line function", innermost first),
    the stepping thread's first. ``w.spawned`` lists ``(step or None, command, frames)`` of
    each subprocess started while the watch is open, ``w.compiles`` ``(step or None, what,
    seconds)`` of each compilation (``what``: ``DYNAMO``, ``LAZY_BACKWARD``,
    ``CUDAGRAPH_RECORDING``)."""

    def __init__(self, period_s: float = 0.01):
        self.period_s = period_s
        self.samples: dict[int, list[str]] = {}
        self.spawned: list[tuple[int | None, str, str]] = []
        self.compiles: list[tuple[int | None, str, float]] = []
        self._compile_began: tuple[int | None, float] | None = None
        self._step: int | None = None
        self._thread_id = threading.get_ident()
        self._current: tuple[int, float, float] | None = None   # step, start, limit
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="stall-watch", daemon=True)

    def __enter__(self) -> StallWatch:
        global _hooked
        if not _hooked:   # an audit hook cannot be removed: one for the process
            sys.addaudithook(_audit)
            _hooked = True
        _open.append(self)
        # Dynamo already loaded (torch.compile was called) or nothing can compile: importing
        # it here would cost an uncompiled process about 2 s
        self._compiles = _compile_callbacks() if "torch._dynamo" in sys.modules else None
        if self._compiles:
            self._compiles.register_start_callback(self._compile_start)
            self._compiles.register_end_callback(self._compile_end)
        self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        _open.remove(self)
        if self._compiles:
            self._compiles.remove_start_callback(self._compile_start)
            self._compiles.remove_end_callback(self._compile_end)
        self._stop.set()
        self._watcher.join()

    def begin(self, step: int, limit_s: float | None) -> None:
        self._step = step
        self._current = None if limit_s is None else (step, time.perf_counter(), limit_s)

    def end(self) -> None:
        self._step = self._current = None

    def _compile_start(self, args) -> None:
        self._compile_began = (self._step, time.perf_counter())

    def _compile_end(self, args) -> None:
        if self._compile_began is not None:
            step, began = self._compile_began
            self.compiles.append((step, args.callback_trigger.name, time.perf_counter() - began))
            self._compile_began = None

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            current = self._current
            if current is None or time.perf_counter() - current[1] < current[2]:
                continue
            sample = self._sample()
            if self._current is current:
                self.samples[current[0]] = sample

    def _sample(self) -> list[str]:
        """The stepping thread's innermost frames, then those of every other thread that
        runs Python outside ``threading``'s waits (autograd's device threads run backward's
        Python code while the stepping thread waits in ``backward``)."""
        names = {t.ident: t.name for t in threading.enumerate()}
        out = []
        for ident, frame in sys._current_frames().items():
            if ident == threading.get_ident():
                continue
            stack = _stack(frame)
            if ident != self._thread_id and _waiting(stack[-1]):
                continue
            if ident == self._thread_id:
                out.insert(0, _frames(stack))
            else:
                out.append(f"[{names.get(ident, ident)}] " + _frames(stack))
        return out
