"""The error type for bad input: printed as one line naming the problem and the fix."""


class UserError(Exception):
    """Bad input (dataset, flag, config, file) that the user can fix; never a bug in the suite."""


def require_cuda(device, what: str, fix: str = "leave it out") -> None:
    """A ``UserError`` unless ``device`` is a CUDA device: ``what`` (a flag and why it needs
    the GPU), then the way out, ``fix`` otherwise."""
    if device.type != "cuda":
        raise UserError(f"{what}: run with --device cuda, or {fix}")


MAX_CHARS = 400


def one_line(exc: BaseException) -> str:
    """An exception message as one line.

    Errors raised inside DataLoader worker processes come back wrapped in a
    multi-line traceback whose last line is ``pkg.UserError: <message>``: that
    message is returned. Any other multi-line message is joined with `` | ``
    and cut to ``MAX_CHARS``.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    last = lines[-1]
    prefix = f"{UserError.__module__}.{UserError.__name__}: "
    for p in (prefix, f"{UserError.__name__}: "):
        if last.startswith(p):
            return last[len(p):]
    text = " | ".join(lines)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 3] + "..."
