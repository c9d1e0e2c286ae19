"""The structure the layers promise (docs/architecture.md): no import cycle among the modules
of elsewhere (imports for type checking included), and no module over 500 lines.

The layer order itself is checked by ``lint-imports`` (scripts/test runs it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_LINES = 500

# Modules still over MAX_LINES, with the most lines each may have until it is split: the list
# only shrinks (a module on it that grows, or a new one over the limit, fails).
TOO_LONG: dict[str, int] = {}


# Cycles not yet broken (each is only imports for type checking): the list only shrinks.
KNOWN_CYCLES: list[set[str]] = [
]


def _lines(path: Path) -> int:
    with path.open() as f:
        return sum(1 for _ in f)


def test_no_module_is_over_500_lines() -> None:
    over = {}
    for path in sorted((SRC / "elsewhere").rglob("*.py")):
        rel = str(path.relative_to(SRC))
        n = _lines(path)
        if n > max(MAX_LINES, TOO_LONG.get(rel, 0)):
            over[rel] = n
    assert not over, f"modules over {MAX_LINES} lines (split them by concept): {over}"


def test_the_list_of_long_modules_holds_only_long_modules() -> None:
    stale = {rel: _lines(SRC / rel) for rel in TOO_LONG if not (SRC / rel).exists() or _lines(SRC / rel) <= MAX_LINES}
    assert not stale, f"split or gone: remove them from TOO_LONG: {stale}"


def test_no_import_cycles() -> None:
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the test extras)")
    sys.path.insert(0, str(SRC))
    try:
        graph = grimp.build_graph("elsewhere", cache_dir=None)
    finally:
        sys.path.remove(str(SRC))
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    cycles = _strongly_connected(modules, edges)
    # the package itself imports its public names lazily (for type checkers only): not a cycle
    cycles = [c for c in cycles if "elsewhere" not in c and not any(set(c) <= k for k in KNOWN_CYCLES)]
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def _strongly_connected(nodes: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            succ = edges.get(v, [])
            if i < len(succ):
                work.append((v, i + 1))
                w = succ[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
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
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out
