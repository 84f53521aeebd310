"""Hyper-parameters as a typed dataclass per workload, turned into flags.

A workload's ``HParams`` dataclass holds the MLPerf reference values as defaults; each field
is declared with :func:`hparam` (its help line and its check). :func:`add_args` makes one flag
a field (``lr_decay_steps`` -> ``--lr-decay-steps``), typed from the annotation and checked at
parse time, so a bad value is the parser's one-line error (exit 2), never a traceback later.
:func:`from_args` reads the instance back from the parsed flags.

A small function of our own rather than ``tyro`` or ``simple-parsing``: the flags must join
the driver's ``argparse`` parser, its groups and its one-line errors, and a field needs only
a type, a default, a help line and a check; both libraries bring their own parser and help
formatting for what is here about 100 lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

# -- checks: value -> None, or ArgumentTypeError naming the rule -------------------------------
# A number must be finite unless its check says what infinity means (positive_or_inf): an
# infinite learning rate or warm-up is no setting, it ends in NaNs or an overflow later. NaN
# passes no comparison, so every check refuses it.


def positive(v):
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {v}")
    _finite(v)


def positive_or_inf(v):
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 (inf: none), not {v}")


def non_negative(v):
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {v}")
    _finite(v)


def _finite(v):
    if v == math.inf:
        raise argparse.ArgumentTypeError(f"must be finite, not {v}")


def fraction(v):
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {v}")


def positive_fraction(v):
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 1, not {v}")


def open_fraction(v):
    if not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"must be 0 or more and less than 1, not {v}")


def hparam(default: Any, help: str, check: Callable[[Any], None] | None = None,
           choices: tuple | None = None) -> Any:
    """A dataclass field for a hyper-parameter: its reference ``default``, one ``help`` line,
    a ``check`` applied to each value (lists: each element) and ``choices``."""
    meta = {"help": help, "check": check, "choices": choices}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def checked(kind: type, check: Callable[[Any], None] | None = None) -> Callable[[str], Any]:
    """An argparse ``type``: ``kind(text)`` passed through ``check``; a bad value is the
    parser's one-line error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, not {text!r}"
            ) from None
        if check is not None:
            check(value)
        return value
    parse.__name__ = kind.__name__   # argparse names the type in its "invalid" message
    return parse


def _list(kind: type, check) -> Callable[[str], list]:
    one = checked(kind, check)

    def parse(text: str) -> list:
        return [one(v) for v in text.split(",") if v.strip()]
    return parse


def _argument(f: dataclasses.Field, hint) -> dict:
    """``add_argument`` keywords for a field of type ``hint``."""
    meta = f.metadata
    kw: dict[str, Any] = {"help": meta.get("help", ""), "dest": f.name}
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    kw["default"] = default
    check = meta.get("check")
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in \
        typing.get_args(hint)
    if optional:
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    if hint is bool:
        kw["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        kw["type"], kw["metavar"] = _list(item, check), f"{item.__name__.upper()},.."
    elif hint in (int, float):
        kw["type"] = checked(hint, check)
    elif hint is Path:
        kw["type"] = Path
    elif hint is str:
        pass
    else:
        raise TypeError(f"hyper-parameter {f.name}: unsupported type {hint}")
    if meta.get("choices"):
        kw["choices"] = meta["choices"]
    if default is not None and not isinstance(default, bool) and kw["help"] is not None:
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        kw["help"] = f"{kw['help']} (reference: {shown})".lstrip()
    return kw


def add_args(group, cls: type) -> None:
    """A flag for each field of the dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        group.add_argument(flag(f.name), **_argument(f, hints[f.name]))


def from_args(cls: type, args: argparse.Namespace):
    """The ``cls`` instance the parsed flags give."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

