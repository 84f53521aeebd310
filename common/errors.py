"""The error type for bad input: printed as one line naming the problem and the fix."""


class UserError(Exception):
    """Bad input (dataset, flag, config, file) that the user can fix; never a bug in the suite."""


def one_line(exc: BaseException) -> str:
    """The last meaningful line of an exception message.

    Errors raised inside DataLoader worker processes come back wrapped in a
    multi-line traceback whose last line is ``pkg.UserError: <message>``.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    last = lines[-1]
    prefix = f"{UserError.__module__}.{UserError.__name__}: "
    for p in (prefix, f"{UserError.__name__}: "):
        if last.startswith(p):
            return last[len(p):]
    return last
