"""No import cycle inside :mod:`hvd_elastic.discovery`, lazy imports included.

Discovery's modules are layered (the warm path's few stdlib-only modules at the
bottom, the command line at the top); an import back up the layers, even one
deferred into a function body, makes a module's behaviour depend on what
imports it.  The graph is read from the source with :mod:`ast`, so imports in
function bodies and under ``if TYPE_CHECKING:`` count as much as top-level ones.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hvd_elastic.discovery

PACKAGE = "hvd_elastic.discovery"
ROOT = Path(hvd_elastic.discovery.__file__).parent


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (the package itself included)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((PACKAGE, *parts))] = path
    return found


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module ``name`` (at ``path``) imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # ``from pkg import mod`` imports the module ``pkg.mod``; ``from mod import name`` the module ``mod``.
            targets = [source] + [f"{source}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            # ``import a.b.c`` also imports ``a.b``: the deepest known module is the edge, the rest are parents.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    # The package __init__ is imported before any of its modules: an edge to it is no layering decision.
    return {name: imported(name, path, known) - {PACKAGE} for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def short(name: str) -> str:
    return name.removeprefix(PACKAGE + ".")


def test_the_walker_sees_lazy_relative_and_dotted_imports(tmp_path):
    """The walker itself: an import in a function body, a relative one and ``import a.b`` are edges."""
    src = tmp_path / "m.py"
    src.write_text("import hvd_elastic.discovery.cache\n"
                   "def f():\n    from . import jobdir\n    from .hosts import Options\n"
                   "    from hvd_elastic.discovery import watch as w\n")
    known = {PACKAGE, f"{PACKAGE}.cache", f"{PACKAGE}.jobdir", f"{PACKAGE}.hosts", f"{PACKAGE}.watch", f"{PACKAGE}.m"}
    wanted = {f"{PACKAGE}.{m}" for m in ("cache", "jobdir", "hosts", "watch")}
    assert imported(f"{PACKAGE}.m", src, known) - {PACKAGE} == wanted
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_discovery():
    edges = graph()
    cycle = find_cycle(edges)
    listing = "\n".join(f"  {short(a)} -> {', '.join(sorted(map(short, b))) or '-'}" for a, b in sorted(edges.items()))
    assert cycle is None, f"import cycle: {' -> '.join(map(short, cycle))}\nall imports:\n{listing}"
