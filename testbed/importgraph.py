"""The package's import graph, read from its sources: what the layer tests judge.

Read with :mod:`ast`, so an import inside a function body or under ``if
TYPE_CHECKING:`` is an edge like a top-level one: a deferred import back up
the layers still makes a module depend on what sits above it.
"""

from __future__ import annotations

import ast
from pathlib import Path


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module under ``root`` (the directory of ``package``) by dotted name, the package itself included."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((package, *parts))] = path
    return found


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``known`` modules that module ``name`` (at ``path``) imports anywhere in its source."""
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


def graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports.  The package ``__init__`` is imported before any of its
    modules, so an edge to it is no layering decision and is left out."""
    mods = modules(root, package)
    known = set(mods)
    return {name: imported(name, path, known) - {package} for name, path in mods.items()}


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
