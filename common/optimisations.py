"""Optimisations as named units applied to a workload's plain reference parts.

A workload built with no optimisation named is the MLPerf reference path. Each speed-up is an
:class:`Optimisation`: a name, a one-line description, what it requires and excludes, and the
functions that apply it: ``select`` before ``Workload.build()`` (it picks an implementation,
e.g. a reader or a kernel, on the workload's ``impl`` namespace) and ``apply`` after it (it
transforms the built model, loss, optimizer or loaders in place). A workload lists its
optimisations in a :class:`Registry`; the list's order is the order of application, and an
optimisation's requirements come before it. The shared ones (the whole-step CUDA graph,
``torch.compile``, the fused optimizers, channels-last memory) are defined here and listed by
the workloads that take them, each with the workload's own ``apply``.

On the command line: ``--optimisations NAME[=VALUE],...`` (repeatable); ``--list-optimisations``
prints the registry (``--list-optimisations markdown``: as the table of the workload's README,
:func:`markdown_table`). Impossible combinations are refused in one line before anything is
built.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Optimisation:
    """One named speed-up over the reference path.

    ``select(wl, value)`` runs before ``build()``; ``apply(wl, value)`` after it. ``value`` is
    the optimisation's parameter (``name=VALUE``; ``default`` when not given, None for an
    optimisation without one). ``compare`` says how the registry-wide test holds it against
    the plain path: ``"step"`` (the losses of a few training steps on the same weights and
    batches, within ``rtol``) or ``"batches"`` (the first training batch of the same seed,
    within ``atol``); ``None`` where the comparison is a test of its own (``tested_by``).
    """

    name: str
    description: str
    apply: Callable[[Any, Any], None] | None = None
    select: Callable[[Any, Any], None] | None = None
    requires: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    cuda: bool = False                   # needs a CUDA device
    precisions: tuple[str, ...] = ()     # the precisions it runs under; empty: every one
    single_process: bool = False         # one process only (e.g. a backward DDP cannot reduce)
    value_type: Callable[[str], Any] | None = None   # parser of ``name=VALUE``
    default: Any = None                  # the value when only the name is given
    compare: str | None = "step"
    rtol: float = 1e-5
    atol: float = 0.0
    tested_by: str = ""                  # the test that compares it, where compare is None

    def __post_init__(self):
        if self.compare not in ("step", "batches", None):
            raise ValueError(f"{self.name}: compare must be step, batches or None")
        if self.compare is None and not self.tested_by:
            raise ValueError(f"{self.name}: compare=None needs tested_by")
        if self.apply is None and self.select is None and self.name not in DRIVER_OWNED:
            raise ValueError(f"{self.name}: give apply or select")

    def needs(self) -> str:
        """Its requirements, for people."""
        parts = [*(f"+{r}" for r in self.requires), *(f"not {e}" for e in self.excludes)]
        parts += ["CUDA"] * self.cuda + [f"precision {'|'.join(self.precisions)}"] * bool(
            self.precisions) + ["one process"] * self.single_process
        return ", ".join(parts)


# Optimisations the driver consumes itself (it reads them from ``args``).
DRIVER_OWNED = ("cuda-graph", "compile")
COMPILE_MODES = ("default", "tuned", "max-autotune-no-cudagraphs")


def _compile_mode(text: str) -> str:
    if text not in COMPILE_MODES:
        raise argparse.ArgumentTypeError(f"compile mode must be one of {COMPILE_MODES}")
    return text


CUDA_GRAPH = Optimisation(
    "cuda-graph", "capture the whole training step (forward, backward, all-reduce, optimizer) "
    "as CUDA graphs under the workload's capture policy (common/cuda_graph.py)", cuda=True,
    compare=None, tested_by="tests/common/test_cuda_graph.py")
COMPILE = Optimisation(
    "compile", "torch.compile the workload's compiled regions (=MODE: default, tuned, "
    "max-autotune-no-cudagraphs)", value_type=_compile_mode, default="default", rtol=1e-4)


def shared(opt: Optimisation, **changes) -> Optimisation:
    """A shared optimisation as one workload takes it (its own ``apply``, tolerance, ...)."""
    return dataclasses.replace(opt, **changes)


class Registry:
    """A workload's optimisations, in their order of application."""

    def __init__(self, *opts: Optimisation):
        self.opts = {o.name: o for o in opts}
        if len(self.opts) != len(opts):
            raise ValueError("optimisation names must be unique")
        order = list(self.opts)
        for o in opts:
            for r in o.requires:
                if r not in self.opts or order.index(r) > order.index(o.name):
                    raise ValueError(f"{o.name} requires {r}, which must be registered "
                                     "before it")
            for e in o.excludes:
                if e not in self.opts:
                    raise ValueError(f"{o.name} excludes an unknown optimisation {e}")

    def __iter__(self):
        return iter(self.opts.values())

    def __contains__(self, name: str) -> bool:
        return name in self.opts

    def __getitem__(self, name: str) -> Optimisation:
        return self.opts[name]

    def __len__(self) -> int:
        return len(self.opts)

    # -- the command line -------------------------------------------------------------------
    def parse(self, items: Iterable[str]) -> dict[str, Any]:
        """``NAME[=VALUE]`` items (each may hold several, comma-separated) -> {name: value}
        in the registry's order; a ``UserError`` naming the bad item."""
        chosen: dict[str, Any] = {}
        for item in items:
            for part in filter(None, (p.strip() for p in item.split(","))):
                name, has_value, text = part.partition("=")
                if name not in self.opts:
                    raise UserError(f"unknown optimisation {name!r}; --list-optimisations "
                                    f"prints the {len(self.opts)} there are")
                opt = self.opts[name]
                if has_value and opt.value_type is None:
                    raise UserError(f"optimisation {name} takes no value: write {name}")
                try:
                    value = opt.value_type(text) if has_value else opt.default
                except (ValueError, argparse.ArgumentTypeError) as exc:
                    raise UserError(f"optimisation {part}: {exc}") from None
                if name in chosen and chosen[name] != value:
                    raise UserError(f"optimisation {name} given twice with different values")
                chosen[name] = value
        self.check_combination(chosen)
        return {n: chosen[n] for n in self.opts if n in chosen}

    def check_combination(self, chosen: Mapping[str, Any]) -> None:
        """Refuse a missing requirement or an excluded pair, naming both optimisations."""
        for name in chosen:
            opt = self.opts[name]
            for r in opt.requires:
                if r not in chosen:
                    raise UserError(f"optimisation {name} requires {r}: add {r} or drop {name}")
            for e in opt.excludes:
                if e in chosen:
                    raise UserError(f"optimisations {name} and {e} exclude each other: "
                                    "drop one")

    def check_environment(self, chosen: Mapping[str, Any], device: str, precision: str,
                          world_size: int) -> None:
        """Refuse what the device, precision or process count cannot run."""
        for name in chosen:
            opt = self.opts[name]
            if opt.cuda and device != "cuda":
                raise UserError(f"optimisation {name} needs CUDA: run with --device cuda on a "
                                f"GPU, or drop {name}")
            if opt.precisions and precision not in opt.precisions:
                raise UserError(f"optimisation {name} runs under --precision "
                                f"{' or '.join(opt.precisions)}, not {precision}")
            if opt.single_process and world_size > 1:
                raise UserError(f"optimisation {name} runs in one process only: drop it for "
                                f"{world_size} processes")

    def closure(self, names: Iterable[str]) -> list[str]:
        """``names`` with every requirement, in the registry's order."""
        want: set[str] = set()

        def add(n):
            if n not in want:
                want.add(n)
                for r in self.opts[n].requires:
                    add(r)
        for n in names:
            add(n)
        return [n for n in self.opts if n in want]

    def describe(self) -> str:
        """One line per optimisation: name, description, requirements."""
        width = max((len(n) for n in self.opts), default=0)
        lines = []
        for o in self:
            needs = o.needs()
            lines.append(f"{o.name:<{width}}  {o.description}" + (f" [{needs}]" if needs else ""))
        return "\n".join(lines)

    # -- application ------------------------------------------------------------------------
    def select(self, wl, chosen: Mapping[str, Any]) -> None:
        for name, value in chosen.items():
            if self.opts[name].select is not None:
                self.opts[name].select(wl, value)

    def apply(self, wl, chosen: Mapping[str, Any]) -> None:
        for name, value in chosen.items():
            if self.opts[name].apply is not None:
                self.opts[name].apply(wl, value)


GAIN_COLUMN = "measured gain"
TABLE_HEADER = ("name", "what it does", GAIN_COLUMN, "requirements")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").strip()


def requirements_cell(opt: Optimisation) -> str:
    """What ``opt`` needs, as one table cell: the optimisations it requires and excludes,
    CUDA, its precisions, one process, and its value; ``-`` for none."""
    parts = []
    if opt.requires:
        parts.append("needs " + ", ".join(f"`{r}`" for r in opt.requires))
    if opt.excludes:
        parts.append("not with " + ", ".join(f"`{e}`" for e in opt.excludes))
    if opt.cuda:
        parts.append("CUDA")
    if opt.precisions:
        parts.append(" or ".join(opt.precisions) + " only")
    if opt.single_process:
        parts.append("one process")
    if opt.value_type is not None:
        parts.append("`=VALUE`" + (f", default `{opt.default}`" if opt.default is not None
                                    else ""))
    return _cell("; ".join(parts)) or "-"


def markdown_table(registry: Registry, gains: Mapping[str, str] | None = None) -> str:
    """The registry as a markdown table, one row per optimisation in the order of application:
    name, what it does (the description), the measured gain (``gains[name]``; empty when not
    given: measured figures are written by hand, with where they were measured) and
    requirements (:func:`requirements_cell`). ``python -m benchmarks.<name>
    --list-optimisations markdown`` prints it for the workload's README."""
    gains = gains or {}
    rows = ["| " + " | ".join(TABLE_HEADER) + " |", "|---|---|---|---|"]
    for o in registry:
        cells = (f"`{o.name}`", _cell(o.description), _cell(gains.get(o.name, "")),
                 requirements_cell(o))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


LIST_FORMATS = ("text", "markdown")


def add_args(parser: argparse.ArgumentParser, registry: Registry) -> None:
    """The optimisations group of ``--help``: ``--optimisations`` and ``--list-optimisations``,
    the registry listed in the group's description."""
    g = parser.add_argument_group(
        "optimisations (none named: the MLPerf reference path)",
        description=registry.describe() if len(registry) else "none registered")
    g.add_argument("--optimisations", "--opt", action="append", default=[], metavar="NAME[=V],..",
                   help="optimisations to apply, in the registry's order whatever the order "
                        "given")
    g.add_argument("--list-optimisations", action=_ListAction, registry=registry,
                   help="print the registry and exit; FORMAT: text (the default) or markdown "
                        "(the table of the workload's README, its measured gains left empty)")


class _ListAction(argparse.Action):
    def __init__(self, option_strings, dest, registry: Registry, **kwargs):
        super().__init__(option_strings, dest, nargs="?", const="text", choices=LIST_FORMATS,
                         metavar="FORMAT", default=argparse.SUPPRESS, **kwargs)
        self.registry = registry

    def __call__(self, parser, namespace, values, option_string=None):
        if values == "markdown":
            print(markdown_table(self.registry))
        else:
            print(self.registry.describe() or "no optimisations registered")
        parser.exit(0)


def resolve(parser: argparse.ArgumentParser, registry: Registry,
            args: argparse.Namespace) -> None:
    """``args.optimisations`` parsed into {name: value}, with ``args.cuda_graph`` and
    ``args.compile`` (what the driver and ``maybe_compile`` read) derived from it; a bad item
    or combination is the parser's one-line error."""
    try:
        chosen = registry.parse(args.optimisations)
    except UserError as exc:
        parser.error(str(exc))
    args.optimisations = chosen
    args.cuda_graph = "cuda-graph" in chosen
    args.compile = chosen.get("compile", "none")


def config_optimisations(benchmark: str, system: str) -> list[str]:
    """The ``OPTIMISATIONS`` array of ``benchmarks/<benchmark>/config_<system>.sh``, under this
    process's environment (``COMPILE``, ``PRECISION``, ``DATA_BACKEND``, as the config reads
    them)."""
    path = REPO / "benchmarks" / benchmark / f"config_{system}.sh"
    if not path.is_file():
        raise UserError(f"no config {path}")
    out = subprocess.run(["bash", "-c", f'source {shlex.quote(str(path))} >/dev/null; '
                          'printf "%s\\n" "${OPTIMISATIONS[@]}"'], capture_output=True,
                         text=True, env={"BACKBONE_CHECKPOINT": "-", "INIT_CHECKPOINT": "-",
                                         **os.environ})
    if out.returncode:
        raise UserError(f"{path}: {out.stderr.strip()}")
    return [x for x in out.stdout.splitlines() if x]


def ablation_variants(registry: Registry, config: Sequence[str]) -> dict[str, list[str]]:
    """The throughput variants the registry gives: ``plain`` (no optimisation), ``config``
    (the config's set) and ``config-minus-<name>`` for each name in it (with what requires it
    dropped too), each as ``--optimisations`` items."""
    config = list(config)
    variants = {"plain": [], "config": config}
    for name in config:
        base = name.partition("=")[0]
        kept = [c for c in config if base not in _with_requirements(registry, c)]
        variants[f"config-minus-{base}"] = kept
    return variants


def plus_variants(registry: Registry, config: Sequence[str],
                  leave_out: Sequence[str] = ()) -> dict[str, list[str]]:
    """``config-plus-<name>`` for each optimisation of ``registry`` outside ``config`` (and
    its requirements) and ``leave_out``: the config's items with it and its missing
    requirements added, less those that exclude it or that it excludes, and those that
    require one of them."""
    names = [c.partition("=")[0] for c in config]
    variants = {}
    for o in registry:
        if o.name in (*leave_out, *registry.closure(names)):
            continue
        kept = {n for n in names if n not in o.excludes and o.name not in registry[n].excludes}
        kept = {n for n in kept if set(registry.closure([n])) <= kept}   # requirements kept
        added = [n for n in registry.closure([o.name]) if n not in kept]
        variants[f"config-plus-{o.name}"] = [c for c, n in zip(config, names)
                                             if n in kept] + added
    return variants


def _with_requirements(registry: Registry, item: str) -> list[str]:
    return registry.closure([item.partition("=")[0]])
