"""Every command the docs show still works as written (issue #62).

The commands are read from ``README.md``, ``benchmarks/*/README.md`` and ``docs/*.md`` (not
``docs/history/``, which keeps old commands on purpose): shell lines in code blocks (fenced,
or indented four spaces) and inline code spans. One test case a command, named
``file:line command``:

- ``python -m MODULE ARGS`` (``python3``, ``.venv/bin/python``, ``srun ... python``, with
  ``VAR=value`` prefixes; ``torchrun OPTS -m MODULE ARGS`` and ``python -m
  torch.distributed.run`` too): the module exists and its argument parser accepts every flag
  and value written after it. The module runs in this process (``runpy``) with ``sys.argv``
  set and argparse patched (:func:`parse_only`): the real parse runs, then a private
  exception stops the module before it does any work. torchrun's own options go through
  torchrun's parser the same way. The flags a tool hands on to a workload are parsed as the
  tool would: ``common.bench``'s ``--workload-args`` by the workload's parser
  (``parse_bench_args``), ``compliance.seeds``' ``--extra-args`` as a run_and_time.sh
  ``EXTRA_ARGS`` (below).
- ``benchmarks/<name>/run_and_time.sh`` (``make run``): the benchmark and its
  ``config_${CONFIG}.sh`` exist; every ``VAR=value`` set before it (or exported before it in
  the same code block) is one that ``common/run_and_time.sh``, the benchmark's script or the
  config reads from the environment (:func:`script_variables`), or one that the training
  program's Python names or a library under it reads (:data:`LIBRARY_VARIABLES`); and the
  training program accepts the command line the script would give it: the config's
  ``OPTIMISATIONS`` and ``TRAIN_ARGS`` (the config sourced by bash with the command's
  variables) and ``EXTRA_ARGS``.
- ``make TARGET``: a target of the Makefile; a ``VAR=value`` for it, one the Makefile reads
  (``make run``'s also those of the benchmark script its recipe runs, checked as above).

Placeholders written in the docs (``DIR``, ``N``, ``<path>``, ``$DATADIR``) are values: where
a flag's type or choices refuse one, the placeholder is taken as it is. ``...`` stands for
omitted arguments: a command holding one (or an inline mention of a module with no
arguments) may lack required arguments, and ``...`` or an upper-case placeholder left over
(``ARGS``) is no unknown argument; every flag written is still checked. ``[--flag value]``
(an optional part) is parsed as ``--flag value``. A flag must be written in full: the check
turns argparse's abbreviations off, so that a removed flag that begins a live one's name is
refused, not taken as that one. What cannot be checked here is skipped with the reason (a
placeholder module or benchmark name, another project's module, a module that needs
torchvision, torchaudio or CUDA before it parses), never passed silently.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def doc_files(root: Path = REPO) -> list[Path]:
    """The documents whose commands must work (``docs/*.md`` does not descend into
    ``docs/history/``)."""
    return [root / "README.md", *sorted(root.glob("benchmarks/*/README.md")),
            *sorted(root.glob("docs/*.md"))]


# -- reading the commands ---------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    path: str                    # the document, relative to the repository
    line: int                    # where the command starts
    text: str                    # the command as written (continuations joined)
    kind: str                    # "python" | "torchrun" | "script" | "make"
    env: tuple[tuple[str, str], ...]   # VAR=value set for it (prefix, export, make's)
    argv: tuple[str, ...]        # python: (module, *args); torchrun: its argv;
                                 # script: (benchmark,); make: the targets
    partial: bool = False        # `...` stands for omitted arguments

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def id(self) -> str:
        head = {"python": lambda: f"python -m {self.argv[0]}",
                "torchrun": lambda: "torchrun",
                "script": lambda: f"benchmarks/{self.argv[0]}/run_and_time.sh",
                "make": lambda: "make " + " ".join(self.argv)}[self.kind]()
        return f"{self.where} {head}"


FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console", "text"}
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
PYTHON = re.compile(r"^(\S*/)?python3?(\.\d+)?$")
SCRIPT = re.compile(r"^(?:\./)?benchmarks/([^/\s]+)/run_and_time\.sh$")
LAUNCHERS = {"srun", "env", "time", "nohup", "exec", "bash", "sh", "do", "then", "else"}
OPERATORS = {"&&", "||", "|", ";", "&"}
REDIRECT = re.compile(r"^\d*(>>?|<)(&\d+)?$")            # a bare redirection: `>`, `2>&1`
REDIRECT_TO = re.compile(r"^\d*>>?[^>]+$")                # `>out.txt` (not `<path>`)
ELLIPSIS = {"...", "\u2026"}
PYTHON_OPTIONS_WITH_VALUE = {"-X", "-W"}


def logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Shell lines as bash reads them, numbered by their first line: a ``\\`` before the
    newline or an open quote continues a line, comments are dropped."""
    out, current, start, quote, comment = [], [], None, None, False
    for number, raw in lines:
        text = raw + "\n"
        if start is None:
            start = number
        i = 0
        while i < len(text):
            ch = text[i]
            if comment:
                if ch == "\n":
                    comment = False
                    continue
            elif ch == "\\" and quote != "'" and text[i + 1:i + 2] == "\n":
                current.append(" ")
                i += 2
                continue
            elif ch == "\\" and quote != "'":
                current.append(text[i:i + 2])
                i += 2
                continue
            elif quote:
                if ch == quote:
                    quote = None
                current.append(" " if ch == "\n" else ch)
            elif ch in "'\"":
                quote = ch
                current.append(ch)
            elif ch == "#" and (not current or current[-1].isspace()):
                comment = True
            elif ch == "\n":
                joined = " ".join("".join(current).split())
                if joined:
                    out.append((start, joined))
                current, start = [], None
            else:
                current.append(ch)
            i += 1
    joined = " ".join("".join(current).split())
    if joined:
        out.append((start, joined))
    return out


def split_segments(tokens: list[str]) -> list[list[str]]:
    """Tokens split at ``&&``, ``||``, ``|``, ``;`` (also at a word's end), redirections
    dropped."""
    segments, current = [], []
    it = iter(tokens)
    for tok in it:
        if tok in OPERATORS:
            segments.append(current)
            current = []
        elif REDIRECT.match(tok):
            if not REDIRECT.match(tok)[2]:   # `> file`; `2>&1` names no file
                next(it, None)
        elif REDIRECT_TO.match(tok):
            continue
        elif tok.endswith(";") and len(tok) > 1:
            current.append(tok[:-1])
            segments.append(current)
            current = []
        else:
            current.append(tok)
    segments.append(current)
    return [s for s in segments if s]


def unbracket(tokens: list[str]) -> list[str]:
    """``[--flag value]`` (an optional part in a synopsis) as ``--flag value``."""
    out, depth = [], 0
    for tok in tokens:
        while tok.startswith("[") and len(tok) > 1 and tok[1] in "-[":
            tok, depth = tok[1:], depth + 1
        while depth and tok.endswith("]") and tok.count("[") < tok.count("]"):
            tok, depth = tok[:-1], depth - 1
        if tok:
            out.append(tok)
    return out


def classify(tokens: list[str], env: dict[str, str], path: str, line: int, text: str,
             inline: bool) -> Command | None:
    """The command these tokens run, or None for anything else (``cd``, ``for``, prose)."""
    env = dict(env)
    i = 0
    while i < len(tokens) and ASSIGNMENT.match(tokens[i]):
        name, value = ASSIGNMENT.match(tokens[i]).groups()
        env[name] = value
        i += 1
    rest = tokens[i:]
    if rest and rest[0] in LAUNCHERS:   # srun --opt ... python ..., bash benchmarks/...
        starts = [j for j, t in enumerate(rest)
                  if PYTHON.match(t) or SCRIPT.match(t) or t == "torchrun"]
        if not starts:
            return None
        rest = rest[starts[0]:]
    if not rest:
        return None
    partial = any(t in ELLIPSIS for t in rest)
    rest = unbracket(rest)
    frozen = tuple(sorted(env.items()))
    prog = rest[0]
    if PYTHON.match(prog):
        j = 1
        while j < len(rest) and rest[j].startswith("-") and rest[j] != "-m":
            j += 2 if rest[j] in PYTHON_OPTIONS_WITH_VALUE else 1
        if j + 1 >= len(rest) or rest[j] != "-m":
            return None   # a script or `-c`: not a module command
        module, args = rest[j + 1], rest[j + 2:]
        partial = partial or (inline and not args)   # a mention: `python -m compliance.check`
        if module == "torch.distributed.run":
            return Command(path, line, text, "torchrun", frozen, tuple(args), partial)
        return Command(path, line, text, "python", frozen, (module, *args), partial)
    if prog == "torchrun":
        return Command(path, line, text, "torchrun", frozen, tuple(rest[1:]), partial)
    if SCRIPT.match(prog):
        return Command(path, line, text, "script", frozen, (SCRIPT.match(prog)[1],), partial)
    if prog == "make":
        targets = []
        for tok in rest[1:]:
            if ASSIGNMENT.match(tok):
                name, value = ASSIGNMENT.match(tok).groups()
                env[name] = value
            elif not tok.startswith("-") and tok not in ELLIPSIS:
                targets.append(tok)
        return Command(path, line, text, "make", tuple(sorted(env.items())),
                       tuple(targets or ["<default>"]), partial)
    return None


COMMAND_LIKE = re.compile(r"python3? -m |torchrun |run_and_time\.sh|(^|\s)make ")


def shell_commands(text: str, path: str, line: int, exported: dict[str, str] | None = None,
                   inline: bool = False) -> list[Command]:
    """The commands of one shell line; ``export VAR=value`` adds to ``exported`` (a code
    block's environment for the lines after it)."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:   # unbalanced quotes: such a command cannot run either
        if not COMMAND_LIKE.search(text):
            return []
        return [Command(path, line, text, "python", (), (f"<unreadable: {exc}>",))]
    commands = []
    for seg in split_segments(tokens):
        if seg[0] == "export" and exported is not None:
            for tok in seg[1:]:
                if ASSIGNMENT.match(tok):
                    name, value = ASSIGNMENT.match(tok).groups()
                    exported[name] = value
            continue
        cmd = classify(seg, exported or {}, path, line, text, inline)
        if cmd is not None:
            commands.append(cmd)
    return commands


LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")
INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def markdown_commands(markdown: str, path: str) -> list[Command]:
    """Every command of a markdown document: code blocks line by line (``export`` carried
    to the block's later lines), inline code spans whole (a span may cross lines, not a
    paragraph's end)."""
    lines = markdown.splitlines()
    commands: list[Command] = []
    prose: list[tuple[int, str]] = []

    def flush_prose():
        paragraph, starts = "", []
        for number, text in prose + [(0, "")]:
            if text.strip():
                starts.extend([number] * (len(text) + 1))
                paragraph += text + "\n"
                continue
            for m in INLINE.finditer(paragraph):
                commands.extend(shell_commands(" ".join(m[2].split()), path,
                                               starts[m.start()], inline=True))
            paragraph, starts = "", []
        prose.clear()

    def code(block: list[tuple[int, str]]):
        exported: dict[str, str] = {}
        for number, text in logical_lines(block):
            commands.extend(shell_commands(text, path, number, exported))

    i, blank_before, in_list = 0, True, False
    while i < len(lines):
        line = lines[i]
        if LIST_ITEM.match(line):
            in_list = True
        elif line.strip() and not line[0].isspace():
            in_list = False
        fence = FENCE.match(line)
        if fence:
            flush_prose()
            marker, language = fence.group(1), fence.group(2).lower()
            block = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                block.append((i + 1, lines[i]))
                i += 1
            i += 1
            if language in SHELL_LANGUAGES:
                code(block)
            blank_before = True
            continue
        if blank_before and not in_list and line.startswith("    ") and line.strip():
            # an indented code block (in a list, indented lines continue the item)
            flush_prose()
            block = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                block.append((i + 1, lines[i]))
                i += 1
            code(block)
            blank_before = True
            continue
        prose.append((i + 1, line))
        blank_before = not line.strip()
        i += 1
    flush_prose()
    return commands


def doc_commands(root: Path = REPO) -> list[Command]:
    out = []
    for doc in doc_files(root):
        out.extend(markdown_commands(doc.read_text(), str(doc.relative_to(root))))
    return out


# -- python -m: parse only --------------------------------------------------------------

PLACEHOLDER = re.compile(
    r"^(\.\.\.|\u2026|[A-Z][A-Z0-9_]*(\.\.\.)?)$"    # ..., DIR, N, RAW_DIR, TEXT...
    r"|<[^<>\s]+>"                                  # <path>, benchmarks/<name>
    r"|\$\{?[A-Za-z_]|\$\(")                        # $DATADIR, ${SEED:-1}, $(basename ..)


def is_placeholder(value) -> bool:
    return isinstance(value, str) and bool(PLACEHOLDER.search(value))


class Parsed(BaseException):
    """Raised after the parse of the command line: the module stops there. A
    BaseException, so that no ``except Exception`` in the module holds it."""

    def __init__(self, namespace):
        super().__init__("parsed")
        self.namespace = namespace


@dataclass
class ParseState:
    argv: list[str] | None
    depth: int = 0
    parses: int = 0
    exit_in_parse: bool = False   # a SystemExit left a parse (help, a list, an error)


@contextlib.contextmanager
def parse_only(argv: list[str] | None):
    """argparse patched so that the parse of ``argv`` (``sys.argv[1:]``; None: no parse
    stops) runs for real and then raises :class:`Parsed`. Only a parse called from outside
    argparse counts: a sub-parser's, or a subclass's ``parse_known_args`` under its
    ``parse_args``, finishes first with the rest of the outer one. A ``parse_known_args``
    that leaves arguments over hands the stop on to the parse of what it left (a second
    parser's). A parse of another list (a tool building a second parser's arguments) runs
    normally, and may fail. A value that a flag's type or choices refuse is taken as it is
    when it is a placeholder."""
    state = ParseState(None if argv is None else list(argv))
    cls = argparse.ArgumentParser
    originals = {name: cls.__dict__[name]
                 for name in ("parse_args", "parse_known_args", "_get_value", "_check_value")}

    def parsing(name):
        original = originals[name]

        def wrapper(self, args=None, namespace=None):
            # a flag written in full only: a removed flag that begins a live one's name
            # (`--joint` of `--joint-hidden`) would otherwise be taken as that one
            abbrev, self.allow_abbrev = self.allow_abbrev, False
            state.depth += 1
            try:
                result = original(self, args, namespace)
            except SystemExit:
                if state.depth == 1:
                    state.exit_in_parse = True
                raise
            finally:
                state.depth -= 1
                self.allow_abbrev = abbrev
            if state.depth == 0:
                state.parses += 1
                if state.argv is not None and (args is None or list(args) == state.argv):
                    if name == "parse_args" or not result[1]:
                        raise Parsed(result[0] if name == "parse_known_args" else result)
                    state.argv = list(result[1])   # the rest is a later parser's
            return result
        return wrapper

    def get_value(self, action, arg_string):
        try:
            return originals["_get_value"](self, action, arg_string)
        except argparse.ArgumentError:
            if is_placeholder(arg_string):
                return arg_string
            raise

    def check_value(self, action, value):
        if not is_placeholder(value):
            originals["_check_value"](self, action, value)

    patches = {"parse_args": parsing("parse_args"),
               "parse_known_args": parsing("parse_known_args"),
               "_get_value": get_value, "_check_value": check_value}
    try:
        for name, fn in patches.items():
            setattr(cls, name, fn)
        yield state
    finally:
        for name, fn in originals.items():
            setattr(cls, name, fn)


MISSING = re.compile(r"(the following arguments are required|one of the arguments .* is "
                     r"required|expected (one|at least one) argument)")
UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)$", re.M)
NOT_HERE = re.compile(r"torchvision|torchaudio|CUDA|NVIDIA driver|nvidia", re.I)


def tolerated(message: str, partial: bool) -> bool:
    """A parse error that only says what a placeholder left out or stood for."""
    unknown = UNRECOGNIZED.search(message)
    if unknown and all(is_placeholder(t) for t in unknown[1].split()):
        return True
    return partial and bool(MISSING.search(message))


def module_file(module: str) -> str | None:
    """The file ``python -m module`` runs, or None where there is no such module."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations is not None:   # a package: its __main__
        return module_file(f"{module}.__main__")
    return spec.origin


# Throughput tools: run past the parse to their check of --variants (common.throughput's
# gpu_variants, minus its CUDA check), so that a variant name no tool has fails too.
THROUGHPUT_TOOL = re.compile(r"benchmarks\.\w+\.throughput")


def variants_only(where: str):
    def check(parser, text: str, known):
        unknown = sorted(v for v in set(text.split(",")) - set(known) if not is_placeholder(v))
        if unknown:
            pytest.fail(f"{where}: {parser.prog}: unknown variant(s) {unknown}; it has "
                        f"{', '.join(known)}", pytrace=False)
        raise Parsed(None)
    return check


def run_parse(module: str, args: list[str], partial: bool, where: str, monkeypatch,
              what: str = ""):
    """``python -m module args`` run up to its parse of ``args``: the namespace (None after
    ``--help`` and the like, or a tolerated error). A parse error fails the test with the
    parser's message; a module that cannot run here before it parses is skipped."""
    shown = f"python -m {module}" + (f" ({what})" if what else "")
    path = module_file(module)
    if path is None:
        pytest.fail(f"{where}: no module {module!r}", pytrace=False)
    monkeypatch.setattr(sys, "argv", [path, *args])
    out, err = io.StringIO(), io.StringIO()
    failure = skip = None
    variants = bool(THROUGHPUT_TOOL.fullmatch(module))
    if variants:
        import common.throughput
        monkeypatch.setattr(common.throughput, "gpu_variants", variants_only(where))
    with parse_only(None if variants else args) as state, warnings.catch_warnings():
        # runpy's note on a module already imported, torchrun's on faulthandler and stderr
        warnings.simplefilter("ignore")
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                runpy.run_module(module, run_name="__main__", alter_sys=False)
        except Parsed as done:
            return done.namespace
        except SystemExit as exc:
            message = (err.getvalue().strip() or out.getvalue().strip())[-2000:]
            if state.exit_in_parse and (exc.code in (0, None) or tolerated(message, partial)):
                return None   # --help, --list-optimisations; what a placeholder stood for
            if state.exit_in_parse:
                failure = f"{where}: {shown} refuses {shlex.join(args)!r}:\n{message}"
            elif NOT_HERE.search(message):
                skip = f"{shown}: exit {exc.code} before it parsed its arguments: {message}"
            else:
                failure = f"{where}: {shown}: exit {exc.code} before it parsed: {message}"
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if not NOT_HERE.search(text):
                raise
            skip = f"{shown} cannot run here before it parses: {text}"
        else:
            failure = (f"{where}: {shown} ended without parsing its command line "
                       f"({state.parses} parse(s) of other lists): no parser to check "
                       f"{shlex.join(args)!r} against")
    if skip:
        pytest.skip(skip)
    pytest.fail(failure, pytrace=False)


def parse_with(fn, where: str, what: str):
    """``fn()`` (a tool's own parse of flags it hands on), its parse errors failing the
    test with the parser's message."""
    err = io.StringIO()
    with parse_only(None) as state:
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                return fn()
        except SystemExit as exc:
            if not state.exit_in_parse:
                raise
            if exc.code in (0, None) or tolerated(err.getvalue(), False):
                return None
    pytest.fail(f"{where}: {what} refused:\n{err.getvalue().strip()[-2000:]}", pytrace=False)


# Modules of other projects that the docs name: not this suite's parsers.
EXTERNAL_MODULES = {
    "starter_code": "KiTS19's download script (github.com/neheller/kits19), not installed here",
    "pip": "pip's own command line",
    "venv": "the standard library's venv",
    "pytest": "pytest's own command line",
}


def check_python(cmd: Command, monkeypatch) -> None:
    module, *args = cmd.argv
    if module.startswith("<unreadable"):
        pytest.fail(f"{cmd.where}: cannot split {cmd.text!r}: {module}", pytrace=False)
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module):
        pytest.skip(f"the module name {module!r} is a placeholder")
    external = EXTERNAL_MODULES.get(module.split(".")[0])
    if external:
        pytest.skip(f"python -m {module}: {external}")
    for name, value in cmd.env:
        monkeypatch.setenv(name, value)
    ns = run_parse(module, args, cmd.partial, cmd.where, monkeypatch)
    handed_on = HANDED_ON.get(module)
    if ns is not None and handed_on:
        handed_on(ns, cmd, monkeypatch)


def bench_workload_args(ns, cmd: Command, monkeypatch) -> None:
    """``common.bench``'s ``--workload-args``, parsed as its worker parses them."""
    if not ns.workload_args or not ns.workload or is_placeholder(ns.workload):
        return
    if not (REPO / "benchmarks" / ns.workload / "workload.py").is_file():
        pytest.fail(f"{cmd.where}: python -m common.bench {ns.workload}: no such workload",
                    pytrace=False)
    from common.bench.worker import workload_class
    from common.training import build_parser
    cls = workload_class(ns.workload)
    flags = unbracket(shlex.split(ns.workload_args))
    parse_with(lambda: cls.parse_bench_args(build_parser(cls), flags, ns.data, 1),
               cmd.where, f"--workload-args {ns.workload_args!r} (benchmarks.{ns.workload})")


def seeds_extra_args(ns, cmd: Command, monkeypatch) -> None:
    """``compliance.seeds``' ``--extra-args``: its runs' ``EXTRA_ARGS``."""
    if is_placeholder(ns.workload):
        return
    check_script(ns.workload, {"CONFIG": ns.config, "EXTRA_ARGS": ns.extra_args,
                               **dict(cmd.env)}, cmd.partial, cmd.where, monkeypatch)


# Tools that hand flags on to a workload: how to check those.
HANDED_ON = {"common.bench": bench_workload_args, "compliance.seeds": seeds_extra_args}


def check_torchrun(cmd: Command, monkeypatch) -> None:
    for name, value in cmd.env:
        monkeypatch.setenv(name, value)
    ns = run_parse("torch.distributed.run", list(cmd.argv), cmd.partial, cmd.where,
                   monkeypatch, "torchrun")
    if ns is None:
        return
    if not ns.module:
        pytest.skip(f"torchrun runs a script ({ns.training_script}), not a module")
    check_python(Command(cmd.path, cmd.line, cmd.text, "python", cmd.env,
                         (ns.training_script, *ns.training_script_args), cmd.partial),
                 monkeypatch)


# -- run_and_time.sh and make -----------------------------------------------------------

# Variables that libraries under the training program read (torch, NCCL, Triton, OpenMP).
LIBRARY_VARIABLES = re.compile(r"^(CUDA_|NCCL_|TORCH|PYTORCH_|TRITON_|OMP_|MKL_)")
SHELL_READ = re.compile(r"\$\{?!?([A-Za-z_]\w*)|\[\[ -v \$?([A-Za-z_]\w*)")
SHELL_ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+)?([A-Za-z_]\w*)\+?=")
FOR_NAMES = re.compile(r"\bfor \w+ in ((?:[A-Z_][A-Z0-9_]* ?)+);")


def script_variables(texts: list[str]) -> set[str]:
    """The upper-case variables that bash code, read in this order, takes from the
    environment: those read before it assigns them (a line's right-hand side is read before
    its assignment; the words of ``for name in A B`` count as read, for the loop's
    ``${!name}``)."""
    read, assigned = set(), set()
    for text in texts:
        for _, code in logical_lines(list(enumerate(text.splitlines()))):
            names = [a or b for a, b in SHELL_READ.findall(code)]
            for m in FOR_NAMES.finditer(code):
                names.extend(m[1].split())
            read.update(n for n in names if n.isupper() and n not in assigned)
            m = SHELL_ASSIGN.match(code)
            if m:
                assigned.add(m[1])
    return read


def python_names(benchmark: str) -> set[str]:
    """Upper-case names quoted in the training program's Python (the benchmark's and
    ``common/``'s): the environment variables it may read (``"TURBOJPEG_LIB"``)."""
    names = set()
    for folder in (REPO / "benchmarks" / benchmark, REPO / "common"):
        for f in folder.rglob("*.py"):
            names.update(re.findall(r"[\"']([A-Z][A-Z0-9]*_[A-Z0-9_]+)[\"']", f.read_text()))
    return names


CONFIG_ARGS = r"""
NPROC=1; FIXTURE_ARGS=(); OPTIMISATIONS=(); TRAIN_ARGS=()
source "$1" || exit 3
printf '%s\0' "${#OPTIMISATIONS[@]}" "${OPTIMISATIONS[@]}" "${TRAIN_ARGS[@]}"
"""


def config_args(config_file: Path, env: dict[str, str], where: str) -> list[str]:
    """The training flags the script gives from this config: ``--optimisations`` and
    ``TRAIN_ARGS``, the config sourced by bash with the command's variables."""
    proc = subprocess.run(["bash", "-c", CONFIG_ARGS, "_", str(config_file)], cwd=REPO,
                          env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"),
                               **env},
                          capture_output=True, text=True, timeout=30)
    if proc.returncode:
        pytest.fail(f"{where}: {config_file.relative_to(REPO)} fails with these variables: "
                    f"{proc.stderr.strip()}", pytrace=False)
    n, *rest = proc.stdout.split("\0")[:-1]
    opts, train = rest[:int(n)], rest[int(n):]
    return (["--optimisations", ",".join(opts)] if opts else []) + train


def check_script(benchmark: str, env: dict[str, str], partial: bool, where: str,
                 monkeypatch) -> None:
    if not re.fullmatch(r"\w+", benchmark):
        pytest.skip(f"the benchmark name {benchmark!r} is a placeholder")
    folder = REPO / "benchmarks" / benchmark
    if not (folder / "run_and_time.sh").is_file():
        pytest.fail(f"{where}: no benchmarks/{benchmark}/run_and_time.sh", pytrace=False)
    config = env.get("CONFIG") or "cpu_tiny"
    config_file = folder / f"config_{config}.sh"
    if is_placeholder(config):
        pytest.skip(f"CONFIG={config} is a placeholder")
    if not config_file.is_file():
        configs = sorted(p.name[len("config_"):-len(".sh")] for p in folder.glob("config_*.sh"))
        pytest.fail(f"{where}: CONFIG={config}: no benchmarks/{benchmark}/config_{config}.sh "
                    f"(there are: {', '.join(configs)})", pytrace=False)
    head, _, tail = (REPO / "common" / "run_and_time.sh").read_text().partition(
        'source "$config_file"')
    shell = script_variables([(folder / "run_and_time.sh").read_text(), head,
                              config_file.read_text(), tail])
    unknown = [name for name in env if name not in shell | python_names(benchmark)
               and not LIBRARY_VARIABLES.match(name)]
    if unknown:
        pytest.fail(f"{where}: {', '.join(unknown)} set for benchmarks/{benchmark}/"
                    f"run_and_time.sh, which reads none of them (its scripts read: "
                    f"{', '.join(sorted(shell))})", pytrace=False)
    flags = config_args(config_file, env, where)
    extra = unbracket(env.get("EXTRA_ARGS", "").split())   # as the script's `read -a`
    argv = ["--data-dir", env.get("DATADIR") or f".fixtures/{benchmark}", "--seed", "1",
            "--log-file", "result_0.txt", *flags, *extra]
    run_parse(f"benchmarks.{benchmark}", argv, partial, where, monkeypatch,
              f"config_{config}.sh" + (" + EXTRA_ARGS" if extra else ""))


MAKE_RULE = re.compile(r"^([^\s:=#$%][^:=]*?):(?!=)")
MAKE_READ = re.compile(r"\$[({]([A-Za-z_]\w*)[)}]")
MAKE_SET = re.compile(r"^([A-Za-z_]\w*)\s*[?:+]?=", re.M)


def makefile_targets(makefile: Path = REPO / "Makefile") -> dict[str, str]:
    """The Makefile's explicit targets, each with its recipe."""
    recipes: dict[str, str] = {}
    current: list[str] = []
    for line in makefile.read_text().splitlines():
        m = MAKE_RULE.match(line)
        if line.startswith("\t"):
            for t in current:
                recipes[t] += line[1:] + "\n"
        elif m:
            current = [t for t in m[1].split() if not t.startswith(".")]
            for t in current:
                recipes.setdefault(t, "")
        elif line.strip() and not line.startswith("#"):
            current = []
    return recipes


def check_make(cmd: Command, monkeypatch) -> None:
    recipes = makefile_targets()
    unknown = [t for t in cmd.argv if t != "<default>" and t not in recipes]
    if unknown:
        pytest.fail(f"{cmd.where}: make {' '.join(unknown)}: no such target in the Makefile "
                    f"(there are: {', '.join(sorted(recipes))})", pytrace=False)
    env = dict(cmd.env)
    makefile = (REPO / "Makefile").read_text()
    make_vars = set(MAKE_READ.findall(makefile)) | set(MAKE_SET.findall(makefile))
    scripts = [m[1] for t in cmd.argv
               for m in re.finditer(r"benchmarks/(\w+)/run_and_time\.sh", recipes.get(t, ""))]
    if scripts:   # make run: command-line variables reach the recipe's environment
        defaults = dict(re.findall(r"^(\w+)\s*\?=\s*(\S+)", makefile, re.M))
        check_script(scripts[0], {"CONFIG": defaults.get("CONFIG", ""), **env}, cmd.partial,
                     cmd.where, monkeypatch)
        return
    unknown = [k for k in env if k not in make_vars]
    if unknown:
        pytest.fail(f"{cmd.where}: the Makefile reads no {', '.join(unknown)}", pytrace=False)


# -- the cases --------------------------------------------------------------------------

def check(cmd: Command, monkeypatch) -> None:
    if cmd.kind == "python":
        check_python(cmd, monkeypatch)
    elif cmd.kind == "torchrun":
        check_torchrun(cmd, monkeypatch)
    elif cmd.kind == "script":
        check_script(cmd.argv[0], dict(cmd.env), cmd.partial, cmd.where, monkeypatch)
    else:
        check_make(cmd, monkeypatch)


def case_ids(commands: list[Command]) -> list[str]:
    seen: dict[str, int] = {}
    ids = []
    for c in commands:
        n = seen[c.id] = seen.get(c.id, 0) + 1
        ids.append(c.id if n == 1 else f"{c.id} #{n}")
    return ids


COMMANDS = doc_commands()


@pytest.mark.parametrize("cmd", COMMANDS, ids=case_ids(COMMANDS))
def test_doc_command(cmd: Command, monkeypatch):
    check(cmd, monkeypatch)


# -- the checker itself -----------------------------------------------------------------

def planted(markdown: str) -> Command:
    [cmd] = markdown_commands(markdown, "planted.md")
    return cmd


@pytest.mark.parametrize("markdown, reason", [
    ("```\npython -m benchmarks.resnet --no-such-flag\n```\n", "--no-such-flag"),
    ("Run `python -m benchmarks.resnet.fixture DIR --classes ten`.\n", "invalid int value"),
    ("    CONFIG=9xB300 DATADIR=/data benchmarks/resnet/run_and_time.sh\n",
     "CONFIG=9xB300: no benchmarks/resnet/config_9xB300.sh"),
    ("```\nNGPUS=2 benchmarks/dlrm/run_and_time.sh\n```\n", "NGPUS set for"),
    ("```\nCONFIG=1xH100 DATADIR=/data/coco benchmarks/maskrcnn/run_and_time.sh\n```\n",
     "BACKBONE_CHECKPOINT"),
    ("```\nEXTRA_ARGS=\"--compile default\" benchmarks/maskrcnn/run_and_time.sh\n```\n",
     "unrecognized arguments: --compile default"),
    ("```\npython -m common.bench resnet -b 8 --workload-args \"--space-to-depth\"\n```\n",
     "--workload-args"),
    ("```\ntorchrun --nproc_per_node 2 -m benchmarks.dlrm.throughput --no-such-flag\n```\n",
     "--no-such-flag"),
    ("```\ntorchrun --no-such-torchrun-flag 2 -m benchmarks.dlrm.throughput\n```\n",
     "--no-such-torchrun-flag"),
    ("```\npython -m benchmarks.dlrm.throughput --max-ind 10\n```\n",
     "unrecognized arguments: --max-ind 10"),
    ("```\npython -m benchmarks.no_such_workload\n```\n", "no module"),
    ("```\npython -m compliance.check\n```\n", "the following arguments are required"),
    ("Then `make bench`.\n", "make bench: no such target"),
    ("```\nmake run CONFIG=9xB300\n```\n", "config_9xB300.sh"),
    ("```\npython -m benchmarks.resnet.throughput --variants config,ours-fused-max\n```\n",
     "unknown variant(s) ['ours-fused-max']"),
], ids=["flag", "value", "config", "variable", "config-needs", "extra-args", "workload-args",
        "torchrun-module", "torchrun-own", "abbreviation", "module", "missing-argument",
        "make-target", "make-run-config", "variant"])
def test_a_stale_command_fails(markdown, reason, monkeypatch):
    with pytest.raises(pytest.fail.Exception, match=re.escape(reason)):
        check(planted(markdown), monkeypatch)


@pytest.mark.parametrize("markdown", [
    "```\npython -m benchmarks.resnet.fixture DIR --classes N --seed $SEED  # a comment\n```\n",
    "The fixture: `python -m benchmarks.resnet.fixture DIR [--classes 10]\n[--seed 0]`.\n",
    "Mentioned: `python -m compliance.check` checks a log.\n",
    "```\nsrun --ntasks-per-node=8 python -m benchmarks.resnet --opt channels-last ...\n```\n",
    "```\nCUDA_VISIBLE_DEVICES=0 .venv/bin/python -m compliance.check \\\n"
    "    results/resnet/result_0.txt --ruleset 1.1.0 2>&1 | tee check.log\n```\n",
    "```\nexport CONFIG=8xH200 DATADIR=/data/imagenet\nbenchmarks/resnet/run_and_time.sh\n```\n",
    "```\nSEED=1 EXTRA_ARGS=\"--epochs 2 ARGS\" benchmarks/resnet/run_and_time.sh\n```\n",
    "```\npython -m common.bench bert -b 8 --workload-args \"--opt unpad\"\n```\n",
    "```\npython -m benchmarks.maskrcnn.throughput --variants config-minus-<name>,config\n```\n",
], ids=["placeholders", "inline-optional-parts", "mention", "ellipsis", "continued",
        "exported", "extra-args", "workload-args", "variants"])
def test_a_current_command_passes(markdown, monkeypatch):
    check(planted(markdown), monkeypatch)


def test_history_is_not_read(tmp_path):
    for name in ("README.md", "docs/data.md", "docs/history/sessions.md",
                 "benchmarks/resnet/README.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("`python -m benchmarks.resnet --gone`\n")
    assert [c.path for c in doc_commands(tmp_path)] == [
        "README.md", "benchmarks/resnet/README.md", "docs/data.md"]
