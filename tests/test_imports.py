"""The tree's layering, read from the sources' imports (those inside functions too): no
circle among the files, ``common/`` imports neither ``compliance/`` nor a benchmark, and no
benchmark imports another."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "compliance", "benchmarks")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from a import b`` is ``a.b`` where that
    is a module, else ``a``)."""
    files = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            else:
                continue
            for n in names:
                while n and n not in files:
                    n = n.rpartition(".")[0]
                if n and n != mod and not mod.startswith(n + "."):
                    deps.add(n)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert cycles(imports()) == []


def test_common_imports_neither_compliance_nor_a_benchmark():
    bad = {m: sorted(d for d in deps if d.startswith(("compliance", "benchmarks")))
           for m, deps in imports().items() if m.startswith("common")}
    assert {m: d for m, d in bad.items() if d} == {}


def test_no_benchmark_imports_another():
    def bench(m):
        parts = m.split(".")
        return parts[1] if parts[0] == "benchmarks" and len(parts) > 1 else None
    bad = {m: sorted(d for d in deps if bench(d) and bench(d) != bench(m))
           for m, deps in imports().items() if bench(m)}
    assert {m: d for m, d in bad.items() if d} == {}


def test_the_reader_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
